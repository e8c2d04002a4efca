"""GPU smoke test of the CUDA backend (engine/csrc via engine.cuda_backend) against engine.reference.

Run on a GPU machine from the repository root:  python ci/cuda_smoke.py [--quick] [--big]
It JIT-builds the extension if needed (a few minutes the first time), then checks forward,
backward, FP8 (delayed and current scaling, in-kernel and fallback transposes), cast_transpose,
fp8_transpose, determinism, strided / misaligned operands (the scalar paths), CUDA-graph capture,
error reporting and host overhead. Prints one line per failure and a final "N passed, M failed".
``--big`` adds a > 2^31-element case (int64 offsets; needs ~20 GB of GPU memory).
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import sys
import time
import traceback

import torch

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from engine import cuda_backend as cb  # noqa: E402
from engine import reference as ref  # noqa: E402
from engine.fp8 import fp8_format  # noqa: E402

DEV = "cuda"
F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
RESULTS = {"passed": 0, "failed": 0}


def check(name, fn):
    try:
        fn()
        RESULTS["passed"] += 1
    except Exception as e:  # report and go on
        RESULTS["failed"] += 1
        print(f"FAIL {name}: {type(e).__name__}: {e}")
        if os.environ.get("SMOKE_TRACE"):
            traceback.print_exc()


def tol(dtype):
    return {F32: (2e-5, 2e-5), F16: (2e-3, 2e-3), BF16: (1.6e-2, 1.6e-2)}[dtype]


def close(name, got, want, dtype):
    rtol, atol = tol(dtype)
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=atol, msg=lambda m: f"{name}: {m}")


def fp8_close(name, got, want_fp32, scale, dtype):
    """FP8 codes within one FP8 ulp of quantize(want_fp32 * scale) (y differs by float rounding)."""
    fmt = fp8_format(dtype)
    q_ref = ref.quantize(want_fp32, scale, dtype).float()
    q = got.float()
    mag = torch.maximum(q.abs(), q_ref.abs())
    e = torch.floor(torch.log2(mag.clamp(min=2.0 ** fmt.min_normal_exp)))
    ulp = torch.exp2(e - fmt.mantissa_bits)
    bad = ((q - q_ref).abs() > ulp * 1.0001) & ~(torch.isnan(q) & torch.isnan(q_ref))
    if bad.any():
        i = bad.nonzero()[0].tolist()
        raise AssertionError(f"{name}: {int(bad.sum())} FP8 values off by more than 1 ulp, first at {i}: "
                             f"got {q[tuple(i)].item()} want {q_ref[tuple(i)].item()}")


def rows_view(rows, cols, dtype, kind, scale=1.0, offset=0.0):
    """[rows, cols] tensor: 'contig', 'strided' (row stride cols + 8) or 'misaligned' (2-byte shift)."""
    if kind == "contig":
        t = torch.randn(rows, cols, device=DEV, dtype=F32).mul_(scale).add_(offset).to(dtype)
        return t
    if kind == "strided":
        big = torch.randn(rows, cols + 8, device=DEV, dtype=F32).mul_(scale).add_(offset).to(dtype)
        return big[:, :cols]
    flat = torch.randn(rows * cols + 1, device=DEV, dtype=F32).mul_(scale).add_(offset).to(dtype)
    return flat[1:].view(rows, cols)


def empty_like_rows(rows, cols, dtype, kind):
    if kind == "strided":
        return torch.full((rows, cols + 8), float("nan"), device=DEV, dtype=F32).to(dtype)[:, :cols]
    if kind == "misaligned" and dtype.itemsize > 1:
        return torch.empty(rows * cols + 1, device=DEV, dtype=dtype)[1:].view(rows, cols)
    t = torch.empty(rows, cols, device=DEV, dtype=dtype)
    if dtype.is_floating_point and dtype.itemsize > 1:
        t.fill_(float("nan"))
    return t


def run_fwd(impl, x, w, b, res, eps, out_dtype, is_rms, zc, fp8=None, out_t=False, kind="contig"):
    rows, cols = x.shape
    out = empty_like_rows(rows, cols, out_dtype, kind)
    res_out = None if res is None else empty_like_rows(rows, cols, res.dtype, kind)
    mu = None if is_rms else torch.full((rows,), float("nan"), device=DEV)
    rs = torch.full((rows,), float("nan"), device=DEV)
    scale = amax = sinv = ot = None
    cur = False
    if fp8 is not None:
        cur = fp8 == "current"
        scale = torch.tensor([0.5 if not cur else float("nan")], device=DEV)
        amax = torch.tensor([0.25], device=DEV)
        sinv = torch.full((1,), float("nan"), device=DEV)
        if out_t:
            ot = torch.empty(cols, rows, device=DEV, dtype=out_dtype)
    impl.norm_fwd(x, w, b, res, eps, out, res_out, mu, rs, scale, amax, sinv, ot, is_rms_norm=is_rms,
                  zero_centered_gamma=zc, current_scaling=cur, amax_epsilon=1e-6 if cur else 0.0,
                  sm_margin=0)
    return dict(out=out, res_out=res_out, mu=mu, rs=rs, scale=scale, amax=amax, sinv=sinv, out_t=ot)


def fwd_case(rows, cols, xd, wd, rd, od, is_rms, zc, bias, fp8=None, out_t=False, kind="contig"):
    name = (f"fwd rows={rows} cols={cols} x={xd} w={wd} res={rd} out={od} rms={is_rms} zc={zc} "
            f"bias={bias} fp8={fp8} out_t={out_t} {kind}")

    def body():
        torch.manual_seed(rows * 7919 + cols)
        x = rows_view(rows, cols, xd, kind)
        w = (torch.rand(cols, device=DEV) + 0.5).to(wd)
        b = (torch.randn(cols, device=DEV) * 0.1).to(wd) if bias else None
        res = rows_view(rows, cols, rd, kind) if rd is not None else None
        got = run_fwd(cb, x, w, b, res, 1e-5, od, is_rms, zc, fp8, out_t, kind)
        # reference with a float32 output (y before any cast), then compare per dtype
        want = run_fwd(ref, x, w, b, res, 1e-5, F32, is_rms, zc, None, False, "contig")
        if res is not None:
            assert torch.equal(got["res_out"], want["res_out"].to(rd)), "residual_out differs"
        torch.testing.assert_close(got["rs"], want["rs"], rtol=1e-5, atol=0)
        if not is_rms:
            torch.testing.assert_close(got["mu"], want["mu"], rtol=1e-5, atol=1e-6)
        if fp8 is None:
            close("out", got["out"], want["out"], od)
            return
        y = want["out"]
        fmt = fp8_format(od)
        tile_amax = y.abs().amax() if y.numel() else y.new_zeros(())
        if fp8 == "current":
            torch.testing.assert_close(got["amax"][0], tile_amax, rtol=1e-5, atol=0)
            exp_scale = ref.compute_scale(got["amax"], fmt.max, 1e-6)
            assert torch.equal(got["scale"], exp_scale), f"scale {got['scale']} != {exp_scale}"
        else:
            torch.testing.assert_close(got["amax"][0], torch.maximum(tile_amax, torch.tensor(0.25, device=DEV)),
                                       rtol=1e-5, atol=0)
        assert torch.equal(got["sinv"], 1.0 / got["scale"]), "scale_inv != 1 / scale"
        fp8_close("out", got["out"], y, got["scale"], od)
        if out_t:
            assert torch.equal(got["out_t"].view(torch.uint8), got["out"].view(torch.uint8).t()), \
                "out_t != out.T bitwise"

    check(name, body)


def bwd_case(rows, cols, zd, dyd, dxd, wd, is_rms, zc, bias, dres=None, kind="contig"):
    name = f"bwd rows={rows} cols={cols} z={zd} dy={dyd} dx={dxd} w={wd} rms={is_rms} zc={zc} bias={bias} dres={dres} {kind}"

    def body():
        torch.manual_seed(rows * 31 + cols)
        z = rows_view(rows, cols, zd, kind)
        dy = rows_view(rows, cols, dyd, kind)
        w = (torch.rand(cols, device=DEV) + 0.5).to(wd)
        zf = z.float()
        mu = None if is_rms else zf.mean(1)
        var = (zf * zf).mean(1) if is_rms else ((zf - mu[:, None]) ** 2).mean(1)
        rs = torch.rsqrt(var + 1e-5)
        dresid = rows_view(rows, cols, dres, kind) if dres is not None else None

        def run(impl, k):
            dx = empty_like_rows(rows, cols, dxd, k)
            dr = empty_like_rows(rows, cols, dres, k) if dres is not None else None
            dw = torch.full((cols,), float("nan"), device=DEV, dtype=wd)
            db = torch.full((cols,), float("nan"), device=DEV, dtype=wd) if bias else None
            impl.norm_bwd(dy, z, mu, rs, w, dresid, dx, dr, dw, db, is_rms_norm=is_rms,
                          zero_centered_gamma=zc, sm_margin=0)
            return dx, dr, dw, db

        g1 = run(cb, kind)
        g2 = run(cb, kind)
        r = run(ref, "contig")
        close("dx", g1[0], r[0], dxd if dxd != F32 else F32)
        if dres is not None:
            close("dres", g1[1], r[1], dres)
        # dweight / dbias sum over rows: scale the tolerance with sqrt(rows)
        rt = 1e-4 * max(1.0, math.sqrt(rows)) if wd == F32 else tol(wd)[0]
        torch.testing.assert_close(g1[2].float(), r[2].float(), rtol=rt, atol=rt * 10, msg=lambda m: f"dweight: {m}")
        if bias:
            torch.testing.assert_close(g1[3].float(), r[3].float(), rtol=rt, atol=rt * 10, msg=lambda m: f"dbias: {m}")
        for a, b_, what in ((g1[0], g2[0], "dx"), (g1[2], g2[2], "dweight")):
            assert torch.equal(a, b_), f"{what} not bitwise reproducible"
        if bias:
            assert torch.equal(g1[3], g2[3]), "dbias not bitwise reproducible"

    check(name, body)


def cast_case(rows, cols, xd, od, cur, with_out, with_t, kind="contig"):
    name = f"cast_transpose rows={rows} cols={cols} x={xd} out={od} current={cur} out={with_out} out_t={with_t} {kind}"

    def body():
        x = rows_view(rows, cols, xd, kind, scale=3.0)
        scale = torch.tensor([float("nan") if cur else 2.0], device=DEV)
        amax = torch.tensor([0.5], device=DEV)
        sinv = torch.full((1,), float("nan"), device=DEV)
        out = torch.empty(rows, cols, device=DEV, dtype=od) if with_out else None
        ot = torch.empty(cols, rows, device=DEV, dtype=od) if with_t else None
        cb.cast_transpose(x, scale, amax, sinv, out, ot, current_scaling=cur, amax_epsilon=0.0)
        xf = x.float()
        ta = xf.abs().amax() if xf.numel() else xf.new_zeros(())
        want_amax = ta if cur else torch.maximum(ta, torch.tensor(0.5, device=DEV))
        assert torch.equal(amax[0], want_amax), f"amax {amax.item()} != {want_amax.item()}"
        if cur:
            assert torch.equal(scale, ref.compute_scale(amax, fp8_format(od).max, 0.0))
        assert torch.equal(sinv, 1.0 / scale)
        q = ref.quantize(xf, scale, od)
        if with_out:
            assert torch.equal(out.view(torch.uint8), q.view(torch.uint8)), "out differs from reference"
        if with_t:
            assert torch.equal(ot.view(torch.uint8), q.view(torch.uint8).t()), "out_t differs from reference"

    check(name, body)


def transpose_case(rows, cols, kind):
    def body():
        d = rows_view(rows, cols, F32, kind).to(E4M3) if kind == "contig" else None
        if d is None:
            big = torch.randint(0, 255, (rows, cols + 16), device=DEV, dtype=torch.uint8)
            d = big[:, :cols] if kind == "strided" else torch.randint(0, 255, (rows * cols + 1,), device=DEV,
                                                                       dtype=torch.uint8)[1:].view(rows, cols)
            d = d.view(E4M3)
        ot = torch.empty(cols, rows, device=DEV, dtype=d.dtype)
        cb.fp8_transpose(d, ot)
        assert torch.equal(ot.view(torch.uint8), d.view(torch.uint8).t())

    check(f"fp8_transpose rows={rows} cols={cols} {kind}", body)


def special_cases():
    def big_offset_ln():  # 1e4 + noise in fp32: two-pass / Chan variance must stay accurate
        for cols in (4096, 65536):
            x = (1e4 + torch.randn(64, cols, device=DEV, dtype=torch.float64)).float()
            w = torch.ones(cols, device=DEV)
            got = run_fwd(cb, x, w, None, None, 1e-5, F32, False, False)
            xd = x.double()
            var = xd.var(1, unbiased=False)
            want = torch.rsqrt(var + 1e-5).float()
            torch.testing.assert_close(got["rs"], want, rtol=1e-4, atol=0)
    check("layernorm 1e4 + noise (fp32) variance accuracy", big_offset_ln)

    def zero_rows():
        for fp8 in (None, "delayed", "current"):
            x = torch.empty(0, 256, device=DEV, dtype=BF16)
            w = torch.ones(256, device=DEV, dtype=BF16)
            od = E4M3 if fp8 else BF16
            got = run_fwd(cb, x, w, None, None, 1e-5, od, True, False, fp8, fp8 is not None)
            if fp8 == "delayed":
                assert got["sinv"].item() == 2.0 and got["amax"].item() == 0.25
            if fp8 == "current":
                assert got["amax"].item() == 0.0
                assert torch.equal(got["scale"], ref.compute_scale(got["amax"], 448.0, 1e-6))
                assert torch.equal(got["sinv"], 1.0 / got["scale"])
        dy = torch.empty(0, 256, device=DEV, dtype=BF16)
        dw = torch.full((256,), float("nan"), device=DEV, dtype=BF16)
        db = torch.full((256,), float("nan"), device=DEV, dtype=BF16)
        cb.norm_bwd(dy, dy, torch.empty(0, device=DEV), torch.empty(0, device=DEV), w, None,
                    torch.empty_like(dy), None, dw, db, is_rms_norm=False, zero_centered_gamma=False,
                    sm_margin=0)
        assert (dw == 0).all() and (db == 0).all()
    check("rows == 0 (fwd bookkeeping, bwd zero grads)", zero_rows)

    def nan_amax():  # a NaN in the input must propagate to amax (torch.amax does)
        x = torch.randn(8, 1024, device=DEV, dtype=BF16)
        x[3, 17] = float("nan")
        w = torch.ones(1024, device=DEV, dtype=BF16)
        got = run_fwd(cb, x, w, None, None, 1e-5, E4M3, True, False, "delayed")
        assert torch.isnan(got["amax"]).all(), "NaN did not reach amax"
    check("NaN propagates to amax", nan_amax)

    def errors():
        x = torch.randn(4, 64, device=DEV, dtype=BF16)
        try:
            cb.norm_fwd(x, torch.ones(64, device=DEV, dtype=F16), None, None, 1e-5, torch.empty_like(x), None,
                        None, torch.empty(4, device=DEV), None, None, None, None, is_rms_norm=True,
                        zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0, sm_margin=0)
        except RuntimeError as e:
            assert "weight" in str(e), str(e)
        else:
            raise AssertionError("bad weight dtype accepted")
        try:
            cb.norm_fwd(x.cpu(), torch.ones(64), None, None, 1e-5, x.cpu(), None, None, torch.empty(4), None,
                        None, None, None, is_rms_norm=True, zero_centered_gamma=False, current_scaling=False,
                        amax_epsilon=0.0, sm_margin=0)
        except ValueError:
            pass
        else:
            raise AssertionError("CPU tensor accepted")
    check("error reporting", errors)

    def graph_capture():
        rows, cols = 512, 4096
        x = torch.randn(rows, cols, device=DEV, dtype=BF16)
        w = torch.rand(cols, device=DEV, dtype=BF16)
        dy = torch.randn_like(x)
        out = torch.empty_like(x)
        rs = torch.empty(rows, device=DEV)
        mu = torch.empty(rows, device=DEV)
        dx = torch.empty_like(x)
        dw = torch.empty(cols, device=DEV, dtype=BF16)
        q = torch.empty(rows, cols, device=DEV, dtype=E4M3)
        qt = torch.empty(cols, rows, device=DEV, dtype=E4M3)
        sc, am, si = (torch.ones(1, device=DEV) for _ in range(3))

        def step():
            cb.norm_fwd(x, w, None, None, 1e-5, out, None, mu, rs, None, None, None, None, is_rms_norm=False,
                        zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0, sm_margin=0)
            cb.norm_bwd(dy, x, mu, rs, w, None, dx, None, dw, None, is_rms_norm=False,
                        zero_centered_gamma=False, sm_margin=0)
            cb.norm_fwd(x, w, None, None, 1e-5, q, None, mu, rs, sc, am, si, qt, is_rms_norm=False,
                        zero_centered_gamma=False, current_scaling=True, amax_epsilon=0.0, sm_margin=0)

        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            step()
        torch.cuda.current_stream().wait_stream(s)
        torch.cuda.synchronize()
        e_out, e_dx, e_dw, e_q = out.clone(), dx.clone(), dw.clone(), q.clone()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            step()
        for t in (out, dx, dw):
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, e_out) and torch.equal(dx, e_dx) and torch.equal(dw, e_dw)
        assert torch.equal(q.view(torch.uint8), e_q.view(torch.uint8))
    check("CUDA graph capture + replay (fwd, bwd with workspace, FP8 current scaling)", graph_capture)

    def overhead():
        x = torch.randn(32, 4096, device=DEV, dtype=BF16)
        w = torch.ones(4096, device=DEV, dtype=BF16)
        out = torch.empty_like(x)
        rs = torch.empty(32, device=DEV)
        args = (x, w, None, None, 1e-5, out, None, None, rs, None, None, None, None)
        kw = dict(is_rms_norm=True, zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0, sm_margin=0)
        for _ in range(100):
            cb.norm_fwd(*args, **kw)
        torch.cuda.synchronize()
        n = 2000
        t0 = time.perf_counter()
        for _ in range(n):
            cb.norm_fwd(*args, **kw)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        t2 = time.perf_counter()
        print(f"info: host time per norm_fwd call (32x4096 bf16): {(t1 - t0) / n * 1e6:.2f} us launch, "
              f"{(t2 - t0) / n * 1e6:.2f} us incl. device")
    check("host overhead", overhead)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer shapes")
    ap.add_argument("--big", action="store_true", help="add a > 2^31-element case")
    args = ap.parse_args()
    assert torch.cuda.is_available(), "needs a GPU"
    t0 = time.time()
    cb.ensure_available()
    print(f"extension ready in {time.time() - t0:.1f} s on {torch.cuda.get_device_name()}")

    cols_list = [1, 8, 17, 64, 320, 768, 1024, 3571, 4096, 5120, 8192, 12288, 16384, 17389, 32768, 65536,
                 262144]
    if args.quick:
        cols_list = [17, 768, 4096, 16384, 17389, 65536]
    for cols in cols_list:
        rows = 37 if cols <= 16384 else 5
        for xd in (BF16, F16, F32):
            for is_rms in (True, False):
                fwd_case(rows, cols, xd, xd, None, xd, is_rms, False, not is_rms)
                fwd_case(rows, cols, xd, F32, F32, F32, is_rms, True, True)
            fwd_case(rows, cols, xd, xd, xd, xd, False, False, True)
        for od in (E4M3, E5M2):
            for mode in ("delayed", "current"):
                for is_rms in (True, False):
                    fwd_case(rows, cols, BF16, BF16, None, od, is_rms, False, False, mode, True)
                fwd_case(rows, cols, BF16, F32, F32, od, False, True, True, mode, True)
        for is_rms in (True, False):
            bwd_case(rows, cols, BF16, BF16, BF16, BF16, is_rms, False, not is_rms)
            bwd_case(rows, cols, F32, BF16, BF16, F32, is_rms, True, True, dres=F32)
            bwd_case(rows, cols, F16, F16, F32, F16, is_rms, False, True, dres=F16)
            bwd_case(rows, cols, F32, F32, F32, F32, is_rms, False, True)
    # many rows (persistent loop, tails of row tiles), row counts around tile sizes
    for rows in (1, 15, 16, 33, 1000, 4099):
        fwd_case(rows, 1024, BF16, BF16, None, E4M3, True, False, False, "delayed", True)
        fwd_case(rows, 2048, BF16, BF16, BF16, BF16, False, False, True)
        bwd_case(rows, 1024, BF16, BF16, BF16, BF16, False, False, True)
    for kind in ("strided", "misaligned"):
        for cols in (64, 4096, 20000):
            fwd_case(40, cols, BF16, BF16, BF16, BF16, False, True, True, kind=kind)
            fwd_case(40, cols, BF16, BF16, None, E4M3, True, False, False, "current", True, kind=kind)
            bwd_case(40, cols, BF16, BF16, BF16, BF16, False, False, True, dres=BF16, kind=kind)
    for rows, cols in ((1, 1), (17, 33), (64, 128), (100, 300), (1024, 4096), (4096, 1000)):
        for xd, od, cur, wo, wt in itertools.product((BF16, F32), (E4M3, E5M2), (False, True),
                                                     (True, False), (True, False)):
            if wo or wt:
                cast_case(rows, cols, xd, od, cur, wo, wt)
        cast_case(rows, cols, F16, E4M3, True, True, True, kind="strided")
        cast_case(rows, cols, BF16, E4M3, False, True, True, kind="misaligned")
        for kind in ("contig", "strided", "misaligned"):
            transpose_case(rows, cols, kind)
    special_cases()
    if args.big:
        def big():
            rows, cols = (1 << 31) // 16384 + 3, 16384
            x = torch.randn(rows, cols, device=DEV, dtype=BF16)
            w = torch.rand(cols, device=DEV, dtype=BF16)
            got = run_fwd(cb, x, w, None, None, 1e-5, BF16, True, False)
            tail = slice(rows - 4, rows)
            want = run_fwd(ref, x[tail], w, None, None, 1e-5, F32, True, False)
            close("out tail", got["out"][tail], want["out"], BF16)
        check("> 2^31 elements (int64 offsets)", big)
    print(f"{RESULTS['passed']} passed, {RESULTS['failed']} failed")
    return 1 if RESULTS["failed"] else 0


if __name__ == "__main__":
    sys.exit(main())
