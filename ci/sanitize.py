"""Drive every CUDA-backend kernel once on small irregular shapes (for compute-sanitizer, ci/L2.sh).

Each op's result is also checked against the reference backend on the CPU, so a run that the
sanitizer passes is also a correct one.
"""

import itertools
import sys

import torch

import engine
from engine import cuda_backend
from engine.fp8 import Float8CurrentScalingQuantizer, Float8Quantizer

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
# 8192 / 24584 / 32760 / 98312 / 131072 / 262144: rows CUDA splits over thread-block clusters of
# 2-16 CTAs (sm_90); past 32K the backward's wide-cluster kernels (partials in shared memory).
# The backward here runs over an fp32 residual stream; run() ends with 16-bit ones.
# 2048 / 4096 / 8192 with the transposed copy in-kernel: the band kernel (clusters of 4 / 8 / 16
# CTAs, one partial band at 3 and 37 rows, several bands per cluster at 1101 rows).
SHAPES = [(1, 1), (7, 17), (33, 760), (37, 2048), (1101, 4096), (5, 3571), (3, 8192), (3, 17389),
          (3, 24584), (2, 32760), (2, 70001), (2, 98312), (2, 131072), (2, 262144)]


# M odd or a multiple of 16 (an even M % 16 != 0 hands the copy to the tiled transpose, P137)
BAND_SHAPES = [(37, 2048), (301, 4096), (3, 8192), (201, 8192)]
# S = 1024 columns per CTA (knob 4; NOTES P117): a cluster of 2, of 12 with a short last slice and
# seven bands (each cluster of the cut grid walks them all), of 16 with one partial band.
BAND_WIDE_SHAPES = [(37, 2048), (201, 12000), (3, 16384)]


def _band_case(m: int, n: int, is_rms: bool, fmt) -> int:
    """One band-kernel call and its cut-grid twin; the number of mismatches (0-2)."""
    bad = 0
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda")
    b = None if is_rms else torch.randn(n, device="cuda")
    q = Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), fmt,
                        columnwise=True)
    t = engine.rmsnorm(x, w, 1e-5, quantizer=q) if is_rms else engine.layernorm(x, w, b, 1e-5, quantizer=q)
    if not torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t()):
        print(f"band: transpose mismatch {m}x{n} rms={is_rms}")
        bad += 1
    data, data_t = torch.empty_like(t.data), torch.empty_like(t.transpose_data)
    cuda_backend.norm_fwd(x, w, b, None, 1e-5, data, None,
                          None if is_rms else torch.empty(m, device="cuda"),
                          torch.empty(m, device="cuda"), torch.ones(1, device="cuda"),
                          torch.zeros(1, device="cuda"), torch.empty(1, device="cuda"), data_t,
                          is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=False,
                          amax_epsilon=0.0, sm_margin=torch.cuda.get_device_properties(0).multi_processor_count - 4)
    if not (torch.equal(data.view(torch.uint8), t.data.view(torch.uint8))
            and torch.equal(data_t.view(torch.uint8), t.transpose_data.view(torch.uint8))):
        print(f"band: a cut grid changed the bytes {m}x{n} rms={is_rms}")
        bad += 1
    return bad


def run_band(knob: int, shapes) -> int:
    """Only the band kernel (FP8 + transposed in one kernel, clusters of 2-16 CTAs; both norms,
    e4m3 and e5m2) under band knob ``knob`` (0: the card's default configuration; 4: S = 1024):
    a short run for racecheck, whose full run() exceeds its time limit. Each shape runs twice: at
    the default grid, and on one or two clusters (sm_margin), where each cluster walks every band:
    the stage ring refilled, the tiles and exchange slots reused."""
    engine.backend.reset_for_tests({"ENGINE_NORM_EXTERNAL_TRANSPOSE": "0"})
    bad = 0
    with torch.no_grad(), cuda_backend.norm_fwd_band(knob):
        for (m, n), is_rms, fmt in itertools.product(shapes, (True, False), (E4M3, E5M2)):
            bad += _band_case(m, n, is_rms, fmt)
    return bad


def _residual_case(m: int, n: int, is_rms: bool):
    """m random bf16 rows of n with a bf16 residual through the norm on the GPU (LayerNorm with a
    bias): (x, r, w, b, z, ok), z = round(x + r) and ok whether residual_out equals z bit for bit
    and the output matches the CPU reference of the norm of z."""
    x, r = (torch.randn(m, n, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    b = None if is_rms else torch.randn(n, device="cuda", dtype=torch.bfloat16)
    with torch.no_grad():
        y, res_out = (engine.rmsnorm(x, w, 1e-5, residual=r) if is_rms
                      else engine.layernorm(x, w, b, 1e-5, residual=r))
    z = (x.float() + r.float()).to(torch.bfloat16)
    ref = (engine.rmsnorm(z.cpu(), w.cpu(), 1e-5) if is_rms
           else engine.layernorm(z.cpu(), w.cpu(), b.cpu(), 1e-5))
    ok = torch.equal(res_out, z) and torch.allclose(y.float().cpu(), ref.float(), rtol=2e-2, atol=2e-2)
    return x, r, w, b, z, ok


def run(external: str) -> int:
    engine.backend.reset_for_tests({"ENGINE_NORM_EXTERNAL_TRANSPOSE": external})
    bad = 0
    for m, n in SHAPES:
        for is_rms in (True, False):
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            r = torch.randn(m, n, device="cuda", dtype=torch.float32, requires_grad=True)
            w = torch.randn(n, device="cuda", requires_grad=True)
            b = None if is_rms else torch.randn(n, device="cuda", requires_grad=True)
            f = engine.rmsnorm if is_rms else (lambda *a, **k: engine.layernorm(a[0], a[1], b, *a[2:], **k))
            y, res_out = f(x, w, 1e-5, residual=r, zero_centered_gamma=True)
            (y.float().sum() + res_out.sum()).backward()
            with torch.no_grad():
                for q in (Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), E4M3,
                                          columnwise=True),
                          Float8CurrentScalingQuantizer(E4M3, columnwise=True)):
                    t = f(x, w, 1e-5, quantizer=q)
                    if not torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t()):
                        print(f"transpose mismatch {m}x{n} rms={is_rms}")
                        bad += 1
                # bf16 weights, e5m2: the fast FP8 row loop's builds that read gamma / beta from
                # global memory (fp32 ones with a bias keep the general loop)
                wb = w.detach().to(torch.bfloat16)
                q5 = Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), E5M2,
                                     columnwise=True)
                t = (engine.rmsnorm(x, wb, 1e-5, quantizer=q5) if is_rms else
                     engine.layernorm(x, wb, b.detach().to(torch.bfloat16), 1e-5, quantizer=q5))
                if not torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t()):
                    print(f"transpose mismatch (bf16 weights, e5m2) {m}x{n} rms={is_rms}")
                    bad += 1
            ref = (engine.rmsnorm(x.detach().cpu(), w.detach().cpu(), 1e-5) if is_rms else
                   engine.layernorm(x.detach().cpu(), w.detach().cpu(), b.detach().cpu(), 1e-5))
            y_plain = f(x.detach(), w.detach(), 1e-5) if is_rms else engine.layernorm(
                x.detach(), w.detach(), b.detach(), 1e-5)
            if not torch.allclose(y_plain.float().cpu(), ref.float(), rtol=1e-2, atol=1e-2):
                print(f"value mismatch {m}x{n} rms={is_rms}")
                bad += 1
        with torch.no_grad():
            xc = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            t = engine.cast_transpose(xc, Float8CurrentScalingQuantizer(E4M3, columnwise=True))
            engine.fp8_transpose(t)
    # 16-bit z and dy (the loop above runs the backward over an fp32 residual stream): the
    # backward's one-CTA layouts, rows of 12296 / 16384 in one CTA of 800 / 1024 threads (the
    # LayerNorm builds with their dweight, or dweight and dbias, partials in shared memory) and
    # 4104 / 8192 in one CTA of 32 values per thread
    for m, n in ((3, 4104), (3, 8192), (3, 12296), (2, 16384)):
        for is_rms, with_bias in ((True, False), (False, False), (False, True)):
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(n, device="cuda", requires_grad=True)
            b = torch.randn(n, device="cuda", requires_grad=True) if with_bias else None
            y = engine.rmsnorm(x, w, 1e-5) if is_rms else engine.layernorm(x, w, b, 1e-5)
            dy = torch.randn_like(y)
            params = (x, w) + ((b,) if with_bias else ())
            grads = torch.autograd.grad(y, params, dy)
            # the reference backend on fp32 copies of the same bf16 inputs
            cpu = [p.detach().cpu().float().requires_grad_() for p in params]
            bc = cpu[2] if with_bias else None
            yc = (engine.rmsnorm(cpu[0], cpu[1], 1e-5) if is_rms
                  else engine.layernorm(cpu[0], cpu[1], bc, 1e-5))
            grads_c = torch.autograd.grad(yc, cpu, dy.cpu().float())
            tols = [(2e-2, 2e-2)] + [(1e-2, 1e-2)] * (len(params) - 1)
            if not all(torch.allclose(g.float().cpu(), gc, rtol=r, atol=a)
                       for g, gc, (r, a) in zip(grads, grads_c, tols)):
                print(f"backward mismatch {m}x{n} rms={is_rms} bias={with_bias}")
                bad += 1
    # a bf16 residual stream: under the stream's knob at 16384 the streamed kernel's kRes build
    # takes the rows from 32K (x and the residual copied into its stages, z written back over x's
    # vectors; fwd_take_stream, NOTES P89); by default (32K-64K, fwd_take_stream, NOTES P96)
    # and with the stream off the blocked kernel (two 512-thread CTAs per SM, z packed, the chunk's
    # residual loaded before its stores; fwd_take_blocked), its chunk of 16K partly past the row at
    # 40008; at 2K-16K the blocked kernel by default, in CTAs sized to the row, one chunk held in
    # registers (NOTES P91, P95: 288 threads at 8200, the last warp partly past the row), in the
    # shape fwd_blocked_res_shape picks (NOTES P162; more of its shapes: run_blocked_shape)
    for (m, n), knob in itertools.product(((3, 32768), (3, 40008), (300, 32776), (300, 8200), (5, 2048)),
                                          (0, 16384, 1 << 30)):
        with cuda_backend.norm_fwd_stream_from(knob):
            for is_rms in (True, False):
                x, r, w, b, z, ok = _residual_case(m, n, is_rms)
                if not ok:
                    print(f"residual mismatch {m}x{n} rms={is_rms} stream knob={knob}")
                    bad += 1
                # the same rows to e4m3 with the transposed copy: by default the register kernel
                # at 2K-8K, the blocked kernel at 32K-64K (NOTES P103), the stream under its knob
                q = Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), E4M3,
                                    columnwise=True)
                with torch.no_grad():
                    t, res_out8 = (engine.rmsnorm(x, w, 1e-5, residual=r, quantizer=q) if is_rms
                                   else engine.layernorm(x, w, b, 1e-5, residual=r, quantizer=q))
                if not (torch.equal(res_out8, z) and
                        torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())):
                    print(f"residual e4m3 mismatch {m}x{n} rms={is_rms} stream knob={knob}")
                    bad += 1
    # the streamed forward over many rows per cluster, so that its ring of shared-memory stages
    # and its exchange slots wrap many times (a row's sums are awaited one iteration after they
    # are sent: four slots), bf16 and e4m3 outputs
    with cuda_backend.norm_fwd_stream_from(1):
        for is_rms in (True, False):
            x = torch.randn(1200, 8192, device="cuda", dtype=torch.bfloat16)
            w = torch.randn(8192, device="cuda", dtype=torch.bfloat16)
            b = None if is_rms else torch.randn(8192, device="cuda", dtype=torch.bfloat16)
            with torch.no_grad():
                y = engine.rmsnorm(x, w, 1e-5) if is_rms else engine.layernorm(x, w, b, 1e-5)
                q = Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"), E4M3)
                t = engine.rmsnorm(x, w, 1e-5, quantizer=q) if is_rms else engine.layernorm(
                    x, w, b, 1e-5, quantizer=q)
            ref = (engine.rmsnorm(x.cpu(), w.cpu(), 1e-5) if is_rms
                   else engine.layernorm(x.cpu(), w.cpu(), b.cpu(), 1e-5))
            if not (torch.allclose(y.float().cpu(), ref.float(), rtol=2e-2, atol=2e-2) and
                    torch.allclose(t.dequantize(dtype=torch.float32).cpu(), y.float().cpu(),
                                   rtol=0.07, atol=0.02)):
                print(f"streamed forward mismatch 1200x8192 rms={is_rms}")
                bad += 1
    # LayerNorm rows with a large mean (1e4 + N(0, 1)) and rows of N(0, 1) in one call: the
    # one-pass statistics' fallback (a second, centred pass and its reduction: the row group's
    # named barrier, the cluster exchange, the streamed kernel's per-warp pass, the blocked
    # kernel's walk over the row) taken by some rows of a CTA and not by others
    cases = ((torch.float32, 1028, None), (torch.float32, 8200, None), (torch.bfloat16, 17000, None),
             (torch.float32, 17389, None), (torch.bfloat16, 32776, torch.bfloat16))
    with cuda_backend.norm_fwd_stream_from(16384):
        for dtype, n, res_dtype in cases:
            base = torch.randn(37, n, device="cuda")
            base[::2] += 1e4 if dtype == torch.float32 else 256.0
            x = base.to(dtype)
            r = torch.randn(37, n, device="cuda").to(res_dtype) if res_dtype is not None else None
            w = torch.randn(n, device="cuda", dtype=dtype)
            b = torch.randn(n, device="cuda", dtype=dtype)
            with torch.no_grad():
                y = engine.layernorm(x, w, b, 1e-5, residual=r)
                y = y[0] if r is not None else y
            z = x if r is None else (x.float() + r.float()).to(dtype)
            ref = engine.layernorm(z.cpu(), w.cpu(), b.cpu(), 1e-5)
            if not torch.allclose(y.float().cpu(), ref.float(), rtol=2e-2, atol=3e-2):
                print(f"large-mean LayerNorm mismatch 37x{n} {dtype} residual={res_dtype}")
                bad += 1
    torch.cuda.synchronize()
    return bad


# The lean forward's rows (norm_fwd_lean.cuh): 4K-16K by default (row groups of 64-256 threads,
# several rows per CTA, the last row block partly past the end; 4K-8K past the few-rows layout's
# 8 rows per SM, engine.cuda_backend.FEW_ROWS_PER_SM, on either grid), 32K under knob 2 (one
# 512-thread CTA per row) and knob 3 (a 2-CTA cluster, the default's form for RMSNorm on the
# H200, NOTES P155: its exchange slots and mbarrier phases reused row after row)
LEAN_CASES = [(1101, 4096, 0), (1101, 8192, 0), (301, 16384, 0), (37, 32768, 2), (37, 32768, 3)]


def run_lean() -> int:
    """The lean forward alone (a short run for racecheck): each case at the default grid and on a
    grid cut to 4 SMs (sm_margin), where each CTA or cluster walks many rows; bf16 with a bias for
    LayerNorm; y checked against the reference on the CPU, and y, mu and rsigma equal on both
    grids."""
    bad = 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    engine.backend.reset_for_tests()
    for (m, n, knob), is_rms in itertools.product(LEAN_CASES, (True, False)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = None if is_rms else torch.randn(n, device="cuda", dtype=torch.bfloat16)
        outs = []
        with torch.no_grad(), cuda_backend.norm_fwd_lean(knob):
            for margin in (0, sms - 4):
                outs.append(cuda_backend.norm_fwd_alloc(x, w, b, None, 1e-5, None, is_rms, False, margin))
        ref = (engine.rmsnorm(x.cpu(), w.cpu(), 1e-5) if is_rms
               else engine.layernorm(x.cpu(), w.cpu(), b.cpu(), 1e-5))
        same = all(torch.equal(a, c) for a, c in zip(outs[0], outs[1]) if a is not None)
        if not (same and torch.allclose(outs[0][0].float().cpu(), ref.float(), rtol=2e-2, atol=2e-2)):
            print(f"lean forward mismatch {m}x{n} rms={is_rms} knob={knob} same grids={same}")
            bad += 1
    torch.cuda.synchronize()
    return bad


def run_blocked_shape() -> int:
    """The blocked forward's residual rows in P162's shapes (norm_fwd_blocked_shape, NOTES P162),
    bf16, both norms, 1200 rows of 3000 columns (192 threads at two vectors per thread, the last
    warp partly past the row) and of 4104 (288 threads): the default (two vectors per thread on 32
    CTAs per SM at 3000 and at RMSNorm 4104, four at LayerNorm 4104) and shape 2 (two vectors on
    the resident grid: 1200 rows are more than the CTAs that fit, 4-6 per SM, so a CTA's row loop
    reuses its shared memory across rows). residual_out bit for bit, the output against the CPU
    reference."""
    bad = 0
    for shape, n, is_rms in itertools.product((0, 2), (3000, 4104), (True, False)):
        with cuda_backend.norm_fwd_blocked_shape(shape):
            ok = _residual_case(1200, n, is_rms)[-1]
        if not ok:
            print(f"residual mismatch 1200x{n} rms={is_rms} blocked shape {shape}")
            bad += 1
    torch.cuda.synchronize()
    return bad


def run_narrow() -> int:
    """The tiled transposes' narrow form (store_tile_pieces, NOTES P134-P136): copies whose rows of
    M bytes are 2-, 4- or 8-byte aligned runs, over one, two and several row tiles (M = 18, 20,
    24, 130, 200) and a partial column tile (N = 260), from cast_transpose, and from
    fp8_transpose into copies at addresses 0, 1, 2 and 4 bytes past an aligned one; each copy
    checked against data.T and the bytes around it against their poison."""
    bad = 0
    for m in (18, 20, 24, 130, 200):
        x = torch.randn(m, 260, device="cuda", dtype=torch.bfloat16)
        t = engine.cast_transpose(x, Float8CurrentScalingQuantizer(E4M3, columnwise=True))
        data = t.data.view(torch.uint8)
        if not torch.equal(t.transpose_data.view(torch.uint8), data.t()):
            print(f"narrow cast_transpose mismatch m={m}")
            bad += 1
        for off in (0, 1, 2, 4):
            buf = torch.full((m * 260 + 16,), 0x7F, device="cuda", dtype=torch.uint8)
            out_t = buf[off:off + m * 260].view(260, m)
            cuda_backend.fp8_transpose(t.data, out_t.view(E4M3))
            if not torch.equal(out_t, data.t()) or not (buf[:off] == 0x7F).all() or not (
                    buf[off + m * 260:] == 0x7F).all():
                print(f"narrow fp8_transpose mismatch m={m} off={off}")
                bad += 1
    return bad


# The lean FP8 forward (norm_fwd_fp8_lean.cuh, NOTES P179, P181) under its knob: (rows, cols): more
# row blocks than CTAs (the prefetch's last loads at the grid's last blocks), a partial last block,
# one row, three row groups of 160 threads (480 a CTA), two of 192, one group of 512 threads.
FP8_LEAN_SHAPES = [(1101, 4096), (67, 5120), (1, 16384), (301, 16384), (67, 6144)]


def run_fp8_lean() -> int:
    """The lean FP8 forward on FP8_LEAN_SHAPES, both norms, e4m3, at sm_margin 0 and at all but 4
    SMs; the bytes against the other kernels' (knob 1) at sm_margin 0 (within one FP8 step: the
    register path's order at 4 vectors up to 8192, else its own)."""
    bad = 0
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for (m, n), is_rms in itertools.product(FP8_LEAN_SHAPES, (True, False)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
        b = None if is_rms else torch.randn(n, device="cuda", dtype=torch.bfloat16)
        outs = []
        for knob, margin in ((1, 0), (2, 0), (2, sms - 4)):
            data = torch.full((m, n), 0x7F, device="cuda", dtype=torch.uint8).view(E4M3)
            with cuda_backend.norm_fwd_fp8_lean(knob):
                cuda_backend.norm_fwd(x, w, b, None, 1e-5, data, None,
                                      None if is_rms else torch.empty(m, device="cuda"),
                                      torch.empty(m, device="cuda"), torch.full((1,), 3.0, device="cuda"),
                                      torch.zeros(1, device="cuda"), torch.empty(1, device="cuda"), None,
                                      is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=False,
                                      amax_epsilon=0.0, sm_margin=margin)
            u = data.view(torch.uint8).to(torch.int16)  # ordinal: -0 and +0 alike, steps apart
            outs.append(torch.where(u >= 128, 128 - u, u))
        if (outs[1] - outs[0]).abs().max().item() > 1 or not torch.equal(outs[1], outs[2]):
            print(f"fp8 lean forward mismatch {m}x{n} rms={is_rms}")
            bad += 1
    torch.cuda.synchronize()
    return bad


# The backward's dweight / dbias reduction (norm_api.cu launch_bwd_reduce, NOTES P171-P172c): the
# flat kernel (few partial rows, more 128-column blocks than the sliced grid: LayerNorm from ~34K
# columns, RMSNorm from ~68K, ragged at 40001 / 70001) and the sliced one (many rows; few rows
# with one round of blocks: RMSNorm 40001), at sm_margin 0 and 4.
REDUCE_SHAPES = [(3, 40001), (2, 70001), (5, 65536), (17, 131072), (301, 4099)]


def run_reduce() -> int:
    """The backward on REDUCE_SHAPES; dweight (and dbias) against the float64 sums."""
    bad = 0
    for (m, n), is_rms, margin in itertools.product(REDUCE_SHAPES, (True, False), (0, 4)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(n, device="cuda")
        b = None if is_rms else torch.randn(n, device="cuda")
        mu = None if is_rms else torch.empty(m, device="cuda")
        rs = torch.empty(m, device="cuda")
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        cuda_backend.norm_fwd(x, w, b, None, 1e-5, y, None, mu, rs, None, None, None, None,
                              is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=False,
                              amax_epsilon=0.0, sm_margin=margin)
        dx = torch.full_like(x, float("nan"))
        dw = torch.full_like(w, float("nan"))
        db = None if is_rms else torch.full_like(w, float("nan"))
        cuda_backend.norm_bwd(dy, x, mu, rs, w, None, dx, None, dw, db, is_rms_norm=is_rms,
                              zero_centered_gamma=False, sm_margin=margin)
        xhat = (x.double() - (0.0 if is_rms else mu.double()[:, None])) * rs.double()[:, None]
        want = [(dy.double() * xhat).sum(0)] + ([] if is_rms else [dy.double().sum(0)])
        for got, ref in zip([dw] + ([] if is_rms else [db]), want):
            if not torch.allclose(got.double(), ref, rtol=1e-4, atol=1e-3 * m ** 0.5):
                print(f"reduce mismatch {m}x{n} rms={is_rms} sm_margin={margin}")
                bad += 1
    return bad


if __name__ == "__main__":
    # --band: the card's default band configuration; --band-wide: S = 1024 (knob 4); --narrow:
    # run_narrow alone; --lean: run_lean alone; --blocked-shape: run_blocked_shape alone;
    # --reduce: run_reduce alone; --fp8-lean: run_fp8_lean alone
    args = sys.argv[1:]
    if args == ["--narrow"]:
        failures = run_narrow()
    elif args == ["--lean"]:
        failures = run_lean()
    elif args == ["--blocked-shape"]:
        failures = run_blocked_shape()
    elif args == ["--reduce"]:
        failures = run_reduce()
    elif args == ["--fp8-lean"]:
        failures = run_fp8_lean()
    elif args == ["--band"]:
        failures = run_band(0, BAND_SHAPES)
    elif args == ["--band-wide"]:
        failures = run_band(4, BAND_WIDE_SHAPES)
    else:
        failures = (run("1") + run("0") + run_narrow() + run_lean() + run_blocked_shape() + run_reduce()
                    + run_fp8_lean())
    print("sanitize driver:", "OK" if failures == 0 else f"{failures} mismatches")
    sys.exit(1 if failures else 0)
