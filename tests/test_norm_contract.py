"""The norm op contract, backend by backend, against the float64 oracle.

Every output buffer is poisoned (NaN, or 0xFF bytes) before the kernel runs, so an element the
kernel fails to write fails the comparison. Shapes are irregular on purpose (N not a multiple of 16,
M = 1, N = 17389 past the register cap so the blocked path runs).
"""

from __future__ import annotations

import contextlib

import pytest
import torch

import engine
from engine.backend import OpFamily

from conftest import (DEVICE, ON_GPU, cuda_kernel_launches, cuda_kernel_names, gpu_sms, many_rows,
                      resident_bound, use_backend)
from reference import norm_bwd as ref_bwd
from reference import norm_fwd as ref_fwd
from reference import residual_sum
from tolerances import BWD, FWD, LARGE_MEAN_300_ATOL, REDUCTION, STATS, rel_err

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def impl_for(is_rms_norm: bool):
    return engine.backend.select(OpFamily.RMSNORM if is_rms_norm else OpFamily.LAYERNORM, DEVICE)


def assert_stats(mu, rsigma, ref, is_rms):
    """rsigma (and LayerNorm's mu) against the float64 oracle's."""
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    if not is_rms:
        torch.testing.assert_close(mu.double(), ref["mu"], **STATS)


def poisoned(shape, dtype):
    t = torch.empty(shape, dtype=dtype, device=DEVICE)
    if dtype.is_floating_point and t.element_size() > 1:
        t.fill_(float("nan"))
    else:
        t.view(torch.uint8).fill_(0xFF)
    return t


def rows_with_stride(m, n, dtype, extra=0, scale=1.0, offset=0.0):
    """Random [m, n] rows; with ``extra`` > 0 a view of a wider buffer (row stride n + extra)."""
    base = torch.randn(m, n + extra, device=DEVICE) * scale + offset
    return base.to(dtype)[:, :n]


def run_fwd(is_rms, x, w, b, res, eps, zcg, out_dtype, current=False, out_t=None, **t_path):
    """The backend's forward into poisoned outputs: ``(out, residual_out, mu, rsigma)``. An FP8
    ``out_dtype`` in delayed scaling at 2, or current scaling; ``out_t`` (an FP8 ``[n, m]``
    tensor) receives the transposed copy by the path ``t_path`` asks (out_t_auto / out_t_after)."""
    m, n = x.shape
    out = poisoned((m, n), out_dtype)
    res_out = poisoned((m, n), res.dtype) if res is not None else None
    mu = poisoned((m,), F32) if not is_rms else None
    rsigma = poisoned((m,), F32)
    fp8 = out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)  # delayed scaling at 2, or current
    scale = torch.full((1,), 2.0, device=DEVICE) if fp8 else None
    amax = torch.zeros(1, device=DEVICE) if fp8 else None
    scale_inv = poisoned((1,), F32) if fp8 else None
    impl_for(is_rms).norm_fwd(
        x, w, b, res, eps, out, res_out, mu, rsigma, scale, amax, scale_inv, out_t,
        is_rms_norm=is_rms, zero_centered_gamma=zcg, current_scaling=fp8 and current,
        amax_epsilon=0.0, sm_margin=0, **t_path)
    return out, res_out, mu, rsigma


def check_fwd(is_rms, m, n, x_dtype, w_dtype, out_dtype, *, zcg=False, bias=False, res_dtype=None,
              row_extra=0, eps=1e-5):
    x = rows_with_stride(m, n, x_dtype, row_extra)
    w = (torch.randn(n, device=DEVICE) * 0.5 + (0.0 if zcg else 1.0)).to(w_dtype)
    b = torch.randn(n, device=DEVICE).to(w_dtype) if bias else None
    res = rows_with_stride(m, n, res_dtype, row_extra) if res_dtype is not None else None
    out, res_out, mu, rsigma = run_fwd(is_rms, x, w, b, res, eps, zcg, out_dtype)
    z = x
    if res is not None:
        z = residual_sum(x, res)
        torch.testing.assert_close(res_out, z, rtol=0, atol=0)
    ref = ref_fwd(z, w, b, eps, is_rms, zcg)
    torch.testing.assert_close(out.double(), ref["y"], **FWD[out_dtype])
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    if not is_rms:
        torch.testing.assert_close(mu.double(), ref["mu"], **STATS)
    return x, w, b, z, mu, rsigma


def run_bwd(is_rms, dy, z, mu, rsigma, w, dres_in, has_bias, zcg, dx_dtype, dres_dtype):
    m, n = z.shape
    dx = poisoned((m, n), dx_dtype)
    dres = poisoned((m, n), dres_dtype) if dres_dtype is not None else None
    dw = poisoned((n,), w.dtype)
    db = poisoned((n,), w.dtype) if has_bias else None
    impl_for(is_rms).norm_bwd(dy, z, mu, rsigma, w, dres_in, dx, dres, dw, db, is_rms_norm=is_rms,
                              zero_centered_gamma=zcg, sm_margin=0)
    return dx, dres, dw, db


def check_bwd(is_rms, m, n, x_dtype, w_dtype, dy_dtype, *, zcg=False, bias=False, res_dtype=None,
              row_extra=0):
    eps = 1e-5
    x, w, b, z, mu, rsigma = check_fwd(is_rms, m, n, x_dtype, w_dtype, dy_dtype, zcg=zcg, bias=bias,
                                       res_dtype=res_dtype, row_extra=row_extra, eps=eps)
    dy = rows_with_stride(m, n, dy_dtype, row_extra)
    dres_in = rows_with_stride(m, n, res_dtype, row_extra) if res_dtype is not None else None
    dres_dtype = res_dtype if (res_dtype is not None and res_dtype != x_dtype) else None
    dx, dres, dw, db = run_bwd(is_rms, dy, z, mu, rsigma, w, dres_in, bias, zcg, x_dtype, dres_dtype)
    ref = ref_bwd(dy, z, w, b, eps, is_rms, zcg, dres_in)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[x_dtype])
    if dres is not None:
        torch.testing.assert_close(dres.double(), ref["dx"], **BWD[dres_dtype])
    assert rel_err(dw, ref["dweight"]) < REDUCTION[w_dtype], rel_err(dw, ref["dweight"])
    if bias:
        assert rel_err(db, ref["dbias"]) < REDUCTION[w_dtype]


NORMS = [pytest.param(True, id="rms"), pytest.param(False, id="ln")]
SHAPES_M = [1, 7, 199]
SHAPES_N = [1, 17, 760, 3571, 17389]


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("m", SHAPES_M)
@pytest.mark.parametrize("n", SHAPES_N)
def test_shapes_fwd_bwd(backend, is_rms, m, n):
    """Irregular shapes, bf16, both passes; LayerNorm with bias. 17389 takes the backward's blocked
    path (the forward's starts past 32K: test_residual_zero_centered_strided, test_widest_rows)."""
    check_bwd(is_rms, m, n, BF16, BF16, BF16, bias=not is_rms)


DTYPE_PAIRS = [(xd, od) for xd in (F32, F16, BF16) for od in (F32, F16, BF16)]


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("x_dtype,out_dtype", DTYPE_PAIRS, ids=lambda d: str(d).replace("torch.", ""))
@pytest.mark.parametrize("w_fp32", [False, True], ids=["w=x", "w=fp32"])
def test_dtype_pairs(backend, is_rms, x_dtype, out_dtype, w_fp32):
    """Every input/output dtype pair, weight in x's dtype or fp32; the backward with dy in out dtype."""
    w_dtype = F32 if w_fp32 else x_dtype
    check_bwd(is_rms, 7, 760, x_dtype, w_dtype, out_dtype, bias=not is_rms)


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [760, 17389, 40009])
@pytest.mark.parametrize("res_dtype", [BF16, F32], ids=["res=bf16", "res=fp32"])
def test_residual_zero_centered_strided(backend, is_rms, n, res_dtype):
    """Fused residual (in x's dtype or fp32), zero-centred gamma and rows with a stride > N.

    17389 takes the backward's blocked path, 40009 the forward's too (past both register caps)."""
    check_bwd(is_rms, 9, n, BF16, F32, BF16, zcg=True, bias=not is_rms, res_dtype=res_dtype, row_extra=5)


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8184, 32760])
def test_widest_register_rows(backend, is_rms, n):
    """Aligned rows at the one-CTA register paths' widest: CUDA's forward holds 16-bit rows of up
    to 32K (8 vectors per thread, 512 threads: 32760 uses 4095 of them), its backward 8K (8184);
    Triton's forward 32K. Both directions, poisoned outputs, G = 1 row per CTA. On sm_90 CUDA
    splits the 32760 forward over a 2-CTA cluster by default and gives both backwards the
    streamed cluster kernel (test_cluster_rows and test_bwd_elems_layouts run the other paths)."""
    check_bwd(is_rms, 5, n, BF16, BF16, BF16, bias=not is_rms)


@pytest.mark.parametrize("is_rms", NORMS)
def test_widest_rows(backend, is_rms):
    """N = 262144 (the largest hidden size the contract promises) on the blocked path."""
    check_bwd(is_rms, 2, 262144, BF16, BF16, BF16, bias=not is_rms)


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n,res", [(40009, False), (65536, False), (65536, True), (131072, True)],
                         ids=["40009", "65536", "65536-res", "131072-res"])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_64k_rows_each_card_class(backend, is_rms, n, res, dram_class, monkeypatch):
    """Rows of 40009 and 65536 (both 65536 as a power of two), and with a bf16 residual of 65536
    and 131072, forward and backward with each card class's launch defaults (NOTES P109-P111):
    Triton's forward reads 64K in two blocked chunks of 32K on a lean card (the H100), in four of
    16K on a wide one; its residual tiles at LayerNorm 64K and RMSNorm 128K (a row per program in
    chunks of 32K) are both classes' since P113; CUDA's streamed forward runs 16-CTA clusters (128 threads at 64K,
    256 at 128K) on a lean card, 4 or 8 CTAs of 512 (256 with a residual) on a wide one."""
    from engine.triton_kernels import utils

    monkeypatch.setattr(utils, "DRAM_CLASS", dram_class)
    with contextlib.ExitStack() as stack:
        if backend == "cuda":
            from engine import cuda_backend

            stack.enter_context(cuda_backend.dram_class(dram_class))
        check_bwd(is_rms, 5 if n < 131072 else 3, n, BF16, BF16, BF16, bias=not is_rms,
                  res_dtype=BF16 if res else None)


@pytest.mark.parametrize("is_rms", NORMS)
def test_128k_rows_odd_m(backend, is_rms):
    """N = 131072 over 3 rows: Triton's RMSNorm forward there takes tiles of two rows (the tuned
    blocked config), so the last tile is half masked; CUDA splits the row over an 8-CTA cluster."""
    check_bwd(is_rms, 3, 131072, BF16, BF16, BF16, bias=not is_rms)


@pytest.mark.skipif(not ON_GPU, reason="thread-block clusters are a CUDA path (sm_90)")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8184, 12296, 24584, 40000, 65600, 98304, 98312, 131072, 262144])
@pytest.mark.parametrize("max_cluster", [0, 8, 1], ids=["clusters", "clusters8", "no-clusters"])
def test_cluster_rows(is_rms, n, max_cluster):
    """CUDA rows split over a thread-block cluster (forward past 16K 16-bit elements, backward past
    8K; the 8184 backward runs in one CTA at 32 values), against float64 with poisoned outputs,
    and the same rows with clusters off (the 512-thread forward at 24584, the blocked paths beyond;
    test_bwd_elems_layouts runs the 512-thread backward).
    12296 and 98312 leave the last CTA of a cluster partly idle. The RMSNorm backward at 98304
    asks for exactly 48 KB of dynamic shared memory, which beside the kernel's static bytes needs
    the opt-in a launch helper once skipped. 65600: 8 CTAs of 160 threads, the last slots of a row
    held by the first four only (LayerNorm merges per-CTA statistics of unequal counts). 40000
    adds an fp32 residual stream (its own vector count per thread). 301 rows: more than the
    resident clusters, so clusters loop and the backward sums several rows per partial.
    The default (0) allows clusters of 16 CTAs (a non-portable size) on the H100 / H200: rows past
    128K forward and 64K backward take them; with at most 8 the 262144 rows take the blocked
    kernels."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        # the forward's and backward's layouts named above: the streamed kernels off
        # (test_fwd_stream and test_bwd_stream run them)
        with cuda_backend.max_cluster_size(max_cluster), cuda_backend.norm_bwd_stream_from(1 << 30), \
                cuda_backend.norm_fwd_stream_from(1 << 30):
            check_bwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms,
                      res_dtype=F32 if n == 40000 else None)
    finally:
        engine.backend.reset_for_tests()


def bf16_rows(m, n, is_rms, residual=False):
    """x, a residual (or None), gamma and (LayerNorm) beta: standard normal bf16 on DEVICE, drawn
    in that order."""
    x = torch.randn(m, n, device=DEVICE, dtype=BF16)
    r = torch.randn(m, n, device=DEVICE, dtype=BF16) if residual else None
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    b = None if is_rms else torch.randn(n, device=DEVICE, dtype=BF16)
    return x, r, w, b


def knob_stats(is_rms, n, knob, values, out_dtype=BF16, current=False, rows=None, x_dtype=BF16):
    """CUDA: the forward's row statistics of ``rows`` random rows of n (default ``many_rows()``: the
    layout of calls with many rows) of ``x_dtype`` (bf16 draws converted) to ``out_dtype`` (an FP8 dtype:
    delayed scaling, or with ``current`` current scaling, whose statistics pass writes them) under
    each value of a launch knob (engine.cuda_backend); each path adds a row's values in its own
    order. For every knob but norm_fwd_stream_from itself the streamed kernel is off, so that the
    knob's paths run (they remain the paths of a residual, of current scaling's output pass and of
    devices or widths the stream does not take)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        x, _, w, b = (t if t is None else t.to(x_dtype) for t in bf16_rows(rows or many_rows(), n, is_rms))
        stats = []
        for v in values:
            with contextlib.ExitStack() as stack:
                if knob != "norm_fwd_stream_from":
                    stack.enter_context(cuda_backend.norm_fwd_stream_from(1 << 30))
                stack.enter_context(getattr(cuda_backend, knob)(v))
                _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, out_dtype, current)
            stats.append(rsigma if is_rms else torch.cat([mu, rsigma]))
        return stats
    finally:
        engine.backend.reset_for_tests()


def check_knob_changes_path(is_rms, n, knob, values):
    """The statistics under each value agree within rounding with the first value's but not bit
    for bit: over many_rows() rows of n, unequal bits mean the paths differ."""
    stats = knob_stats(is_rms, n, knob, values)
    for other in stats[1:]:
        torch.testing.assert_close(other, stats[0], rtol=1e-5, atol=1e-6)
        assert not torch.equal(other, stats[0])


@pytest.mark.skipif(not ON_GPU, reason="thread-block clusters are a CUDA path (sm_90)")
@pytest.mark.parametrize("is_rms", NORMS)
def test_default_cluster_16(is_rms):
    """On the H100 / H200 (the devices this runs on) the default cluster limit is 16: rows of
    262144 go to 16-CTA clusters, the same bits as an explicit 16, not those of the blocked kernel
    that a limit of 8 leaves them."""
    default, c16, c8 = knob_stats(is_rms, 262144, "max_cluster_size", (0, 16, 8))
    assert torch.equal(default, c16)
    torch.testing.assert_close(c8, default, rtol=1e-5, atol=1e-6)
    assert not torch.equal(c8, default)


@pytest.mark.skipif(not ON_GPU, reason="thread-block clusters are a CUDA path (sm_90)")
@pytest.mark.parametrize("is_rms", NORMS)
def test_cluster_path_taken(is_rms):
    """The cluster knob changes the path (the cluster adds per-CTA sums in rank order, the other
    paths in another order), over many_rows() rows of 65536."""
    check_knob_changes_path(is_rms, 65536, "max_cluster_size", (8, 1))


def check_bwd_knob_changes_path(is_rms, n, knob, values, same=None):
    """CUDA backward under two values of a launch knob, over 301 rows of n: the two paths group
    the rows of a column's fp32 dweight (and dbias) differently, so the sums differ in bits, but by
    no more than two orderings of the same 301 fp32 terms can: 2 * 300 * 2**-24 * sum(|dy * xhat|)
    per column (the recursive-summation bound), and dbias likewise. `same`: a third value whose
    results must equal the first value's bit for bit (the default taking that path). For every
    knob but norm_bwd_stream_from itself the streamed kernel is off, so that the knob's layouts
    are the ones that run (they stay the paths without clusters, and where the stream does not
    fit)."""
    from engine import cuda_backend

    use_backend("cuda")
    stack = contextlib.ExitStack()
    if knob != "norm_bwd_stream_from":
        stack.enter_context(cuda_backend.norm_bwd_stream_from(1 << 30))
    try:
        m = 301
        x = torch.randn(m, n, device=DEVICE, dtype=BF16)
        w = torch.randn(n, device=DEVICE, dtype=F32)
        b = None if is_rms else torch.randn(n, device=DEVICE, dtype=F32)
        dy = torch.randn(m, n, device=DEVICE, dtype=BF16)
        _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, BF16)
        grads = []
        for v in values + ((same,) if same is not None else ()):
            with getattr(cuda_backend, knob)(v):
                grads.append(run_bwd(is_rms, dy, x, mu, rsigma, w, None, b is not None, False, BF16,
                                     None))
        xhat = (x.double() - (0.0 if is_rms else mu.double()[:, None])) * rsigma.double()[:, None]
        u = 2.0 ** -24
        bounds = [2 * (m - 1) * u * (dy.double() * xhat).abs().sum(0)]
        if b is not None:
            bounds.append(2 * (m - 1) * u * dy.double().abs().sum(0))
        for got, other, bound in zip(grads[0][2:], grads[1][2:], bounds):
            assert torch.isfinite(got).all()
            assert ((got.double() - other.double()).abs() <= bound).all()
            assert not torch.equal(got, other)
        if same is not None:
            for got, again in zip(grads[0], grads[2]):
                assert got is None or torch.equal(got, again)
    finally:
        stack.close()
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="thread-block clusters are a CUDA path (sm_90)")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [40000, 65536, 131072])
@pytest.mark.parametrize("max_cluster", [8, 16])
def test_wide_cluster_bwd_taken(is_rms, n, max_cluster):
    """The backward past 32K 16-bit elements runs in 8-CTA clusters with 32 (40000, 65536) or 64
    (131072) values per thread and its dweight / dbias partials in shared memory (with clusters of
    up to 16: 32 values at 131072); with clusters off it takes the blocked kernel
    (check_bwd_knob_changes_path). test_cluster_rows checks both paths against float64."""
    check_bwd_knob_changes_path(is_rms, n, "max_cluster_size", (max_cluster, 1))


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA backward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("elems", [0, 16, 32])
@pytest.mark.parametrize("n", [4096, 4104, 8192, 12296, 16384, 32768, 65600])
@pytest.mark.parametrize("max_cluster", [0, 1], ids=["clusters", "no-clusters"])
def test_bwd_elems_layouts(is_rms, elems, n, max_cluster):
    """Every layout of the CUDA backward's register path (cuda_backend.norm_bwd_elems: 16 or 32
    values per thread, 0 the default) against float64 with poisoned outputs, over 301 rows (CTAs
    loop, the partials sum several rows): 4104 and 12296 leave lanes idle (32 values: a CTA of
    160 threads; a 2-CTA cluster of 224); 65600 at 16 takes the blocked kernel. With clusters off,
    16 values at 4104-8192 take the one-CTA 512-thread kernel, 32 values one CTA of 256. The
    streamed kernel, which the default gives these widths, is off here (test_bwd_stream)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_bwd_elems(elems), cuda_backend.max_cluster_size(max_cluster), \
                cuda_backend.norm_bwd_stream_from(1 << 30):
            check_bwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA backward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8192, 16384])
def test_bwd_elems_taken(is_rms, n):
    """The backward knob changes the layout (8192: one CTA of 256 threads at 32 values, a 2-CTA
    cluster at 16; 16384: 2 against 4 CTAs), and the default takes 32 at 8192, 16 at 16384. Under
    norm_bwd_cta_threads(256): by default RMSNorm 16384 at 16 values runs in one CTA of 1024
    threads, whose 132 workspace rows group the rows as the 132 two-CTA clusters at 32 values do
    (the same bits: this test could not tell them apart); test_bwd_cta_threads_taken covers it."""
    from engine import cuda_backend

    values = (32, 16) if n == 8192 else (16, 32)
    with cuda_backend.norm_bwd_cta_threads(256):
        check_bwd_knob_changes_path(is_rms, n, "norm_bwd_elems", values, same=0)


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA backward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("cta", [0, 256, 512, 1024])
@pytest.mark.parametrize("n", [4104, 8192, 12296, 16384, 16392])
def test_bwd_cta_threads_layouts(is_rms, cta, n):
    """The CUDA backward's one-CTA layout at 16 values per thread (cuda_backend.norm_bwd_cta_threads:
    CTAs of up to 512 or 1024 threads for one row; 256 none, 0 the default) against float64 with
    poisoned outputs, over 301 rows: 4104 (257 threads) and 12296 (769) leave lanes idle, 16384
    fills 1024 threads and 16392 needs 1025, so it keeps the cluster layout. LayerNorm with and
    without a bias (its 1024-thread builds keep one or two partials in shared memory), and fp16
    with an fp32 gamma and a residual gradient in. The streamed kernel, the default at these
    widths, is off here (test_bwd_stream)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_bwd_cta_threads(cta), cuda_backend.norm_bwd_stream_from(1 << 30):
            check_bwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms)
            if not is_rms:
                check_bwd(is_rms, 301, n, BF16, BF16, BF16, bias=False)
            check_bwd(is_rms, 301, n, F16, F32, F16, bias=not is_rms, res_dtype=F16)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA backward")
@pytest.mark.parametrize("is_rms,n,values", [
    (True, 8192, (256, 512)), (False, 8192, (256, 512)), (True, 16384, (1024, 256)),
    (True, 16384, (1024, 512)), (False, 16384, (1024, 256))],
    ids=["rms-8192", "ln-8192", "rms-16384-256", "rms-16384-512", "ln-16384-256"])
def test_bwd_cta_threads_taken(is_rms, n, values):
    """The knob changes the layout: 8192 at 32 values in 256 threads against one CTA of 512 at
    16; 16384 in one CTA of 1024 threads against a 4-CTA cluster (256 and 512 alike; LayerNorm's
    partials in shared memory there). The default takes the first layout of each pair, bit for
    bit."""
    check_bwd_knob_changes_path(is_rms, n, "norm_bwd_cta_threads", values, same=0)


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("vectors", [0, 4, 8])
@pytest.mark.parametrize("n", [1024, 1032, 2056, 4096, 8200, 16384])
def test_fwd_vector_layouts(is_rms, vectors, n):
    """Every thread layout of the CUDA forward's register path (4 or 8 vectors of 16 bytes per
    thread) against float64 with poisoned outputs: bf16 with a bias and a bf16 residual, fp16 with
    zero-centred gamma; 0 is the default (for bf16 4 at 1024 and 1032, and at these 301 rows, few
    on an H100 / H200, up to 8K too; 8 otherwise). 1032 and 2056
    leave a row group's last lanes partly idle; 16384 at 4 vectors would need 512 threads and keeps
    8. 301 rows: CTAs loop over several row blocks. The blocked and streamed kernels are off (by
    default the residual rows take the blocked kernel at 2K-16K and the stream past 16K, LayerNorm
    the stream from 16K without one), so that every row here runs the register path."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_fwd_vectors(vectors), cuda_backend.norm_fwd_blocked_from(1 << 30), \
                cuda_backend.norm_fwd_stream_from(1 << 30):
            check_fwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
            check_fwd(is_rms, 301, n, F16, F16, F32, zcg=True)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
def test_fwd_vector_layouts_taken(is_rms):
    """The layout knob changes the layout, over many_rows() rows of 4096 (64 or 128 threads per row)."""
    check_knob_changes_path(is_rms, 4096, "norm_fwd_vectors", (8, 4))


@pytest.mark.skipif(not ON_GPU, reason="a layout default of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [2048, 8192])
@pytest.mark.parametrize("x_dtype", [BF16, F16], ids=["bf16", "fp16"])
def test_fwd_few_rows_take_4_vectors(is_rms, n, x_dtype):
    """With the knob at its default, 16-bit rows of 1K-8K take 4 vectors per thread where a call
    has at most cuda_backend.FEW_ROWS_PER_SM (bf16) or FEW_ROWS_PER_SM_FP16 (fp16) rows per SM
    (the kernel's time is then one CTA's instructions: NOTES Q35-Q37, Q42, P146-P148), 8 past
    that: the statistics equal the knob's 4 bit for bit at that many rows per SM and its 8 at one
    row more (the two layouts add a row's values in different orders). This also checks the
    Python constants against the extension's."""
    from engine import cuda_backend

    per_sm = cuda_backend.FEW_ROWS_PER_SM if x_dtype == BF16 else cuda_backend.FEW_ROWS_PER_SM_FP16
    last_few = per_sm * gpu_sms()
    few, four, eight = knob_stats(is_rms, n, "norm_fwd_vectors", (0, 4, 8), rows=last_few, x_dtype=x_dtype)
    assert torch.equal(few, four) and not torch.equal(few, eight)
    many, four, eight = knob_stats(is_rms, n, "norm_fwd_vectors", (0, 4, 8), rows=last_few + 1,
                                   x_dtype=x_dtype)
    assert torch.equal(many, eight) and not torch.equal(many, four)


@pytest.mark.skipif(not ON_GPU, reason="a kernel of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n,knob", [(4096, 0), (8192, 0), (16384, 0), (32768, 2), (32768, 3)])
@pytest.mark.parametrize("case", ["bf16", "bf16-f32out-f32w-zcg-nobias", "fp16-strided"])
def test_fwd_lean_same_bits(is_rms, n, knob, case):
    """The lean forward (norm_fwd_lean.cuh: rows of 4096-16384 columns; under knob 2 32768 for
    both norms on any card, as one 512-thread CTA per row; under knob 3 over a 2-CTA cluster,
    P155) against float64
    with poisoned outputs, and bit for bit the register kernel's outputs
    (cuda_backend.norm_fwd_lean(1), its one-CTA build, or under knob 3 its clusters of the same
    size; no streamed kernel):
    y, rsigma and mu, over many_rows() + 37 rows (CTAs' last row blocks partly past the end),
    bf16 to bf16 and to fp32 with fp32 zero-centred weights (LayerNorm without a bias there, with
    one elsewhere), fp16 on rows with a stride past the row. Rows of a large mean (LayerNorm's
    centred pass) are among them."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        m = many_rows() + 37
        x_dtype = F16 if case.startswith("fp16") else BF16
        out_dtype = F32 if "f32out" in case else x_dtype
        w_dtype = F32 if "f32w" in case else x_dtype
        zcg = "zcg" in case
        x = rows_with_stride(m, n, x_dtype, 64 if "strided" in case else 0)
        x[::7] += 300.0  # rows of a large mean against the spread: LayerNorm's centred pass
        w = (torch.randn(n, device=DEVICE) * 0.5 + (0.0 if zcg else 1.0)).to(w_dtype)
        b = None if is_rms or "nobias" in case else torch.randn(n, device=DEVICE).to(w_dtype)
        outs = []
        with cuda_backend.norm_fwd_lean(knob):
            outs.append(run_fwd(is_rms, x, w, b, None, 1e-5, zcg, out_dtype))
        # knob 3 (P155): the row over a 2-CTA cluster, the register kernel's clusters of two
        with cuda_backend.norm_fwd_lean(1), cuda_backend.max_cluster_size(2 if knob == 3 else 1), \
                cuda_backend.norm_fwd_stream_from(1 << 30):
            outs.append(run_fwd(is_rms, x, w, b, None, 1e-5, zcg, out_dtype))
        ref = ref_fwd(x, w, b, 1e-5, is_rms, zcg)
        big = torch.zeros(m, dtype=torch.bool, device=DEVICE)
        big[::7] = not is_rms  # LayerNorm's rows of a large mean: their own tolerance
        torch.testing.assert_close(outs[0][0][~big].double(), ref["y"][~big], **FWD[out_dtype])
        torch.testing.assert_close(outs[0][3][~big].double(), ref["rsigma"][~big], **STATS)
        if not is_rms:
            torch.testing.assert_close(outs[0][0][big].double(), ref["y"][big], rtol=FWD[out_dtype]["rtol"],
                                       atol=LARGE_MEAN_300_ATOL)
            torch.testing.assert_close(outs[0][3][big].double(), ref["rsigma"][big], rtol=1e-3, atol=0)
        for k in (0, 3) if is_rms else (0, 2, 3):
            assert torch.equal(outs[0][k], outs[1][k]), f"output {k} differs from the register kernel's"
    finally:
        engine.backend.reset_for_tests()


# The lean kernel's cluster build in a profiler kernel name: its last template argument (kCl) true.
LEAN_CLUSTER = ", 256, true>"


LEAN_K = "norm_fwd_lean_kernel"  # the bf16 lean kernel's name (norm_fwd_lean.cuh)


@pytest.mark.skipif(not ON_GPU, reason="a kernel of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
def test_fwd_lean_taken(is_rms):
    """The lean kernel runs where it applies by default (8192 and 4096 columns; 32768 for RMSNorm
    on a card that is not lean, dram_class 2, and for LayerNorm on a lean one: P154) and not under
    norm_fwd_lean(1), nor for an FP8 output, a residual, another width (8184), a call of
    few rows (4 vectors per thread: FEW_ROWS_PER_SM), or (32768) under the stream's knob; under
    norm_fwd_lean(2) at 32768 for both norms on either card (one 512-thread CTA per row); over a
    2-CTA cluster under norm_fwd_lean(3) and by default for RMSNorm on a wide card (P155), not
    with clusters capped at 1. (LEAN_K: its name, not the lean FP8 kernel's, which an FP8 output
    of 8192 takes by default on a wide card: NOTES P181b.)"""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        m = many_rows()
        x, r, w, b = bf16_rows(m, 8192, is_rms, residual=True)

        def names(x, r=None, out_dtype=BF16):
            return cuda_kernel_names(lambda: run_fwd(is_rms, x, w[:x.shape[1]], None if b is None else b[:x.shape[1]],
                                                    r, 1e-5, False, out_dtype))

        assert LEAN_K in " ".join(names(x))
        with cuda_backend.norm_fwd_lean(1):
            assert LEAN_K not in " ".join(names(x))
        assert LEAN_K not in " ".join(names(x, out_dtype=torch.float8_e4m3fn))
        assert LEAN_K not in " ".join(names(x, r))
        assert LEAN_K not in " ".join(names(x[:, :8184].contiguous()))
        assert LEAN_K not in " ".join(names(x[:32]))
        x4 = x[:, :4096].contiguous()
        x32, _, w32, b32 = bf16_rows(m, 32768, is_rms)

        def names32():
            return " ".join(cuda_kernel_names(lambda: run_fwd(is_rms, x32, w32, b32, None, 1e-5, False, BF16)))

        for dram_class in (1, 2):
            with cuda_backend.dram_class(dram_class):
                assert LEAN_K in " ".join(names(x4)), dram_class
                assert (LEAN_K in names32()) == (is_rms == (dram_class == 2)), dram_class
                with cuda_backend.norm_fwd_stream_from(32768):
                    assert LEAN_K not in names32()
                for knob in (2, 3):
                    with cuda_backend.norm_fwd_lean(knob):
                        assert LEAN_K in " ".join(names(x4))
                        assert LEAN_K in names32()
        # RMSNorm 32K on a wide card by default (P155), and both norms under knob 3: the 2-CTA
        # cluster build (the last template argument), not where clusters are capped at 1
        with cuda_backend.dram_class(2):
            assert (LEAN_CLUSTER in names32()) == is_rms
            with cuda_backend.max_cluster_size(1):
                assert LEAN_CLUSTER not in names32() and (LEAN_K in names32()) == is_rms
        with cuda_backend.norm_fwd_lean(3):
            assert LEAN_CLUSTER in names32()
        with cuda_backend.norm_fwd_lean(2):
            assert LEAN_CLUSTER not in names32()
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("blocked_from", [1, 1 << 30], ids=["blocked", "never"])
@pytest.mark.parametrize("n", [1024, 4104, 16384, 24584, 32768, 65536, 131072])
def test_fwd_blocked_from(is_rms, blocked_from, n):
    """The CUDA forward's blocked kernel (norm_fwd_blocked_from: every width from 1) and the paths
    it replaces (1 << 30: never) against float64 with poisoned outputs: bf16 with a bias and a
    bf16 residual (z packed, 64 registers), fp16 with zero-centred gamma to fp32, fp32 x (z
    as packed floats); an fp32 residual stream under bf16 x keeps the other paths (z is not x's
    dtype) and must still be right. 24584: two chunks of 16K for a 16-bit x (512 threads), four
    of 8K for fp32 x, the last partly past the row; 16384: one chunk, held in registers through
    both passes (NOTES P95); 65536 and more: several chunks; 301 rows: CTAs loop over rows; 1024 and 4104 run CTAs sized to the row (32 and 160 threads: one warp,
    and warps not a power of two). 1 << 30 gives no row the blocked kernel, so 1024-32768
    then run the register path and clusters."""
    from engine import cuda_backend

    use_backend("cuda")
    try:  # the streamed kernel off (test_fwd_stream runs it)
        with cuda_backend.norm_fwd_blocked_from(blocked_from), cuda_backend.norm_fwd_stream_from(1 << 30):
            check_fwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
            check_fwd(is_rms, 37, n, F16, F16, F32, zcg=True)
            check_fwd(is_rms, 37, n, F32, F32, BF16, bias=not is_rms)
            check_fwd(is_rms, 37, n, BF16, BF16, BF16, res_dtype=F32)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [2048, 4104, 8192, 16384])
def test_fwd_blocked_shape(is_rms, n):
    """P162, norm_fwd_blocked_shape: the blocked kernel's residual rows (its default at 2K-16K)
    under each shape against float64 with poisoned outputs, residual_out bit for bit round(x + r):
    bf16 with a bias (LayerNorm) over many_rows() + 37 rows, fp16 rows with a stride past the row
    to fp32 with fp32 zero-centred weights over 37 rows. Shapes 1 and 4 (four vectors per thread,
    on the resident grid / 32 CTAs per SM) give each other's bits, and so do shapes 2 and 3 (two
    vectors per thread, CTAs of twice the threads: another order of a row's sums); the two pairs
    differ up to 8192 columns, and at 16384 (one chunk of 512 threads at four vectors, which shape
    2 keeps) agree. The default (0) gives the bits of the shape fwd_blocked_res_shape picks: two
    vectors to 4K and at RMSNorm 8K, four at LayerNorm 8K and at 16K; and it is checked over more
    rows than its grid of 32 CTAs per SM."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        for shape in (0, 1, 2, 3, 4):
            with cuda_backend.norm_fwd_blocked_shape(shape), cuda_backend.norm_fwd_stream_from(1 << 30):
                check_fwd(is_rms, many_rows() + 37, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
                check_fwd(is_rms, 37, n, F16, F32, F32, zcg=True, res_dtype=F16, row_extra=64)
        x, r, w, b = bf16_rows(many_rows(), n, is_rms, residual=True)
        stats = {}
        for shape in (0, 1, 2, 3, 4):
            with cuda_backend.norm_fwd_blocked_shape(shape), cuda_backend.norm_fwd_stream_from(1 << 30):
                _, _, mu, rsigma = run_fwd(is_rms, x, w, b, r, 1e-5, False, BF16)
            stats[shape] = rsigma if is_rms else torch.cat([mu, rsigma])
        assert torch.equal(stats[4], stats[1]) and torch.equal(stats[3], stats[2])
        assert torch.equal(stats[2], stats[1]) == (n > 8192)
        two_vectors = n <= 4096 or (n <= 8192 and is_rms)
        assert torch.equal(stats[0], stats[2 if two_vectors else 1])
        # the default over more rows than its grid of 32 CTAs per SM (a CTA's row loop strides)
        check_fwd(is_rms, 32 * gpu_sms() + 37, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
    finally:
        engine.backend.reset_for_tests()


# The CUDA forward's grids past residency by default: (kernel, width, rows, residual, CTAs per SM
# for RMSNorm and LayerNorm).
GRID_CASES = [("norm_fwd_blocked_kernel", 4096, None, True, (32, 32)),  # P162's shape 3
              ("norm_fwd_reg_kernel", 1024, 1 << 18, False, (32, 32)),  # P46 / P82; P166, P167
              ("norm_fwd_lean_kernel", 8192, 1 << 14, False, (16, 16))]  # the lean kernel, fwd_grid_per_sm


def profiled_norm(is_rms, x, r, w, b, margin, kernel, grad=False):
    """One norm call (with the residual r where given, its backward too with ``grad``) under
    sm_margin=margin, profiled: (grid x, the trace's args of the one launch of ``kernel``, the
    forward's outputs as a tuple). For the grid tests of both backends."""
    out = {}

    def call():
        kw = dict(residual=r, sm_margin=margin) if r is not None else dict(sm_margin=margin)
        xi = x.detach().requires_grad_(grad)
        with torch.set_grad_enabled(grad):
            y = engine.rmsnorm(xi, w, 1e-5, **kw) if is_rms else engine.layernorm(xi, w, b, 1e-5, **kw)
            y = y if r is not None else (y,)
            if grad:
                torch.autograd.grad(y[0].float().sum(), xi)
        out["y"] = y

    found = [(g, a) for name, g, _, a in cuda_kernel_launches(call) if kernel in name]
    assert len(found) == 1, found
    return found[0][0][0], found[0][1], out["y"]


#: (rows, cols) of the CUDA backward's reduction test: few rows (partial rows of few CTAs), widths
#: not a multiple of 4 (the last 16-byte vector of a partial row past cols), the split backward's
#: 128K rows (clusters: 8 partial rows for many columns, NOTES P171); 3 x 40001: the flat kernel for
#: LayerNorm's two sets with a ragged last vector, the sliced one for RMSNorm's one (P172c).
REDUCE_CASES = [(301, 1000), (301, 17389), (64, 131072), (37, 4096), (5, 65536), (1, 4099),
                (16, 2050), (3, 40001)]


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backward's reduction")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("m,n", REDUCE_CASES)
def test_bwd_reduce_vec(is_rms, m, n):
    """The CUDA backward's dweight / dbias reduction (cuda_backend.norm_bwd_reduce_vec, NOTES P171,
    P172): the sliced kernel at 1 and 4 columns per thread and the default give the same bits
    (each column's partials are added in one order), into poisoned outputs, within fp32
    summation of the float64 sums. The default (read from the profiler trace) launches the flat
    kernel where the backward leaves at most 16 partial rows (always at m <= 16 rows) and the
    128-column blocks outnumber the sliced grid (4 CTAs per SM and set), else the sliced 4-column
    build where the 128-column blocks of the sets cover the SMs and the 1-column one elsewhere. Grids: at most 4 sliced (16 flat) CTAs per SM and set, of SMs - 4 under
    sm_margin=4 (whose backward may leave other partial rows: other bits, the same bound)."""
    from engine import cuda_backend

    use_backend("cuda")
    x = torch.randn(m, n, device=DEVICE, dtype=BF16)
    w = torch.randn(n, device=DEVICE, dtype=F32)
    b = None if is_rms else torch.randn(n, device=DEVICE, dtype=F32)
    dy = torch.randn(m, n, device=DEVICE, dtype=BF16)
    _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, BF16)
    sets = 1 if is_rms else 2
    got = {}

    def bwd(margin):
        dx, dw = poisoned((m, n), BF16), poisoned((n,), F32)
        db = poisoned((n,), F32) if b is not None else None
        impl_for(is_rms).norm_bwd(dy, x, mu, rsigma, w, None, dx, None, dw, db, is_rms_norm=is_rms,
                                  zero_centered_gamma=False, sm_margin=margin)
        got["g"] = (dw, db)

    def reduce_launch(margin):
        found = [(name, g) for name, g, _, _ in cuda_kernel_launches(lambda: bwd(margin))
                 if "norm_bwd_reduce" in name]
        assert len(found) == 1, found
        return found[0][0], found[0][1], got["g"]

    def per_sm(name):  # the CTAs per SM that the launcher's grid may ask of each set
        return 16 if "flat" in name else 4

    results = {}
    flat_fits = -(-n // 128) > gpu_sms() * 4 // sets  # the sliced grid would walk blocks in turn
    for v in (1, 4, 0):
        with cuda_backend.norm_bwd_reduce_vec(v):
            name, grid, results[v] = reduce_launch(0)
        sliced = f"norm_bwd_reduce_kernel<{v if v else (4 if -(-n // 128) * sets >= gpu_sms() else 1)}>"
        if v == 0 and m <= 16 and flat_fits:
            assert "norm_bwd_reduce_flat_kernel" in name, name
        elif v == 0 and "norm_bwd_reduce_flat_kernel" in name:
            assert flat_fits, name
        else:
            assert sliced in name, name
        assert grid[1] == sets and grid[0] <= gpu_sms() * per_sm(name) // sets
    name, grid, margin_result = reduce_launch(4)
    assert grid[0] <= (gpu_sms() - 4) * per_sm(name) // sets, grid
    xhat = (x.double() - (0.0 if is_rms else mu.double()[:, None])) * rsigma.double()[:, None]
    terms = [dy.double() * xhat] + ([dy.double()] if b is not None else [])
    for i, t in enumerate(terms):
        for v in (4, 0):
            assert torch.equal(results[v][i], results[1][i]), v
        # any order of m fp32 terms, each a few roundings from its float64 value
        bound = 2 * (m + 4) * 2.0 ** -24 * t.abs().sum(0)
        for r in (results[1][i], margin_result[i]):
            assert ((r.double() - t.sum(0)).abs() <= bound).all()


@pytest.mark.skipif(not ON_GPU, reason="the CUDA forward's grid")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("kernel,n,rows,res,per_sm", GRID_CASES, ids=[c[0] for c in GRID_CASES])
def test_fwd_grid_sm_margin(is_rms, kernel, n, rows, res, per_sm):
    """The CUDA forward's grids past residency (more CTAs per SM than fit, the row loop striding
    by the grid) and sm_margin (NOTES P162, P164): bf16 rows, enough of them that the row work
    exceeds the grid, launch per_sm x SMs CTAs at sm_margin 0; under sm_margin=4 no more than fit
    on SMs - 4 (at most 2048 threads per SM), CTAs of the same size, and the same bits. The grid
    is read from the profiler trace's kernel args."""
    use_backend("cuda")
    try:
        sms = gpu_sms()
        x, r, w, b = bf16_rows(rows or 32 * sms + 37, n, is_rms, residual=res)
        grid0, args0, y0 = profiled_norm(is_rms, x, r, w, b, 0, kernel)  # r: None without a residual
        grid4, args4, y4 = profiled_norm(is_rms, x, r, w, b, 4, kernel)
        block0, block4 = args0["block"][0], args4["block"][0]
        per_sm = per_sm[0 if is_rms else 1]
        assert grid0 == per_sm * sms and per_sm > 2048 // block0
        assert block4 == block0 and grid4 <= (sms - 4) * (2048 // block4)
        assert all(torch.equal(a, c) for a, c in zip(y0, y4))
    finally:
        engine.backend.reset_for_tests()


# Triton forward entries past residency on the H200's table: (norm, width, residual).
TRITON_GRID_CASES = [(True, 1024, False), (False, 8192, True), (True, 65536, False)]


@pytest.mark.skipif(not ON_GPU, reason="the Triton kernels' grids")
@pytest.mark.parametrize("is_rms,n,res", TRITON_GRID_CASES)
def test_triton_grid_sm_margin(is_rms, n, res):
    """Triton's grids past residency and sm_margin (NOTES P165): a forward entry of more programs
    per SM than fit (the plan's programs_per_sm against the bound from the profiler trace's block,
    registers and shared memory: conftest.resident_bound) launches programs_per_sm x SMs at
    sm_margin 0 and no more than fit on SMs - 4 under sm_margin=4, with the same bits; and the
    backward under sm_margin=4 on no more than fit either."""
    from engine.triton_kernels import norms as tn

    use_backend("triton")
    try:
        sms = gpu_sms()
        cfg = tn._fwd_plan(n, BF16, BF16, not is_rms, res, False, False, torch.device(DEVICE), 0, is_rms,
                           False, None)[0]
        x, r, w, b = bf16_rows(cfg.block_m * cfg.programs_per_sm * sms + 37, n, is_rms, residual=res)
        grid0, args0, y0 = profiled_norm(is_rms, x, r, w, b, 0, "_norm_fwd_kernel")
        grid4, args4, y4 = profiled_norm(is_rms, x, r, w, b, 4, "_norm_fwd_kernel")
        bound = resident_bound(args0)
        assert cfg.programs_per_sm > bound, "not past residency: the case tests nothing"
        assert grid0 == cfg.programs_per_sm * sms
        assert args4["block"] == args0["block"] and sms - 4 <= grid4 <= (sms - 4) * resident_bound(args4)
        assert all(torch.equal(a, c) for a, c in zip(y0, y4))
        split = tn.nc.bwd_config(n, BF16, is_rms).split  # one program per SM, a row over G of them
        gridb, argsb, _ = profiled_norm(is_rms, x, r, w, b, 4,
                                        "_norm_bwd_split_kernel" if split else "_norm_bwd_kernel", grad=True)
        assert gridb <= (sms - 4) * (1 if split else resident_bound(argsb))
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8192, 65536])
def test_fwd_blocked_from_taken(is_rms, n):
    """The knob changes the path (the blocked kernel adds a row's values in chunks of up to 16K
    over CTAs sized to the row, at most 512 threads; the register path and the clusters in their
    own orders), over many_rows() rows."""
    check_knob_changes_path(is_rms, n, "norm_fwd_blocked_from", (n, 1 << 30))


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n,res,taken", [
    (1536, True, False), (2048, True, True), (4096, True, True), (8200, True, True),
    (16384, True, True), (16392, True, False), (32768, True, True), (131072, True, True),
    (4096, False, False), (32768, False, False), (65536, False, False)])
def test_fwd_blocked_default(is_rms, n, res, taken):
    """By default (fwd_take_blocked, 16-bit outputs) the fused residual add of a 16-bit x takes the
    blocked kernel at 2K-16K (NOTES P91; 16K, one chunk, since P130) and from 32K where the
    streamed kernel does not take it (here: the stream's knob off; a residual of x's dtype streams
    from just past 16K by default, test_fwd_stream_residual_taken), not at 1536 or 16392 (two
    chunks; the register kernel there with the stream off), and no row without a residual does
    (RMSNorm 32K moved to its 2-CTA cluster when the cluster's exchange became st.async: NOTES
    P53): the same bits as the knob at n where taken, the bits of the knob off elsewhere, which
    differ from the blocked kernel's at these widths over many_rows() rows (at few rows the
    register kernel's layout adds a row in the blocked kernel's order at some of them: P146). An
    FP8 output with a residual keeps the register kernel at 2K-8K and the stream at 16K
    (test_fp8.py::test_fp8_residual_blocked_widths)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        x, r, w, b = bf16_rows(many_rows(), n, is_rms, residual=res)
        outs = {}
        for v in (0, n, 1 << 30):
            with cuda_backend.norm_fwd_blocked_from(v), cuda_backend.norm_fwd_stream_from(1 << 30):
                out, _, mu, rsigma = run_fwd(is_rms, x, w, b, r, 1e-5, False, BF16)
            outs[v] = rsigma if is_rms else torch.cat([mu, rsigma])
        assert not torch.equal(outs[n], outs[1 << 30])
        assert torch.equal(outs[0], outs[n if taken else 1 << 30])
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("n", [8200, 16384, 40008])
def test_fwd_blocked_centred_residual(n):
    """The CUDA blocked kernel's LayerNorm with a bf16 residual on rows whose mean is 0 to ~50
    standard deviations (past ln_one_pass_var's line the centred pass runs), residual_out written
    over x's own memory, with a poisoned output: the statistics against float64, y against the
    kernel's own statistics. 8200 and 16384 are one chunk (288 and 512 threads): z stays in
    registers from pass 1 through the centred pass and pass 2 (NOTES P95); 40008 is three chunks
    of 512 threads (the last partly past the row), read back from residual_out, which is x here.
    Every z = x + r is exact in bf16, so residual_out is compared bit for bit."""
    from engine import cuda_backend

    use_backend("cuda")
    rows, s = 8, 2.0 ** -4
    ks = [0, 7, 9, 50, 120, 245, 3, 200]  # m / s; the rows' std is ~4.9 s
    g = torch.Generator().manual_seed(n)
    jx = torch.randint(-8, 9, (rows, n), generator=g).float()
    jr = torch.randint(-2, 3, (rows, n), generator=g).float()
    x_exact = (torch.tensor(ks, dtype=torch.float32)[:, None] + jx) * s
    x = x_exact.to(BF16).to(DEVICE)
    r = (jr * s).to(BF16).to(DEVICE)
    z = (x_exact + jr * s).to(DEVICE)
    assert torch.equal(x.float(), x_exact.to(DEVICE)) and torch.equal(z.to(BF16).float(), z)
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    b = torch.randn(n, device=DEVICE, dtype=BF16)
    out = poisoned((rows, n), BF16)
    mu, rsigma = poisoned((rows,), F32), poisoned((rows,), F32)
    try:
        with cuda_backend.norm_fwd_blocked_from(1), cuda_backend.norm_fwd_stream_from(1 << 30):
            impl_for(False).norm_fwd(
                x, w, b, r, 1e-5, out, x, mu, rsigma, None, None, None, None, is_rms_norm=False,
                zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0, sm_margin=0)
    finally:
        engine.backend.reset_for_tests()
    torch.testing.assert_close(x.float(), z, rtol=0, atol=0)  # residual_out, over x
    ref = ref_fwd(z.to(BF16), w, b, 1e-5, False)
    torch.testing.assert_close(mu.double(), ref["mu"], **STATS)
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    # y of the kernel's own statistics: on a row of mean ~15 an fp32 mean is off by up to ~1e-5,
    # which moves y by that times rsigma * w, past FWD's atol where y is near 0 (seen at 40008)
    y = (z.double() - mu.double()[:, None]) * rsigma.double()[:, None] * w.double() + b.double()
    torch.testing.assert_close(out.double(), y, **FWD[BF16])


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA backward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("threads", [0, 128, 256])
@pytest.mark.parametrize("n", [1024, 8200, 32768, 32776, 65536, 98312, 131072])
def test_bwd_stream(is_rms, threads, n):
    """The CUDA backward's streamed cluster kernel (norm_bwd_stream_from(1): every width) at CTAs of
    up to 512 (the default), 128 and 256 threads, against float64 with poisoned outputs: bf16 with
    a bias over 301 rows (clusters loop over many rows, the ring of stages wraps), fp16 with an fp32
    gamma, zero-centred, a residual gradient in and an fp32 dres out, rows strided; one row (M=1).
    32776 and 98312 leave the last CTA's slice partly past the row (zero-filled copies, masked
    stores); 1024 runs 2-CTA clusters of 32 threads; where no cluster holds the row at the
    thread cap (131072 at 128 threads) the launcher takes the other paths, which must be right
    too."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_bwd_stream_from(1), cuda_backend.norm_bwd_stream_threads(threads):
            check_bwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms)
            check_bwd(is_rms, 37, n, F16, F32, F16, zcg=True, bias=not is_rms, res_dtype=F32,
                      row_extra=8)
            check_bwd(is_rms, 1, n, BF16, F32, BF16, bias=not is_rms, res_dtype=BF16)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA backward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [4096, 8192, 16384, 32768, 131072])
def test_bwd_stream_taken(is_rms, n):
    """The knob changes the path (the streamed kernel groups a column's rows per cluster, the
    other cluster kernels per cluster of their own shape), over 301 rows; the default takes the
    streamed kernel at these widths, bit for bit."""
    check_bwd_knob_changes_path(is_rms, n, "norm_bwd_stream_from", (n, 1 << 30), same=0)


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("threads", [0, 128, 256])
@pytest.mark.parametrize("n", [1024, 8200, 16384, 32768, 32776, 65536, 98312, 131072, 262144])
def test_fwd_stream(is_rms, threads, n):
    """The CUDA forward's streamed cluster kernel (norm_fwd_stream_from(1): every width) at CTAs
    of up to 512 (the default), 128 and 256 threads (norm_fwd_stream_threads) against
    float64 with poisoned outputs (y, mean, rsigma): bf16 with a bias over 301 rows (clusters loop
    over many rows, the ring of stages wraps), fp16 x with a zero-centred fp32 gamma to fp32,
    rows strided, one row (M=1); the fused residual add of x's dtype (the kRes build, CTAs of at
    most 256 threads: residual_out bit for bit, y and the statistics of the stored z), bf16 over
    301 rows and fp16 strided; with an fp32 residual stream the launcher keeps the other paths,
    which must be right too. 32776 and 98312 leave the last CTA's slice partly past the row
    (zero-filled copies, masked stores and centred sums); 1024 runs 2-CTA clusters of 32 threads;
    262144 needs 16-CTA clusters (a non-portable size, the default limit on the H100 / H200);
    where no cluster holds the row at the thread cap (131072 at 128 threads; 262144 with a
    residual) the launcher takes the other paths."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_fwd_stream_from(1), cuda_backend.norm_fwd_stream_threads(threads):
            check_fwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms)
            check_fwd(is_rms, 37, n, F16, F32, F32, zcg=True, bias=not is_rms, row_extra=8)
            check_fwd(is_rms, 1, n, BF16, F32, BF16, bias=not is_rms)
            check_fwd(is_rms, 301, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
            check_fwd(is_rms, 37, n, F16, F32, F32, zcg=True, bias=not is_rms, res_dtype=F16, row_extra=8)
            check_fwd(is_rms, 5, n, BF16, BF16, BF16, res_dtype=F32)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8192, 16384, 32768, 131072])
@pytest.mark.parametrize("out_dtype", [BF16, torch.float8_e4m3fn], ids=["bf16", "e4m3"])
def test_fwd_stream_residual_taken(is_rms, n, out_dtype):
    """A row with a residual of x's dtype takes the streamed kernel under its knob
    (norm_fwd_stream_from(n)), before the blocked kernel of the residual rows: over 301 rows the
    statistics agree within rounding with the other paths' (the stream's knob off: at 8K the
    blocked kernel for bf16, the register kernel for e4m3; at 16K the blocked kernel for bf16,
    the register kernel for e4m3; the blocked kernel from 32K) but not bit for bit (another order
    of the row sums), while residual_out, the same rounded sum on every path, is equal bit for
    bit. The default takes the stream for these rows from 16K, both norms (fwd_stream_from_default;
    NOTES P89, P90), instead of the register kernel at 16K and the blocked kernel from 64K; at
    32K-64K the blocked kernel (fwd_take_stream; NOTES P96; for an FP8 output since P103), and at
    16K for a bf16 output (one chunk of the blocked kernel, fwd_take_blocked; NOTES P130)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        x, r, w, b = bf16_rows(301, n, is_rms, residual=True)
        runs = []
        for knob in (n, 1 << 30, 0):
            with cuda_backend.norm_fwd_stream_from(knob):
                _, res_out, mu, rsigma = run_fwd(is_rms, x, w, b, r, 1e-5, False, out_dtype)
            runs.append((res_out, rsigma if is_rms else torch.cat([mu, rsigma])))
        (ro_s, st_s), (ro_o, st_o), (ro_d, st_d) = runs
        assert torch.equal(ro_s, residual_sum(x, r)) and torch.equal(ro_o, ro_s) and torch.equal(ro_d, ro_s)
        torch.testing.assert_close(st_s, st_o, rtol=1e-5, atol=1e-6)
        assert not torch.equal(st_s, st_o)
        stream_default = (n >= 16384 and not 32768 <= n < 65536
                          and not (n == 16384 and out_dtype == BF16))
        assert torch.equal(st_d, st_s if stream_default else st_o)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [8192, 16384, 32768, 131072])
@pytest.mark.parametrize("out_dtype", [BF16, torch.float8_e4m3fn])
def test_fwd_stream_taken(is_rms, n, out_dtype):
    """The knob changes the path (the streamed kernel adds a row's values over warps and CTAs in
    its own order), over many_rows() rows, for every output dtype; at these widths the default takes the
    streamed kernel, bit for bit, from 32K (NOTES P101 / P102: LayerNorm's from 16K, its FP8
    outputs' from 8K before), on a card that is not lean (the H200) also RMSNorm's FP8 outputs
    from 16K and LayerNorm's from 8K (NOTES P116), and the path it takes with the stream off
    below (the register path; on a lean card for RMSNorm's FP8 output at 8K-16K the blocked
    kernel: test_fwd_fp8_default_path), and at 32K on a lean card for an FP8 output in delayed
    scaling without a transposed copy, as here (the clusters: NOTES P133). On a card that is not
    lean the FP8 output at the lean FP8 kernel's widths (RMSNorm 8K / 16K, LayerNorm 8K here)
    takes that kernel, neither path (NOTES P181b; test_fwd_fp8_default_path)."""
    from test_fp8 import cuda_lean, fp8_lean_takes

    fp8 = out_dtype != BF16
    stats = knob_stats(is_rms, n, "norm_fwd_stream_from", (n, 1 << 30, 0), out_dtype)
    torch.testing.assert_close(stats[1], stats[0], rtol=1e-5, atol=1e-6)
    assert not torch.equal(stats[1], stats[0])
    stream = n >= 32768 or (fp8 and not cuda_lean() and n >= (16384 if is_rms else 8192))
    if not is_rms and not fp8 and not cuda_lean() and n == 32768:
        stream = False  # the clusters there (NOTES P131; test_fwd_ln_32k_default_path)
    if fp8 and cuda_lean() and n == 32768:
        stream = False  # the clusters there (NOTES P133; test_fwd_fp8_alone_path)
    if not fp8 and n == 32768 and is_rms != cuda_lean():
        return  # the lean kernel's there, neither path's (P154; test_fwd_ln_32k_default_path)
    if fp8 and fp8_lean_takes(is_rms, n, 0, cuda_lean()):
        return  # the lean FP8 kernel's there, neither path's (P181b; test_fwd_fp8_default_path)
    assert torch.equal(stats[2], stats[0] if stream else stats[1])


@pytest.mark.skipif(not ON_GPU, reason="a default path of the CUDA forward")
@pytest.mark.parametrize("is_rms,n", [(False, 32768), (False, 32776), (True, 32768)],
                         ids=["ln-32768", "ln-32776", "rms-32768"])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_fwd_ln_32k_default_path(is_rms, n, dram_class):
    """LayerNorm's bf16 rows of 32K without a residual take the clusters by default on a card that
    is not lean (dram_class 2, the H200: NOTES P131, the clusters 80 % of copy against the stream's
    76-79), RMSNorm's the lean kernel there (NOTES P154: 83.5 against the stream's 81.4), over a
    2-CTA cluster (P155: 85.5), whose bits are the clusters'; on a
    lean card (the H100) LayerNorm's the lean kernel (P154: 87.1 against the stream's 85.2),
    RMSNorm's the streamed kernel; rows past 32K take the stream on both.
    Over 301 rows the default's statistics are that path's bit for bit (the stream: its knob at
    n; the clusters: the stream's knob past every row; the lean kernel: norm_fwd_lean(2)) and
    differ from the others'."""
    from engine import cuda_backend

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    use_backend("cuda")
    try:
        x, _, w, b = bf16_rows(301, n, is_rms)
        stats = {}
        for path, stream_from, lean in (("stream", n, 0), ("clusters", 1 << 30, 0), ("lean", 0, 2),
                                        ("default", 0, 0)):
            with cuda_backend.norm_fwd_stream_from(stream_from), cuda_backend.norm_fwd_lean(lean), \
                    cuda_backend.dram_class(dram_class):
                _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, BF16)
            stats[path] = rsigma if is_rms else torch.cat([mu, rsigma])
    finally:
        engine.backend.reset_for_tests()
    paths = ("stream", "clusters", "lean") if n == 32768 else ("stream", "clusters")
    for i, p in enumerate(paths):
        for q in paths[i + 1:]:
            torch.testing.assert_close(stats[p], stats[q], rtol=1e-5, atol=1e-6)
            assert not torch.equal(stats[p], stats[q]), (p, q)
    want = "stream"
    if n == 32768:
        want = {(True, 2): "clusters", (False, 2): "clusters", (False, 1): "lean"}.get((is_rms, dram_class), want)
    assert torch.equal(stats["default"], stats[want])


# The FP8 output's default kernel without a residual in delayed scaling, by (norm, width) and card
# class (1 lean, the H100; 2 not, the H200): NOTES P100 / P102 / P133 on the H100, P116 on the
# H200; current scaling's statistics pass where it differs (FP8_CURRENT_PATH: P133 is delayed
# scaling's without a transposed copy), the bf16 output's where it is not the register path.
FP8_DEFAULT_PATH = {
    (True, 4096): {1: "blocked", 2: "fp8lean"}, (True, 16384): {1: "blocked", 2: "fp8lean"},
    (True, 16392): {1: "register", 2: "stream"}, (True, 32768): {1: "register", 2: "stream"},
    (False, 8192): {1: "register", 2: "fp8lean"}, (False, 16384): {1: "register", 2: "stream"},
    (False, 32768): {1: "register", 2: "stream"}}
# current scaling where it differs from delayed scaling (the lean FP8 kernel takes delayed only)
FP8_CURRENT_PATH = {(True, 16392, 1): "stream", (True, 32768, 1): "stream",
                    (False, 32768, 1): "stream", (True, 4096, 2): "register", (True, 16384, 2): "stream",
                    (False, 8192, 2): "stream"}
# (RMSNorm 32K on a wide card: the lean kernel over a 2-CTA cluster, P155, whose bits are the register
# path's clusters'.)
BF16_PATH = {(True, 32768, 1): "stream", (True, 32768, 2): "register", (False, 32768, 1): "lean"}


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms,n", list(FP8_DEFAULT_PATH),
                         ids=["rms-4096", "rms-16384", "rms-16392", "rms-32768", "ln-8192", "ln-16384",
                              "ln-32768"])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
@pytest.mark.parametrize("out_dtype,current", [
    (BF16, False), (torch.float8_e4m3fn, False), (torch.float8_e5m2, False),
    (torch.float8_e4m3fn, True)], ids=["bf16", "e4m3", "e5m2", "e4m3-current"])
def test_fwd_fp8_default_path(is_rms, n, dram_class, out_dtype, current):
    """FP8 outputs without a residual take another kernel by default than the other outputs at
    some widths (FP8_DEFAULT_PATH), by card class (engine.cuda_backend.dram_class). On a lean card
    (the H100) RMSNorm's take the blocked kernel at 4K-16K (fwd_take_blocked; NOTES P100 / P102:
    e4m3 8K 87.1 -> 90.4 % of copy), above it to 32K in delayed scaling without a transposed copy
    the register path's clusters (NOTES P133: e4m3 24K 82.2 -> 86.8 against the stream) and
    current scaling's statistics pass the streamed kernel (fwd_take_stream; NOTES P59/P67/P68),
    and LayerNorm's the register path with the other outputs (``register``; NOTES P102: e4m3 8K
    85.9 against the blocked kernel's 83.2, 16K 84.4 against the stream's 76.8), at 32K (where the
    bf16 output takes the stream) delayed scaling the clusters (P133: 77.7 -> 82.7). On
    another card (the H200; NOTES P116: the blocked kernel 10-14 points behind there, the register
    path for LayerNorm 7-10) RMSNorm's keep the register path below 16K and take the stream from
    16K, LayerNorm's the stream from 8K, but in delayed scaling the lean FP8 kernel (``fp8lean``,
    NOTES P181b: RMSNorm 4K-16K, LayerNorm 4K-8K) where it applies. Over many_rows() rows (past
    the few-rows layout of P146),
    the default's statistics of an FP8 output, delayed scaling or current scaling's statistics
    pass, are that kernel's (its knob at n, the
    other one off) bit for bit, those of a bf16 output the register path's (both off; at 32K the
    stream's, but on a wide card LayerNorm's the clusters', P131, and RMSNorm's the lean kernel's
    over a 2-CTA cluster, the clusters' bits, P155, and on a lean card LayerNorm's the lean
    kernel's, P154: BF16_PATH); they differ from the
    other kernels' (the blocked kernel's and the stream's where the register path is the one
    taken)."""
    from engine import cuda_backend

    fp8_path = FP8_DEFAULT_PATH[(is_rms, n)][dram_class]
    if current:
        fp8_path = FP8_CURRENT_PATH.get((is_rms, n, dram_class), fp8_path)
    want = BF16_PATH.get((is_rms, n, dram_class), "register") if out_dtype == BF16 else fp8_path
    if want != "blocked" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    off = 1 << 30
    # (blocked_from, stream_from, norm_fwd_lean, norm_fwd_fp8_lean): the blocked and stream knobs
    # also turn the lean FP8 kernel off
    knobs = {"blocked": (n, off, 0, 0), "stream": (off, n, 0, 0), "register": (off, off, 0, 0),
             "default": (0, 0, 0, 0)}
    if want == "lean":  # the lean kernel (P154), which the other knobs turn off
        knobs["lean"] = (0, 0, 2, 0)
    if want == "fp8lean":  # the lean FP8 kernel (P181b) at every width it fits
        knobs["fp8lean"] = (0, 0, 0, 2)
    use_backend("cuda")
    try:
        x, _, w, b = bf16_rows(many_rows(), n, is_rms)
        stats = {}
        for path, (blocked_from, stream_from, lean, fp8_lean) in knobs.items():
            with cuda_backend.norm_fwd_blocked_from(blocked_from), cuda_backend.norm_fwd_lean(lean), \
                    cuda_backend.norm_fwd_stream_from(stream_from), cuda_backend.dram_class(dram_class), \
                    cuda_backend.norm_fwd_fp8_lean(fp8_lean):
                _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, out_dtype, current)
            stats[path] = rsigma if is_rms else torch.cat([mu, rsigma])
    finally:
        engine.backend.reset_for_tests()
    others = {"register": ("blocked", "stream"), "lean": ("register", "stream"),
              "fp8lean": ("register", "stream")}.get(want, ("register",))
    for other in others:
        torch.testing.assert_close(stats[other], stats[want], rtol=1e-5, atol=1e-6)
        assert not torch.equal(stats[other], stats[want]), other
    assert torch.equal(stats["default"], stats[want])


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms,n", [(True, 16392), (True, 24584), (True, 32768), (False, 32768),
                                      (True, 40960)])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_fwd_fp8_alone_path(is_rms, n, dram_class):
    """Whether a transposed copy of the FP8 output is made chooses the forward's kernel (NOTES
    P133): on a lean card, delayed scaling without the copy takes the register path's clusters
    at RMSNorm 16K-32K and LayerNorm 32K (the stream's rows there lost 2-5 points to them), with
    the copy (asked with out_t_after, the tiled transpose after the norm, or with out_t_auto,
    which takes it past 16K) the streamed kernel (the clusters lost 1-2 there); past 32K, and on a
    wide card, the stream either way. Over 301 rows, each call's statistics are its kernel's bit for
    bit (the stream: its knob at n; the clusters: both knobs off), the two kernels' differ, the
    FP8 bytes are within one step of one another and the copy is the rowwise bytes transposed."""
    from engine import cuda_backend
    from test_fp8 import fp8_steps

    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    off = 1 << 30
    e4m3 = torch.float8_e4m3fn
    use_backend("cuda")
    try:
        x, _, w, b = bf16_rows(301, n, is_rms)
        stats, data = {}, {}
        t_paths = {"alone": {}, "after": {"out_t_after": True}, "auto": {"out_t_auto": True}}
        with cuda_backend.dram_class(dram_class):
            for path, (blocked_from, stream_from) in (("stream", (off, n)), ("clusters", (off, off))):
                with cuda_backend.norm_fwd_blocked_from(blocked_from), \
                        cuda_backend.norm_fwd_stream_from(stream_from):
                    _, _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, e4m3)
                stats[path] = rsigma if is_rms else torch.cat([mu, rsigma])
            for path, t_path in t_paths.items():
                out_t = poisoned((n, 301), e4m3) if t_path else None
                data[path], _, mu, rsigma = run_fwd(is_rms, x, w, b, None, 1e-5, False, e4m3,
                                                    out_t=out_t, **t_path)
                stats[path] = rsigma if is_rms else torch.cat([mu, rsigma])
                if out_t is not None:
                    assert torch.equal(out_t.view(torch.uint8), data[path].view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()
    torch.testing.assert_close(stats["clusters"], stats["stream"], rtol=1e-5, atol=1e-6)
    assert not torch.equal(stats["clusters"], stats["stream"])
    alone = "clusters" if dram_class == 1 and n <= 32768 else "stream"
    assert torch.equal(stats["alone"], stats[alone])
    assert torch.equal(stats["after"], stats["stream"])
    assert torch.equal(stats["auto"], stats["stream"])
    assert torch.equal(data["after"].view(torch.uint8), data["auto"].view(torch.uint8))
    steps = fp8_steps(data["alone"], data["after"])
    assert steps.max().item() <= 1


@pytest.mark.skipif(not ON_GPU, reason="a grid knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [1024, 2056, 8192, 16384])
def test_fwd_grid_per_sm(is_rms, n):
    """The CUDA forward's register path at 1, 3, 16 and 64 CTAs per SM (norm_fwd_grid_per_sm;
    more than fit an SM queue for the block scheduler) against float64 with poisoned outputs over
    3001 rows, so that CTAs loop over many row blocks and the grid's last CTAs get fewer; and bit
    for bit against the default grid: the grid must change no row's arithmetic (y, statistics,
    residual_out; the FP8 output and amax: test_fp8.py::test_fp8_grid_per_sm). The blocked and
    streamed kernels are off: by default a bf16 residual takes the blocked kernel at 2K-16K (NOTES
    P91, P130) and the stream past 16K (P90), so that every width here runs the register path."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        with cuda_backend.norm_fwd_blocked_from(1 << 30), cuda_backend.norm_fwd_stream_from(1 << 30):
            x, r, w, b = bf16_rows(3001, n, is_rms, residual=True)
            ref = run_fwd(is_rms, x, w, b, r, 1e-5, False, BF16)
            for v in (1, 3, 16, 64):
                with cuda_backend.norm_fwd_grid_per_sm(v):
                    check_fwd(is_rms, 3001, n, BF16, BF16, BF16, bias=not is_rms, res_dtype=BF16)
                    got = run_fwd(is_rms, x, w, b, r, 1e-5, False, BF16)
                for a, e in zip(got, ref):
                    if e is not None:
                        assert torch.equal(a, e), v
    finally:
        engine.backend.reset_for_tests()


def test_layernorm_large_mean(backend):
    """Rows of 1e4 + unit noise in fp32: the variance must come from centred values.

    The same data through E[x^2] - E[x]^2 in fp32 misses the variance by far; checked here so that
    this test would catch that formula.
    """
    from tolerances import LARGE_MEAN_FP32

    # CUDA: 3571 / 17389 the blocked kernel; 4096 fp32 a row over 8 warps of one CTA; 8192 / 24584
    # fp32 clusters of 2 / 8 CTAs (each CTA centred on its own mean, CTAs merged by Chan)
    for n in (3571, 4096, 8192, 17389, 24584):
        m = 4
        x = rows_with_stride(m, n, F32, offset=1e4)
        w = torch.randn(n, device=DEVICE)
        out, _, mu, rsigma = run_fwd(False, x, w, None, None, 1e-5, False, F32)
        ref = ref_fwd(x, w, None, 1e-5, False)
        torch.testing.assert_close(out.double(), ref["y"], **LARGE_MEAN_FP32)
        torch.testing.assert_close(rsigma.double(), ref["rsigma"], rtol=1e-3, atol=0)
        naive_var = (x * x).mean(1) - x.mean(1) ** 2
        naive_rsigma = torch.rsqrt(naive_var.clamp_min(0) + 1e-5).double()
        assert not torch.allclose(naive_rsigma, ref["rsigma"], rtol=1e-3, atol=0)


@pytest.mark.parametrize("n", [1024, 4100, 16392, 32776])
def test_layernorm_mean_against_spread(backend, n):
    """LayerNorm statistics of bf16 rows whose mean is 0 to ~50 standard deviations, within STATS
    of the float64 oracle at every ratio.

    The CUDA and Triton kernels sum z and z^2 in one pass and take var = E[z^2] - mean^2 only
    where mean^2 <= 3 var (a row in the register and blocked kernels, a warp in the streamed one:
    ln_one_pass_var / ln_one_pass_m2, _ln_one_pass; NOTES P80, P83); past that line the centred
    pass runs. The ratios sit on both sides of it (1.4, 1.6
    under sqrt(3), 1.8 over) and far past it, where the one-pass formula alone misses rsigma (checked
    below). Rows are m + s * j with j uniform in -8..8: every value exact in bf16, std 4.9 s. n:
    the register kernel (1024, 4100) and the streamed one (16392, 32776: the last CTA's slice
    partly past the row).
    """
    rows = 8
    s = 2.0 ** -4
    ks = [0, 7, 8, 9, 15, 50, 120, 245]  # m / s: ratio m / std = k / 4.9
    # the same rows on every device (drawn on the CPU), so that the check of the one-pass formula
    # below holds for the data every backend sees
    g = torch.Generator().manual_seed(n)
    j = torch.randint(-8, 9, (rows, n), generator=g).float()
    exact = (torch.tensor(ks, dtype=torch.float32)[:, None] + j) * s
    x = exact.to(BF16).to(DEVICE)
    assert torch.equal(x.float().cpu(), exact)  # every value exact in bf16
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    b = torch.randn(n, device=DEVICE, dtype=BF16)
    out, _, mu, rsigma = run_fwd(False, x, w, b, None, 1e-5, False, F32)
    ref = ref_fwd(x, w, b, 1e-5, False)
    torch.testing.assert_close(mu.double(), ref["mu"], **STATS)
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    torch.testing.assert_close(out.double(), ref["y"], **FWD[F32])
    # the rows past the line need the centred pass: sum z and sum z^2 alone (fp32, one pass
    # per row as a kernel thread adds them) miss rsigma there
    one_pass = torch.zeros(rows), torch.zeros(rows)
    for c in range(0, n, 64):  # sequential fp32 sums of 64-column slices
        blk = exact[:, c:c + 64]
        one_pass = one_pass[0] + blk.sum(1), one_pass[1] + (blk * blk).sum(1)
    var = (one_pass[1] - one_pass[0] * one_pass[0] / n) / n
    naive = torch.rsqrt(var.clamp_min(0) + 1e-5).double()
    assert not torch.allclose(naive[-3:], ref["rsigma"][-3:].cpu(), **STATS)


@pytest.mark.parametrize("x_dtype, n", [(F32, 1024), (F32, 4098), (BF16, 1024), (BF16, 4096),
                                        (BF16, 4100), (BF16, 16392)])
def test_layernorm_y_of_own_stats(backend, x_dtype, n):
    """y against the kernel's own mean and rsigma, (x - mu) * rsigma * w + b in float64, within
    fp32 rounding, on rows whose |mu| * rsigma runs from 0 to ~3300.

    CUDA's LayerNorm epilogue takes t = fma(x, rsigma, c), c = -mu * rsigma, where |c| <= 4 and
    (x - mu) * rsigma elsewhere (ln_fma_row; NOTES P87; Triton the latter). c's rounding adds up to
    2^-24 |c| to t, so the FMA form taken past that line would miss the bound below on the rows of
    a large mean (fp32 x: |c| up to ~3300; by 2-218x, checked with the guard removed), which the
    exact form meets (x - mu exact, two roundings). Rows are m + s * j with j uniform in -8..8
    (exact in x's dtype, std 4.9 s), |c| ~ k / 4.9 on both sides of 4 (k = 19 / 21). CUDA paths:
    the register kernel (1024; 4096, a row over two warps), the blocked kernel (4098 fp32, 4100
    bf16: no 16-byte vectors), the streamed one (16392, its fp32 output)."""
    rows = 8
    s = 2.0 ** -4
    ks = [0, 5, 19, 21, 3000, 9000, 16000, 16384] if x_dtype == F32 else [0, 5, 19, 21, 60, 120,
                                                                           200, 245]
    g = torch.Generator().manual_seed(n + 1)
    j = torch.randint(-8, 9, (rows, n), generator=g).float()
    exact = (torch.tensor(ks, dtype=torch.float32)[:, None] + j) * s
    x = exact.to(x_dtype).to(DEVICE)
    assert torch.equal(x.float().cpu(), exact)
    w = torch.randn(n, device=DEVICE, dtype=x_dtype)
    b = torch.randn(n, device=DEVICE, dtype=x_dtype)
    out, _, mu, rsigma = run_fwd(False, x, w, b, None, 1e-5, False, F32)
    t = (x.double() - mu.double()[:, None]) * rsigma.double()[:, None]
    y = t * w.double() + b.double()
    bound = w.double().abs() * (2.0 ** -23 * t.abs() + 2.0 ** -21) + 2.0 ** -23 * y.abs()
    err = (out.double() - y).abs()
    assert bool((err <= bound).all()), (
        f"rows {sorted(set(torch.nonzero(err > bound)[:, 0].tolist()))} off their own statistics "
        f"by up to {(err / bound).max().item():.3g} x the bound")


@pytest.mark.skipif(not ON_GPU, reason="a path of the CUDA forward")
@pytest.mark.parametrize("n", [8200, 32776])
def test_layernorm_stream_large_mean(n):
    """The streamed LayerNorm forward's statistics (each warp's sum and centred sum of squares,
    merged by Chan's formula) on bf16 rows of 32768 + 256 * {-1, 0, 1}: a mean of 2**15 against a
    standard deviation of ~209. E[x^2] - E[x]^2 in fp32 misses rsigma here by ~2e-3 (checked
    below, with torch's pairwise sums); the stream must be within 1e-4. 8200 / 32776 leave the
    last CTA's slice partly past the row (warps with fewer values in the merge)."""
    from engine import cuda_backend
    from tolerances import LARGE_MEAN_FP32

    use_backend("cuda")
    try:
        j = torch.randint(-1, 2, (64, n), device=DEVICE).float()
        x = (32768.0 + 256.0 * j).to(BF16)
        w = torch.randn(n, device=DEVICE, dtype=BF16)
        b = torch.randn(n, device=DEVICE, dtype=BF16)
        with cuda_backend.norm_fwd_stream_from(1):
            out, _, mu, rsigma = run_fwd(False, x, w, b, None, 1e-5, False, F32)
        ref = ref_fwd(x, w, b, 1e-5, False)
        torch.testing.assert_close(mu.double(), ref["mu"], **STATS)
        torch.testing.assert_close(rsigma.double(), ref["rsigma"], rtol=1e-4, atol=0)
        # y's error is the fp32 mean's rounding (ulp 2**-8 at 2**15) times rsigma, as for every
        # backend: test_layernorm_large_mean's tolerance
        torch.testing.assert_close(out.double(), ref["y"], **LARGE_MEAN_FP32)
        xf = x.float()
        naive = torch.rsqrt(((xf * xf).mean(1) - xf.mean(1) ** 2).clamp_min(0) + 1e-5).double()
        assert not torch.allclose(naive, ref["rsigma"], rtol=1e-4, atol=0)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path of the CUDA forward")
@pytest.mark.parametrize("threads", [0, 128])
@pytest.mark.parametrize("n", [8200, 32776, 65536])
def test_layernorm_stream_warp_means_apart(n, threads):
    """The streamed LayerNorm forward's merge of the warps' statistics (pair_xchg_gather_chan:
    Chan's formula in one round about warp 0's mean where D^2 / N <= 3/4 B, else a second round
    about the row's mean; NOTES P118) on bf16 rows whose warps' means lie far apart: N(0, 1) noise
    plus an offset of 1000 on the first or the last f of the row, f from 1/64 to 1/2, and a row of
    noise alone. An offset at the start puts warp 0's mean (the one-round reference) far from the
    row's, one at the end near it; which rows take the second round depends on how the row falls
    over the CTAs and warps (both rounds are exercised, not observed). Statistics within STATS of
    float64, y within fp32 rounding; 128-thread CTAs put 4 warps per CTA into the exchange (its
    compact entries, rank * W + warp)."""
    from engine import cuda_backend

    use_backend("cuda")
    fracs = [1 / 64, 1 / 16, 1 / 4, 1 / 2]
    x = torch.randn(2 * len(fracs) + 1, n, device=DEVICE)
    for i, f in enumerate(fracs):
        k = max(8, int(n * f))
        x[2 * i, :k] += 1000.0
        x[2 * i + 1, n - k:] += 1000.0
    x = x.to(BF16)
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    b = torch.randn(n, device=DEVICE, dtype=BF16)
    try:
        with cuda_backend.norm_fwd_stream_from(1), cuda_backend.norm_fwd_stream_threads(threads):
            out, _, mu, rsigma = run_fwd(False, x, w, b, None, 1e-5, False, F32)
        ref = ref_fwd(x, w, b, 1e-5, False)
        torch.testing.assert_close(mu.double(), ref["mu"], **STATS)
        torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
        torch.testing.assert_close(out.double(), ref["y"], **FWD[F32])
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", NORMS)
def test_zero_rows(backend, is_rms):
    """M = 0 is a valid empty call: nothing written, dweight/dbias zero."""
    n = 33
    x = torch.empty(0, n, device=DEVICE, dtype=BF16)
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    run_fwd(is_rms, x, w, None, None, 1e-5, False, BF16)
    dx, _, dw, db = run_bwd(is_rms, x, x, None if is_rms else torch.empty(0, device=DEVICE),
                            torch.empty(0, device=DEVICE), w, None, not is_rms, False, BF16, None)
    assert dx.shape == (0, n) and torch.equal(dw, torch.zeros_like(dw))
    if db is not None:
        assert torch.equal(db, torch.zeros_like(db))


@pytest.mark.parametrize("is_rms", NORMS)
def test_row_stride_zero_dy(backend, is_rms):
    """An expanded gradient (row stride 0, as autograd hands out for a sum) is read in place."""
    m, n = 5, 40
    x, w, b, z, mu, rsigma = check_fwd(is_rms, m, n, F32, F32, F32)
    dy = torch.randn(1, n, device=DEVICE).expand(m, n)
    assert dy.stride(0) == 0
    dx, _, dw, _ = run_bwd(is_rms, dy, z, mu, rsigma, w, None, False, False, F32, None)
    ref = ref_bwd(dy.contiguous(), z, w, None, 1e-5, is_rms)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[F32])


@pytest.mark.skipif(not ON_GPU, reason="large shapes need the GPU")
@pytest.mark.parametrize("is_rms", NORMS)
def test_gpu_large(backend, is_rms):
    """Large shapes on the GPU: M*N > 2**31 elements needs 64-bit offsets; a big register-path case."""
    check_bwd(is_rms, 8192, 4096, BF16, BF16, BF16, bias=not is_rms)
    m, n = 131072 + 3, 16384  # 2**31 + 49152 elements
    x = torch.randn(m, n, device=DEVICE, dtype=BF16)
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    out, _, mu, rsigma = run_fwd(is_rms, x, w, None, None, 1e-5, False, BF16)
    tail = slice(m - 70, m)
    ref = ref_fwd(x[tail], w, None, 1e-5, is_rms)
    torch.testing.assert_close(out[tail].double(), ref["y"], **FWD[BF16])
    torch.testing.assert_close(rsigma[tail].double(), ref["rsigma"], **STATS)
    assert not torch.isnan(out).any()


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("x_dtype,res_dtype", [(BF16, BF16), (F32, F32), (BF16, F32)])
@pytest.mark.parametrize("block_m", [1, 2])
@pytest.mark.parametrize("block_n", [128, 512])
def test_triton_blocked_residual(is_rms, x_dtype, res_dtype, block_m, block_n):
    """Triton's blocked forward with a residual under an explicit config: 5 rows of 300 in chunks of
    128 (two whole chunks and a masked tail) or one chunk of 512; with 2-row tiles the last tile
    half past M. Pass 1 stores residual_out; over several chunks pass 2, LayerNorm's centred pass
    (rows of mean 3 against a spread of about 1.4: past _ln_one_pass's line) and current scaling's
    amax pass read it back instead of x and the residual (norms._reload_z, NOTES P92), over one
    chunk they re-read x and the residual. Against float64 with poisoned outputs: residual_out bit
    for bit, y and the statistics; current scaling's amax, scale and bytes (at most one FP8 step
    from the oracle's cast, the output pass normalising residual_out)."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc
    from reference import fp8_quantize
    from test_fp8 import fp8_steps

    use_backend("triton")
    try:
        m, n = 5, 300
        cfg = nc.NormConfig(block_m, block_n, True, 4, 1)
        assert norms._reload_res(cfg, n, True) == (block_n < n)
        x = rows_with_stride(m, n, x_dtype, offset=0.0 if is_rms else 3.0)
        r = rows_with_stride(m, n, res_dtype)
        w = (torch.randn(n, device=DEVICE) * 0.5 + 1.0).to(x_dtype)
        b = None if is_rms else torch.randn(n, device=DEVICE).to(x_dtype)
        z = residual_sum(x, r)
        ref = ref_fwd(z, w, b, 1e-5, is_rms)
        for out_dtype in (F32, torch.float8_e4m3fn):
            fp8 = out_dtype != F32
            out = poisoned((m, n), out_dtype)
            res_out = poisoned((m, n), res_dtype)
            mu = poisoned((m,), F32) if not is_rms else None
            rsigma = poisoned((m,), F32)
            scale = torch.ones(1, device=DEVICE) if fp8 else None
            amax = torch.zeros(1, device=DEVICE) if fp8 else None
            scale_inv = poisoned((1,), F32) if fp8 else None
            norms.launch_fwd(x, w, b, r, 1e-5, out, res_out, mu, rsigma, scale, amax, scale_inv, None,
                             is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=fp8,
                             amax_epsilon=0.0, sm_margin=0, config=cfg)
            assert torch.equal(res_out, z)
            assert_stats(mu, rsigma, ref, is_rms)
            if not fp8:
                torch.testing.assert_close(out.double(), ref["y"], **FWD[F32])
                continue
            ref_amax = ref["y"].abs().max().item()
            assert amax.item() == pytest.approx(ref_amax, rel=1e-4)
            assert scale.item() == pytest.approx(torch.finfo(out_dtype).max / ref_amax, rel=1e-4)
            assert fp8_steps(out, fp8_quantize(ref["y"], scale.item(), out_dtype)).max().item() <= 1
        if x_dtype == res_dtype and norms._reload_res(cfg, n, True):
            # residual_out over x itself: what pass 2 reads is then only in residual_out (x + r
            # re-read there would add r twice); a white-box check of the read, not an API use
            xz = x.clone()
            out = poisoned((m, n), F32)
            mu = poisoned((m,), F32) if not is_rms else None
            rsigma = poisoned((m,), F32)
            norms.launch_fwd(xz, w, b, r, 1e-5, out, xz, mu, rsigma, None, None, None, None,
                             is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=False,
                             amax_epsilon=0.0, sm_margin=0, config=cfg)
            assert torch.equal(xz, z)
            torch.testing.assert_close(out.double(), ref["y"], **FWD[F32])
    finally:
        engine.backend.reset_for_tests()


def _triton_fwd_checked(x, w, b, ref, out_dtype, is_rms, cfg=None, current=False):
    """Triton's forward (``norms.launch_fwd`` with ``cfg``, or ``norm_fwd``'s defaults where None)
    into poisoned outputs, checked against the float64 ``ref``: rsigma; for an FP8 output (delayed
    scale 64, or current scaling) the amax, the scale and the bytes within one FP8 step, else y.
    Returns (the output's bytes or values, rsigma, amax or None)."""
    from engine.triton_kernels import norms
    from reference import fp8_quantize
    from test_fp8 import fp8_steps

    m, n = x.shape
    fp8 = out_dtype in (torch.float8_e4m3fn, torch.float8_e5m2)
    out = poisoned((m, n), out_dtype)
    mu = poisoned((m,), F32) if not is_rms else None
    rsigma = poisoned((m,), F32)
    scale = torch.full((1,), 64.0, device=DEVICE) if fp8 else None
    amax = torch.zeros(1, device=DEVICE) if fp8 else None
    scale_inv = poisoned((1,), F32) if fp8 else None
    kw = dict(is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=current, amax_epsilon=0.0,
              sm_margin=0)
    if cfg is None:
        norms.norm_fwd(x, w, b, None, 1e-5, out, None, mu, rsigma, scale, amax, scale_inv, None, **kw)
    else:
        norms.launch_fwd(x, w, b, None, 1e-5, out, None, mu, rsigma, scale, amax, scale_inv, None,
                         config=cfg, **kw)
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    if not fp8:
        torch.testing.assert_close(out.double(), ref["y"], **FWD[out_dtype])
        return out, rsigma, None
    ref_amax = ref["y"].abs().max().item()
    assert amax.item() == pytest.approx(ref_amax, rel=1e-4)
    assert scale.item() == pytest.approx(448.0 / ref_amax if current else 64.0, rel=1e-4)
    assert scale_inv.item() == pytest.approx(1 / scale.item(), rel=1e-6)
    assert fp8_steps(out, fp8_quantize(ref["y"], scale.item(), out_dtype)).max().item() <= 1
    return out.view(torch.uint8), rsigma, amax


@pytest.mark.parametrize("is_rms", [True, False])
@pytest.mark.parametrize("block_m", [1, 2])
def test_triton_blocked_pass2_order(is_rms, block_m):
    """Triton's blocked forward walks pass 2 from the last column chunk to the first for an FP8
    output on rows of more than two chunks (norms._pass2_reverse, NOTES P112), in column order
    otherwise and with norms.PASS2_REVERSE off: 5 rows of 300 in chunks of 128 (three chunks, the
    masked tail first in the reverse order), 1- and 2-row tiles. Both orders give the same bytes
    (each chunk's output depends on its own columns and the row's statistics only), against
    float64 with poisoned outputs, for an fp32 output (column order either way) and an e4m3 one
    (amax and the bytes within one FP8 step)."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    use_backend("triton")
    saved = norms.PASS2_REVERSE
    try:
        m, n = 5, 300
        cfg = nc.NormConfig(block_m, 128, True, 4, 1)
        x = rows_with_stride(m, n, BF16, offset=0.0 if is_rms else 3.0)
        w = (torch.randn(n, device=DEVICE) * 0.5 + 1.0).to(BF16)
        b = None if is_rms else torch.randn(n, device=DEVICE).to(BF16)
        ref = ref_fwd(x, w, b, 1e-5, is_rms)
        one_chunk = nc.NormConfig(block_m, 512, True, 4, 1)
        for out_dtype in (F32, torch.float8_e4m3fn):
            fp8 = out_dtype != F32
            got = {}
            for rev in (True, False):
                norms.PASS2_REVERSE = rev
                plan = norms._fwd_plan(n, BF16, out_dtype, b is not None, False, False, False, x.device,
                                       0, is_rms, False, cfg)
                rev_at = norms._FWD._constexpr_names.index("REV")
                assert plan[2][0][rev_at] is (rev and fp8)
                for few in (one_chunk, nc.NormConfig(block_m, 256, True, 4, 1)):  # 1 / 2 chunks
                    plan1 = norms._fwd_plan(n, BF16, out_dtype, b is not None, False, False, False,
                                            x.device, 0, is_rms, False, few)
                    assert plan1[2][0][rev_at] is False
                got[rev] = _triton_fwd_checked(x, w, b, ref, out_dtype, is_rms, cfg)[0]
            assert torch.equal(got[True], got[False])
    finally:
        norms.PASS2_REVERSE = saved
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", [True, False])
def test_triton_fwd_prefetch(is_rms):
    """With norms.FWD_PREFETCH the register forward loads the next tile's x before this tile's
    reductions (norms._prefetch, NOTES P175): only on the register path without a residual or
    bands, and with the same bytes as without it. 11 rows of 300 in tiles of 2 rows (6 tiles:
    programs walk 2 of them, the prefetch past the last tile masked off) and 8 rows of 256 in
    tiles of one row (unmasked columns where the plan takes them), fp32 and e4m3 outputs,
    delayed and current scaling (the apply pass reads its statistics), against float64 into
    poisoned outputs."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    use_backend("triton")
    saved = norms.FWD_PREFETCH
    at = norms._FWD._constexpr_names.index("PREFETCH")
    try:
        for m, n, cfg in ((11, 300, nc.NormConfig(2, 512, False, 4, 1)),
                          (8, 256, nc.NormConfig(1, 256, False, 2, 1))):
            x = rows_with_stride(m, n, BF16, offset=0.0 if is_rms else 3.0)
            w = (torch.randn(n, device=DEVICE) * 0.5 + 1.0).to(BF16)
            b = None if is_rms else torch.randn(n, device=DEVICE).to(BF16)
            ref = ref_fwd(x, w, b, 1e-5, is_rms)
            for out_dtype, current in ((F32, False), (torch.float8_e4m3fn, False),
                                       (torch.float8_e4m3fn, True)):
                got = {}
                for pre in (True, False):
                    norms.FWD_PREFETCH = pre
                    plan = norms._fwd_plan(n, BF16, out_dtype, b is not None, False, False, current,
                                           x.device, 0, is_rms, False, cfg)
                    assert all(p[at] is pre for p in plan[2])
                    for other in ((nc.NormConfig(2, 128, True, 4, 1), False),  # blocked
                                  (cfg, True)):  # a residual
                        p2 = norms._fwd_plan(n, BF16, out_dtype, b is not None, other[1], False, False,
                                             x.device, 0, is_rms, False, other[0])
                        assert p2[2][0][at] is False
                    got[pre] = _triton_fwd_checked(x, w, b, ref, out_dtype, is_rms, cfg, current)
                for a, b_ in zip(got[True], got[False]):
                    assert a is None or torch.equal(a, b_)
    finally:
        norms.FWD_PREFETCH = saved
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms,fp8,n", [(True, True, 16381), (False, True, 2045), (False, True, 4093),
                                          (False, True, 8189), (False, True, 16381), (False, False, 16381)])
def test_triton_fwd_prefetch_entries(is_rms, fp8, n):
    """The launcher's prefetch entries (norms_common._FWD_PREFETCH_OVERRIDES, NOTES P175) at the
    widths they serve (ragged: masked columns, and 7 rows over more tiles than the interpreter's
    programs): the plan takes the entry with PREFETCH on, the residual form keeps its own entry
    with it off, and the output matches float64 into poisoned outputs."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    use_backend("triton")
    at = norms._FWD._constexpr_names.index("PREFETCH")
    out_dtype = torch.float8_e4m3fn if fp8 else BF16
    try:
        cfg = nc.fwd_config(n, BF16, False, fp8, is_rms, False, False)
        assert cfg.prefetch and cfg == nc._FWD_PREFETCH_OVERRIDES[(is_rms, fp8)][1 << (n - 1).bit_length()]
        res_cfg = nc.fwd_config(n, BF16, False, fp8, is_rms, True, False)
        assert not res_cfg.prefetch
        plan = norms._fwd_plan(n, BF16, out_dtype, not is_rms, False, False, False, torch.device(DEVICE),
                               0, is_rms, False, None)
        assert plan[0] == cfg and plan[2][0][at] is True
        plan_res = norms._fwd_plan(n, BF16, out_dtype, not is_rms, True, False, False,
                                   torch.device(DEVICE), 0, is_rms, False, None)
        assert plan_res[2][0][at] is False
        m = 7
        x = rows_with_stride(m, n, BF16, offset=0.0 if is_rms else 3.0)
        w = (torch.randn(n, device=DEVICE) * 0.5 + 1.0).to(BF16)
        b = None if is_rms else torch.randn(n, device=DEVICE).to(BF16)
        _triton_fwd_checked(x, w, b, ref_fwd(x, w, b, 1e-5, is_rms), out_dtype, is_rms)
    finally:
        engine.backend.reset_for_tests()


def test_unmasked_tiles_only_where_every_tile_is_inside():
    """Triton's forward drops its masks (EVEN) only for one-row tiles over whole column tiles, and
    only for LayerNorm without a residual (norms._lean): a wrong EVEN reads and writes outside
    the rows, which the poisoned-output tests below would catch only at their shapes."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    one_row = nc.NormConfig(1, 2048, True, 2, 16)
    assert norms._even(one_row, 4096, False)
    assert not norms._even(one_row, 4096 + 16, False)  # a partial last chunk
    assert not norms._even(one_row, 4096, True)  # the in-kernel transposed store
    assert not norms._even(nc.NormConfig(2, 2048, True, 2, 16), 4096, False)  # a row tile past M
    assert norms._even(nc.NormConfig(1, 4096, False, 8, 2), 4096, False)  # register path, N = tile
    assert not norms._even(nc.NormConfig(1, 8192, False, 8, 2), 5120, False)
    assert norms._lean(False, False)
    assert not norms._lean(True, False) and not norms._lean(False, True)


@pytest.mark.parametrize("n, out_dtype", [
    # (1K-8K take 2-row prefetch tiles since NOTES P175 / Q71: masked, not this path)
    pytest.param(16384, torch.float8_e4m3fn, id="16384-e4m3"),  # register path, one row per tile
    pytest.param(32768, torch.float8_e4m3fn, id="32768-e4m3"),  # blocked, two chunks
    pytest.param(65536, torch.float8_e4m3fn, id="65536-e4m3"),  # blocked, four chunks
    pytest.param(32768, BF16, id="32768-bf16"),
    pytest.param(32768, F32, id="32768-f32"),
])
def test_layernorm_unmasked_tiles(backend, n, out_dtype):
    """LayerNorm rows whose Triton forward runs unmasked (EVEN: one-row tiles, N a multiple of the
    column tile) with bf16 loads converted by bit shifts, into poisoned outputs, against the
    float64 oracle; M odd. On the other backends the same contract."""
    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    fp8 = out_dtype == torch.float8_e4m3fn
    if backend == "triton":
        cfg = nc.fwd_config(n, BF16, False, fp8, False, False)
        assert norms._even(cfg, n, False), (n, cfg)  # the path this test is for
    m = 3
    x = rows_with_stride(m, n, BF16, offset=3.0)
    w = torch.randn(n, device=DEVICE).to(BF16)
    b = torch.randn(n, device=DEVICE).to(BF16)
    ref = ref_fwd(x, w, b, 1e-5, False, False)
    if not fp8:
        out, _, mu, rsigma = run_fwd(False, x, w, b, None, 1e-5, False, out_dtype)
        torch.testing.assert_close(out.double(), ref["y"], **FWD[out_dtype])
    else:
        out = poisoned((m, n), out_dtype)
        mu, rsigma = poisoned((m,), F32), poisoned((m,), F32)
        scale = torch.full((1,), 4.0, device=DEVICE)
        amax, scale_inv = torch.zeros(1, device=DEVICE), poisoned((1,), F32)
        impl_for(False).norm_fwd(
            x, w, b, None, 1e-5, out, None, mu, rsigma, scale, amax, scale_inv, None,
            is_rms_norm=False, zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0,
            sm_margin=0)
        from reference import fp8_quantize
        from test_fp8 import fp8_steps

        # the float64 oracle's cast: at most one FP8 step (y is fp32 in the kernel), and rarely
        steps = fp8_steps(out, fp8_quantize(ref["y"], 4.0, out_dtype))
        assert steps.max().item() <= 1
        assert (steps > 0).float().mean().item() < 0.01
        assert amax.item() == pytest.approx(ref["y"].abs().max().item(), rel=1e-5)
        assert scale_inv.item() == 0.25
    torch.testing.assert_close(rsigma.double(), ref["rsigma"], **STATS)
    torch.testing.assert_close(mu.double(), ref["mu"], **STATS)


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("cfg", [
    pytest.param((2, 256, False, F32, 300, False), id="register-2-rows-masked-tail"),  # 256 + 64, 44 used
    pytest.param((1, 256, False, F32, 320, True), id="register-1-row-even-tail"),  # 256 + 64: no masks
    pytest.param((1, 256, False, BF16, 384, False), id="register-1-row-even-tail-128"),  # 256 + 128
    pytest.param((4, 128, False, F32, 200, True), id="register-4-rows-masked-tail"),  # 128 + 128, 72 used
    pytest.param((2, 256, True, F32, 300, True), id="blocked-2-rows-masked-tail"),
    pytest.param((1, 256, True, BF16, 320, False), id="blocked-1-row-even-tail-bf16-gamma"),  # RELOAD_G
    pytest.param((1, 256, True, F32, 300, True), id="blocked-1-row-masked-tail"),
])
def test_triton_backward_head_and_tail(is_rms, cfg):
    """The Triton backward's tail tile (NormConfig.tail): a head of ``block_n`` columns, as a
    register tile or the blocked path's one chunk, and a tail tile of the next power of two of the
    rest (norms._tail_n), against the float64 oracle, with M = 37 (several row tiles per program,
    the last part-empty for 2 and 4 rows), bias, zero-centred gamma, and the residual's gradient
    added (dresidual) and stored again in its own dtype (dres) on half the cases. A 16-bit gamma
    on one-row blocked tiles takes LayerNorm's gamma re-read per pass (RELOAD_G)."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels.norms_common import NormConfig

    use_backend("triton")
    bm, bn, blocked, w_dtype, n, with_res = cfg
    config = NormConfig(bm, bn, blocked, 4, 2, tail=True)
    assert nm._tail_n(config, n) == {300: 64, 320: 64, 384: 128, 200: 128}[n]
    m, eps = 37, 1e-5
    x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    w = (torch.randn(n, device=DEVICE) * 0.5).to(w_dtype)
    b = None if is_rms else torch.randn(n, device=DEVICE).to(w_dtype)
    dy = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    dres_in = torch.randn(m, n, device=DEVICE).to(torch.bfloat16) if with_res else None
    ref_f = ref_fwd(x, w, b, eps, is_rms, True)
    mu = None if is_rms else ref_f["mu"].float()
    rsigma = ref_f["rsigma"].float()
    dx = poisoned((m, n), torch.bfloat16)
    dres = poisoned((m, n), F32) if with_res else None
    dw = poisoned((n,), F32)
    db = None if is_rms else poisoned((n,), F32)
    nm.launch_bwd(dy, x, mu, rsigma, w, dres_in, dx, dres, dw, db, is_rms_norm=is_rms, zero_centered_gamma=True,
                  sm_margin=0, config=config)
    ref = ref_bwd(dy, x, w, b, eps, is_rms, True, dres_in)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[torch.bfloat16])
    if with_res:
        torch.testing.assert_close(dres.double(), ref["dx"], **BWD[F32])
    assert rel_err(dw, ref["dweight"]) < REDUCTION[F32]
    if b is not None:
        assert rel_err(db, ref["dbias"]) < REDUCTION[F32]


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("m", [1, 3, 37, 64])
@pytest.mark.parametrize("cfg", [
    pytest.param((2, 512, False, 300), id="register-2-rows"),
    pytest.param((4, 128, False, 200, True), id="register-4-rows-tail"),
    pytest.param((2, 128, True, 300), id="blocked-2-rows-3-chunks"),
    pytest.param((4, 512, True, 300), id="blocked-4-rows-one-chunk"),
])
def test_triton_backward_row_phases(is_rms, m, cfg, monkeypatch):
    """BWD_ROW_PHASES: tiles of several rows run the whole tiles with their rows unmasked, then the
    last, part-empty tile (M = 1 and 3: no whole tile on some programs; 37: a remainder; 64: none).
    Each program meets its tiles in the order it did with every tile masked, so dx, dW and dB are
    bit for bit those of BWD_ROW_PHASES = False, and within the float64 oracle's tolerances."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels.norms_common import NormConfig

    use_backend("triton")
    bm, bn, blocked, n, *tail = cfg
    config = NormConfig(bm, bn, blocked, 4, 2, tail=bool(tail))
    x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    w = (torch.randn(n, device=DEVICE) * 0.5).to(F32)
    b = None if is_rms else torch.randn(n, device=DEVICE).to(F32)
    dy = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    ref_f = ref_fwd(x, w, b, 1e-5, is_rms, False)
    mu = None if is_rms else ref_f["mu"].float()
    rsigma = ref_f["rsigma"].float()
    got = {}
    for phases in (True, False):
        monkeypatch.setattr(nm, "BWD_ROW_PHASES", phases)
        dx = poisoned((m, n), torch.bfloat16)
        dw = poisoned((n,), F32)
        db = None if is_rms else poisoned((n,), F32)
        nm.launch_bwd(dy, x, mu, rsigma, w, None, dx, None, dw, db, is_rms_norm=is_rms,
                      zero_centered_gamma=False, sm_margin=0, config=config)
        got[phases] = (dx, dw, db)
    for new, old in zip(got[True], got[False]):
        if new is not None:
            assert torch.equal(new, old)
    dx, dw, db = got[True]
    ref = ref_bwd(dy, x, w, b, 1e-5, is_rms, False)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[torch.bfloat16])
    assert rel_err(dw, ref["dweight"]) < REDUCTION[F32]
    if b is not None:
        assert rel_err(db, ref["dbias"]) < REDUCTION[F32]


def test_row_phases_follow_the_entry(monkeypatch):
    """The backward's plan compiles the row phases (ROW_PHASES) for tiles of several rows unless
    the entry opts out (NormConfig.row_phases: RMSNorm's 4 x 1024 tile, NOTES P191b) or
    BWD_ROW_PHASES is off; one-row tiles have no phases to run (ROW_PHASES on is a no-op there)."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels import norms_common as nc

    names = nm._BWD._constexpr_names

    def phases(n, rms):
        cfg, _, constexprs = nm._bwd_plan(n, torch.bfloat16, False, False, not rms, torch.device(DEVICE), 0,
                                          rms, False, None)
        return cfg, dict(zip(names, constexprs))["ROW_PHASES"]

    cfg, on = phases(1024, True)
    assert cfg == nc._RMS_BWD_OVERRIDES[1024] and cfg.block_m > 1 and not cfg.row_phases and not on
    cfg, on = phases(8192, True)
    assert cfg.block_m > 1 and on
    monkeypatch.setattr(nm, "BWD_ROW_PHASES", False)
    assert not phases(8192, True)[1]


def test_configs_that_cannot_hold_the_row_raise():
    """A register config narrower than the row raises unless it has a tail (backward) and in the
    forward (which has none); so does a tail where head and tail cannot hold the row (N > 2
    block_n), one with nothing to hold (N <= block_n), and one on the split kernel. Such register
    configs computed a part of the row before (no check)."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels.norms_common import NormConfig

    use_backend("triton")
    m, n = 4, 300
    x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    w = torch.ones(n, device=DEVICE)
    rsigma = torch.ones(m, device=DEVICE)
    for cfg, match in ((NormConfig(1, 256, False, 4, 2), "cannot hold rows of 300"),
                       (NormConfig(1, 128, False, 4, 2, tail=True), "N <= 256, not N = 300"),
                       (NormConfig(1, 128, True, 4, 2, tail=True), "N <= 256, not N = 300"),
                       (NormConfig(1, 512, True, 4, 2, tail=True), "N <= 1024, not N = 300"),
                       (NormConfig(1, 256, False, 4, 1, split=True, tail=True), "not N = 300")):
        with pytest.raises(ValueError, match=match):
            nm.launch_bwd(x, x, None, rsigma, w, None, torch.empty_like(x), None, torch.empty_like(w), None,
                          is_rms_norm=True, zero_centered_gamma=False, sm_margin=0, config=cfg)
    for cfg in (NormConfig(1, 256, False, 4, 2), NormConfig(1, 256, False, 4, 2, tail=True)):
        with pytest.raises(ValueError, match="cannot hold rows of 300"):
            nm.launch_fwd(x, w, None, None, 1e-5, torch.empty_like(x), None, None, torch.empty_like(rsigma),
                          None, None, None, None, is_rms_norm=True, zero_centered_gamma=False,
                          current_scaling=False, amax_epsilon=0.0, sm_margin=0, config=cfg)


@pytest.mark.parametrize("is_rms", [True, False])
def test_triton_forward_filled_chunks(is_rms, monkeypatch):
    """The Triton forward at N = 18432 through the heuristic against the float64 oracle: the fp32
    output on the config FWD_CHUNK_FILL makes of 32K's chunks (two rows per tile in three chunks
    of 8192, the last a quarter full; M = 3, so the second row tile is half empty), and e4m3 on
    FWD_FP8_BETWEEN's entry (one-row tiles in the same chunks; NOTES P189, Q94)."""
    from reference import fp8_quantize
    from test_fp8 import fp8_steps

    from engine.triton_kernels import norms
    from engine.triton_kernels import norms_common as nc

    monkeypatch.setattr(nc, "FWD_CHUNK_FILL", 0.75)
    nc.fwd_config.cache_clear()
    norms.FWD_PLANS.clear()
    use_backend("triton")
    try:
        m, n = 3, 18432
        x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
        w = (torch.randn(n, device=DEVICE) * 0.5 + 1.0).to(torch.bfloat16)
        b = None if is_rms else torch.randn(n, device=DEVICE).to(torch.bfloat16)
        ref = ref_fwd(x, w, b, 1e-5, is_rms)
        for fp8 in (False, True):
            cfg = nc.fill_chunks(nc.table_fwd_config(n, torch.bfloat16, False, fp8, is_rms), n, 0.75)
            assert (cfg.block_m, cfg.block_n, cfg.blocked) == (2, 8192, True)
            assert nc.fwd_config(n, torch.bfloat16, False, fp8, is_rms) == (
                nc.FWD_FP8_BETWEEN[32768] if fp8 else cfg)
            out = poisoned((m, n), torch.float8_e4m3fn if fp8 else F32)
            mu = poisoned((m,), F32) if not is_rms else None
            rsigma = poisoned((m,), F32)
            scale = torch.full((1,), 2.0, device=DEVICE) if fp8 else None
            amax = torch.zeros(1, device=DEVICE) if fp8 else None
            scale_inv = poisoned((1,), F32) if fp8 else None
            norms.launch_fwd(x, w, b, None, 1e-5, out, None, mu, rsigma, scale, amax, scale_inv, None,
                             is_rms_norm=is_rms, zero_centered_gamma=False, current_scaling=False,
                             amax_epsilon=0.0, sm_margin=0)
            assert_stats(mu, rsigma, ref, is_rms)
            if not fp8:
                torch.testing.assert_close(out.double(), ref["y"], **FWD[F32])
                continue
            assert amax.item() == pytest.approx(ref["y"].abs().max().item(), rel=1e-4)
            assert scale_inv.item() == 0.5
            assert fp8_steps(out, fp8_quantize(ref["y"], 2.0, torch.float8_e4m3fn)).max().item() <= 1
    finally:
        monkeypatch.undo()
        nc.fwd_config.cache_clear()
        norms.FWD_PLANS.clear()
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("cfg", [
    pytest.param((2, 512, False, F32, 300), id="register"),
    pytest.param((2, 128, True, F32, 300), id="blocked-3-chunks"),
    pytest.param((2, 512, True, F32, 300), id="blocked-one-chunk"),
    pytest.param((1, 512, True, BF16, 300), id="blocked-one-chunk-bf16-gamma"),
    pytest.param((1, 512, False, F32, 512), id="register-even"),
    pytest.param((1, 512, True, BF16, 512), id="blocked-one-chunk-even"),
    pytest.param((1, 128, True, F32, 512), id="blocked-4-chunks-even"),
])
def test_triton_backward_paths(is_rms, cfg):
    """The Triton backward's three paths on one problem, each against the float64 oracle: the
    register tile, the blocked path over several chunks (dW/dB partials read-modified-written per
    row tile and chunk) and the blocked path with one chunk (ONE_CHUNK: gamma and the dW/dB
    accumulators in registers across row tiles; with a 16-bit gamma and one-row tiles,
    LayerNorm's ONE_CHUNK re-reads gamma per pass). Several row tiles per program (M = 37, 1- and
    2-row tiles), bias and zero-centred gamma. N = 512 with one-row tiles runs them unmasked
    (EVEN)."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels.norms_common import NormConfig

    use_backend("triton")
    bm, bn, blocked, w_dtype, n = cfg
    m, eps = 37, 1e-5
    x = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    w = (torch.randn(n, device=DEVICE) * 0.5).to(w_dtype)
    b = None if is_rms else torch.randn(n, device=DEVICE).to(w_dtype)
    dy = torch.randn(m, n, device=DEVICE).to(torch.bfloat16)
    ref_f = ref_fwd(x, w, b, eps, is_rms, True)
    mu = None if is_rms else ref_f["mu"].float()
    rsigma = ref_f["rsigma"].float()
    dx = poisoned((m, n), torch.bfloat16)
    dw = poisoned((n,), torch.float32)
    db = None if is_rms else poisoned((n,), torch.float32)
    nm.launch_bwd(dy, x, mu, rsigma, w, None, dx, None, dw, db, is_rms_norm=is_rms, zero_centered_gamma=True,
                  sm_margin=0, config=NormConfig(bm, bn, blocked, 4, 2))
    ref = ref_bwd(dy, x, w, b, eps, is_rms, True, None)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[torch.bfloat16])
    assert rel_err(dw, ref["dweight"]) < REDUCTION[torch.float32]
    if b is not None:
        assert rel_err(db, ref["dbias"]) < REDUCTION[torch.float32]
