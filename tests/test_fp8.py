"""FP8 outputs: norm -> FP8 (delayed and current scaling), transposed copies, cast_transpose, recipes.

Exactness: a backend's FP8 bytes must equal torch's saturating round-to-nearest-even cast of the
*same backend's* fp32 output times the scale (run with out_dtype=fp32), bit for bit, where both
outputs add a row's sums in one order (same_row_sums); amax must equal max|y| of that output and
scale_inv = 1/scale exactly. Where they do not (Triton; CUDA's blocked and streamed forwards at
the widths they take for RMSNorm's FP8 outputs only, and its blocked forward at the widths it takes
for the fused residual add to other outputs only: cuda_fp8_own_path) the bytes may differ from
that cast by one step at rounding boundaries.
Against the float64 oracle the bytes may differ by one FP8 step where the fp32 value sits within
rounding error of a tie between two FP8 values (the fp32 and float64 results round differently
there), so that check allows one step.
"""

from __future__ import annotations

import contextlib
import re

import pytest
import torch

import engine
from engine.fp8 import DelayedScaling, Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

from conftest import (DEVICE, ON_GPU, cuda_kernel_launches, cuda_kernel_names, gpu_sms, many_rows, resident_bound,
                      use_backend)
from reference import fp8_quantize
from reference import norm_fwd as ref_fwd

F32, BF16 = torch.float32, torch.bfloat16
E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2
NORMS = [pytest.param(True, id="rms"), pytest.param(False, id="ln")]
FP8 = [pytest.param(E4M3, id="e4m3"), pytest.param(E5M2, id="e5m2")]
SHAPES = [(173, 409), (71, 3571), (29, 17389), (1, 1000)]
# On the GPU also rows that CUDA splits over thread-block clusters (2 and 8 CTAs; more rows than
# resident clusters at 24584): the FP8 epilogue, amax and the transposed copy on that path. By
# default every CUDA output takes its streamed kernel at 131072; at 24584 RMSNorm's FP8 output
# does and its fp32 output not (same_row_sums), LayerNorm's outputs neither. 65536: Triton's
# lean-card tiles on an H100 (two blocked chunks of 32K; NOTES P110).
WIDE = [(301, 24584), (19, 65536), (37, 131072)] if ON_GPU else []
# CUDA's RMSNorm FP8 outputs without a residual (a 16-bit x, rows of 16-byte vectors): on a lean
# card (the H100) the blocked kernel from the first width to the second, above it up to the third
# the streamed kernel with a transposed copy or current scaling, the fp32 output's clusters in
# delayed scaling alone (NOTES P133), and at the third, where the other outputs take the stream,
# delayed scaling alone the clusters (both norms); on another card (the H200) the stream from
# the second width (cuda_fp8_own_path; NOTES P100 / P102 / P116).
FP8_OWN_RMS = (4096, 16384, 32768)
# CUDA's LayerNorm FP8 outputs without a residual on a card that is not lean: the stream from
# here up to FP8_OWN_RMS[2] (NOTES P116; on a lean card the fp32 output's kernel but at 32768).
FP8_OWN_LN_WIDE = 8192


def cuda_lean() -> bool:
    """Whether the CUDA launchers take a lean card's defaults on this GPU
    (engine.cuda_backend.device_dram_class; NOTES P109): some default paths depend on it."""
    from engine import cuda_backend

    return cuda_backend.device_dram_class() == 1


def call(is_rms, x, w, b=None, **kw):
    with torch.no_grad():
        if is_rms:
            return engine.rmsnorm(x, w, 1e-5, **kw)
        return engine.layernorm(x, w, b, 1e-5, **kw)


def delayed(fp8_dtype, scale=1.5, amax=0.25, columnwise=False):
    return Float8Quantizer(torch.tensor([scale], device=DEVICE), torch.tensor([amax], device=DEVICE),
                           fp8_dtype, columnwise=columnwise)


def fp8_steps(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Distance in FP8 steps between two FP8 tensors of one dtype (ordinal of the bit patterns)."""
    def ordinal(t):
        u = t.view(torch.uint8).to(torch.int32)
        mag = u & 0x7F
        return torch.where(u & 0x80 != 0, -mag, mag)
    return (ordinal(a) - ordinal(b)).abs()


def cuda_fp8_own_path(is_rms, n, x_dtype=BF16, residual=False, lean=None, alone=True):
    """Whether CUDA's forward, by default, takes another kernel for an FP8 output of contiguous
    rows of n than for an fp32 one, with the launch defaults of a lean card or not (``lean``; None:
    this GPU's class, cuda_lean), in delayed scaling without a transposed copy (``alone``) or not
    (current scaling's statistics pass, or a copy made after the norm: the band kernel that writes
    it at 1K-16K by default has its own row sums, test_default_transpose_path_by_width).

    Without a residual, on a lean card (the H100): RMSNorm's blocked kernel for FP8 outputs at
    4K-16K (fwd_take_blocked, norm_fwd_launch.cuh; NOTES P100 / P102); not alone its streamed
    cluster kernel above that and up to the other outputs' 32K (fwd_take_stream,
    norm_fwd_stream.cuh; on a device with thread-block clusters, sm_90), where the fp32 output
    takes the register path, and alone that register path, but at 32K, where the fp32 output
    takes the stream and an FP8 one alone the register path's clusters, both norms (NOTES P133);
    LayerNorm's FP8 outputs otherwise take the fp32 output's kernel (NOTES P101 / P102). On
    another card (the H200; NOTES P116) the stream takes RMSNorm's FP8 outputs from 16K and
    LayerNorm's from 8K, up to 32K (sm_90), and the register path the rows below. At 32K the
    fp32 output takes the lean kernel (P154) for RMSNorm on the H200 and for LayerNorm on the
    H100, and the FP8 outputs there keep the kernels above. With a residual
    of x's dtype (``residual``): at 2K-8K the blocked kernel for the fp32 output and the register
    kernel for an FP8 one (fwd_take_blocked; NOTES P91), at 16K the blocked kernel and the
    streamed one (NOTES P130; at 32K-64K both take the blocked kernel since P103). On a card that
    is not lean, delayed scaling alone (no residual) takes the lean FP8 kernel at its default
    widths (fp8_lean_takes; NOTES P181b), whose sums add at 4 vectors per thread where the fp32
    output's kernels add them at 8. All only for a 16-bit x (weights of its dtype) and rows of
    16-byte vectors (n a multiple of 8)."""
    if not (ON_GPU and x_dtype in (BF16, torch.float16) and n % 8 == 0):
        return False
    sm90 = torch.cuda.get_device_capability()[0] >= 9
    if residual:
        return 2048 <= n <= 16384
    if alone and fp8_lean_takes(is_rms, n, 0, cuda_lean() if lean is None else lean):
        return True
    lo, mid, hi = FP8_OWN_RMS
    if cuda_lean() if lean is None else lean:
        if alone:
            return (is_rms and lo <= n <= mid) or (sm90 and n == hi)
        # at 32K LayerNorm's fp32 output takes the lean kernel there (NOTES P154), the others the stream
        return (is_rms and (lo <= n <= mid or (sm90 and mid < n < hi))) or (not is_rms and sm90 and n == hi)
    # at 32K RMSNorm's fp32 output takes the lean kernel there (NOTES P154), its FP8 outputs the stream
    return sm90 and ((mid if is_rms else FP8_OWN_LN_WIDE) <= n < hi or (is_rms and n == hi))


def fp8_lean_takes(is_rms, n, knob, lean):
    """norm_fwd_fp8_lean.cuh's fwd_fp8_lean_takes: whether CUDA's lean FP8 kernel takes rows of n
    under its knob (engine.cuda_backend.norm_fwd_fp8_lean) on a lean card (``lean``) or not: 0,
    the default, on a card that is not lean at RMSNorm's 4096, 8192, 12288 and 16384 and
    LayerNorm's 4096, 6144 and 8192 (NOTES P181b, P186c); 1 never; 2 every width it fits
    (tpr = n / 32 a multiple of 32, at most 512).
    It takes delayed scaling of a 16-bit x without a residual, weights of x's dtype, with no
    transposed copy asked of the kernel (RMSNorm without a bias, LayerNorm)."""
    tpr = n // 32
    if knob == 1 or n % 32 or not (32 <= tpr <= 512 and tpr % 32 == 0):
        return False
    return knob == 2 or (not lean and n in ((4096, 8192, 12288, 16384) if is_rms else (4096, 6144, 8192)))


def same_row_sums(backend, is_rms, n, x_dtype=BF16, residual=False, alone=True):
    """Whether the backend adds a row's sums in the same order for an FP8 and an fp32 output, for
    rows of n of ``x_dtype`` with or without a residual, at the default launch knobs.

    The reference does by construction. CUDA does (one thread layout per row width, whatever the
    output) except where the FP8 output takes another kernel than the fp32 one
    (cuda_fp8_own_path: without a residual its blocked or streamed kernel for FP8 only at
    RMSNorm 4K-32K, NOTES P100, P102 / P59/P67/P68, and on a lean card in delayed scaling alone
    the clusters at 32K, P133; with a residual of x's dtype its
    blocked kernel for the fp32 output only at 2K-16K, NOTES P91, P130), whose sums add in another
    order. Triton does not: its tiles
    are tuned per output kind (engine.triton_kernels.norms_common), and even where the FP8 tile's
    shape equals the high-precision one, Triton lays the FP8 tile out with 16 values per thread
    (its store's 16-byte vectors) against 8 for a bf16 input with a 16- or 32-bit output, so
    tl.sum adds in another order. The statistics then agree to the last bits and the FP8 bytes
    equal the fp32 output's cast except where a value lies on a rounding boundary (seen on the
    H200 at 37 x 131072, LayerNorm, with equal tile shapes).
    """
    if backend == "triton":
        return False
    return not (backend == "cuda" and cuda_fp8_own_path(is_rms, n, x_dtype, residual, alone=alone))


def assert_cast_of(data, y32, scale, bias, *, exact, terms=None):
    """FP8 ``data`` against the cast of the fp32 output ``y32`` times ``scale``: bit for bit when
    ``exact``; otherwise at most one step, and only for values on a rounding boundary: within
    1e-5 of the magnitude of y's addends (``terms``, |y| by default, or |y - bias| + |bias| with a
    bias) of it."""
    expect = fp8_quantize(y32, scale, data.dtype)
    if exact:
        assert torch.equal(data.view(torch.uint8), expect.view(torch.uint8))
        return
    steps = fp8_steps(data, expect)
    assert steps.max().item() <= 1
    moved = steps > 0
    ys = (y32 * scale)[moved]
    mid = (data.float()[moved] + expect.float()[moved]) / 2
    # y = xhat * g + b: last-bit differences of the statistics move y by a fraction of its
    # addends, not of y, which is near 0 where the bias cancels xhat * g (LayerNorm; seen on
    # the GPU at 301 x 24584, e5m2: y * scale = -0.0016, 3.7e-7 from the boundary).
    # LayerNorm's (z - mean) loses the mean's last bits relative to |z| + |mean|, not to |z - mean|:
    # callers with rows of a large mean pass those addends (seen on the H100 at 45 x 7800, the band
    # kernel, rows of mean 8: y * scale = 0.07, 5e-6 from the boundary).
    if terms is None:
        terms = y32.abs() if bias is None else (y32 - bias.float()).abs() + bias.float().abs()
    ts = (terms * scale)[moved]
    assert ((ys - mid).abs() <= 1e-5 * ts).all(), "a moved byte is not at a rounding boundary"


def inputs(m, n, is_rms, dtype=BF16):
    x = torch.randn(m, n, device=DEVICE, dtype=dtype)
    w = (torch.rand(n, device=DEVICE) + 0.5).to(dtype)
    b = None if is_rms else torch.randn(n, device=DEVICE).to(dtype)
    return x, w, b


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("m,n", SHAPES + WIDE)
def test_norm_fp8_delayed(backend, is_rms, fp8_dtype, m, n):
    x, w, b = inputs(m, n, is_rms)
    y32 = call(is_rms, x, w, b, out_dtype=F32)
    q = delayed(fp8_dtype, scale=3.0, amax=0.25)
    t = call(is_rms, x, w, b, quantizer=q)
    assert isinstance(t, Float8Tensor) and t.data.dtype == fp8_dtype and t.data.shape == x.shape
    assert t.transpose_data is None
    same = same_row_sums(backend, is_rms, n)  # True: the FP8 output is the fp32 one's cast
    assert_cast_of(t.data, y32, 3.0, b, exact=same)
    if same:
        assert q.amax.item() == max(0.25, y32.abs().max().item())
    else:  # statistics equal to the last bits
        assert q.amax.item() == pytest.approx(max(0.25, y32.abs().max().item()), rel=1e-5)
    assert t.scale_inv.item() == (1.0 / torch.tensor(3.0)).item()
    # against the float64 oracle: at most one FP8 step, and rarely
    oracle = fp8_quantize(ref_fwd(x, w, b, 1e-5, is_rms)["y"], 3.0, fp8_dtype)
    steps = fp8_steps(t.data, oracle)
    assert steps.max().item() <= 1
    assert (steps > 0).float().mean().item() < 0.01


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_norm_fp8_current_scaling(backend, is_rms, fp8_dtype):
    m, n = 71, 3571
    x, w, b = inputs(m, n, is_rms)
    y32 = call(is_rms, x, w, b, out_dtype=F32)
    q = Float8CurrentScalingQuantizer(fp8_dtype)
    t = call(is_rms, x, w, b, quantizer=q)
    same = same_row_sums(backend, is_rms, n, alone=False)
    amax = y32.abs().max()
    if same:
        assert q.amax.item() == amax.item()
    else:  # the statistics agree to the last bits (same_row_sums); amax is the kernel's own
        assert q.amax.item() == pytest.approx(amax.item(), rel=1e-5)
        amax = q.amax.clone()
    scale = torch.tensor(torch.finfo(fp8_dtype).max, device=DEVICE) / amax  # one IEEE division
    assert q.scale.item() == scale.item()
    assert t.scale_inv.item() == (1.0 / scale).item()
    assert_cast_of(t.data, y32, scale.item(), b, exact=same)
    # current scaling uses the range: the largest magnitude lands on the format's max
    assert t.data.float().abs().max().item() == torch.finfo(fp8_dtype).max


def check_fp8_path(is_rms, fp8_dtype, n, knob, residual=False, dram_class=0):
    """CUDA, 67 rows of n under a path knob (a context manager of engine.cuda_backend) that puts
    the fp32 and FP8 outputs on one path: delayed scaling with the transposed copy and current
    scaling, each the exact cast of the same path's fp32 output with its exact amax, current
    scaling's bytes delayed scaling's at its scale, and the delayed bytes within one step of the
    float64 oracle's (rarely). With ``residual`` the norm's input is x + r (bf16), whose stored
    sum (residual_out, equal to the oracle's rounding bit for bit in every call) is normalised.
    ``dram_class``: the card class whose launch defaults the CUDA launchers take
    (engine.cuda_backend.dram_class; 0 the device's)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        # the band kernel off: by default it writes FP8 + transposed rows of 1025-16384 (with its
        # own row sums; LayerNorm's on a lean card), before the kernel under test
        with knob, cuda_backend.norm_fwd_band(1), cuda_backend.dram_class(dram_class):
            x, w, b = inputs(67, n, is_rms)
            if residual:
                r = torch.randn_like(x)
                z = (x.float() + r.float()).to(x.dtype)
                x0 = x

                def fwd(is_rms, x, w, b=None, **kw):  # the residual form; x is the oracle's z
                    out, res_out = call(is_rms, x0, w, b, residual=r, **kw)
                    assert torch.equal(res_out, z)
                    return out

                x = z
            else:
                fwd = call
            y32 = fwd(is_rms, x, w, b, out_dtype=F32)
            q = delayed(fp8_dtype, scale=3.0, amax=0.25, columnwise=True)
            t = fwd(is_rms, x, w, b, quantizer=q)
            assert_cast_of(t.data, y32, 3.0, b, exact=True)
            assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
            assert q.amax.item() == max(0.25, y32.abs().max().item())
            qc = Float8CurrentScalingQuantizer(fp8_dtype)
            tc = fwd(is_rms, x, w, b, quantizer=qc)
            amax = y32.abs().max()
            assert qc.amax.item() == amax.item()
            scale = torch.tensor(torch.finfo(fp8_dtype).max, device=DEVICE) / amax
            assert_cast_of(tc.data, y32, scale.item(), b, exact=True)
            td = fwd(is_rms, x, w, b, quantizer=delayed(fp8_dtype, scale=qc.scale.item(), amax=0.0))
            assert torch.equal(td.data.view(torch.uint8), tc.data.view(torch.uint8))
            oracle = fp8_quantize(ref_fwd(x, w, b, 1e-5, is_rms)["y"], 3.0, fp8_dtype)
            steps = fp8_steps(t.data, oracle)
            assert steps.max().item() <= 1
            assert (steps > 0).float().mean().item() < 0.01
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("n", [4096, 24584, 65536])
def test_norm_fp8_blocked_kernel(is_rms, fp8_dtype, n):
    """The CUDA forward's blocked kernel (engine.cuda_backend.norm_fwd_blocked_from(1)) to FP8:
    delayed scaling (with the transposed copy, which the caller transposes on this path) and
    current scaling, each the exact cast of the same path's fp32 output with its exact amax."""
    from engine import cuda_backend

    check_fp8_path(is_rms, fp8_dtype, n, cuda_backend.norm_fwd_blocked_from(1))


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("n", [4096, 32776, 65536, 131072])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_norm_fp8_stream_kernel(is_rms, fp8_dtype, n, dram_class):
    """The CUDA forward's streamed cluster kernel (engine.cuda_backend.norm_fwd_stream_from(1):
    every width) to FP8: delayed scaling (with the transposed copy, which the caller transposes on
    this path) and current scaling (its statistics pass on the streamed kernel, its output pass
    on the register path from the stored statistics), each the exact cast of the same path's fp32
    output with its exact amax; 131072 also through the default (streamed for every output dtype
    there; test_fp8_own_kernel_widths: the widths streamed for FP8 outputs only). With each card
    class's launch defaults (dram_class: a lean card's CTAs from 64K are smaller, for every
    output dtype alike; NOTES P109). Regression (session 33): with the smaller CTAs for FP8
    outputs only, LayerNorm's 64K-128K FP8 bytes missed the fp32 output's exact cast (its sums in
    another order), which these lean cases catch on any card."""
    from engine import cuda_backend

    check_fp8_path(is_rms, fp8_dtype, n, cuda_backend.norm_fwd_stream_from(1 if n < 131072 else 0),
                   dram_class=dram_class)


@pytest.mark.skipif(not ON_GPU, reason="a path knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("n", [8192, 32776, 131072])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_norm_fp8_stream_residual(is_rms, fp8_dtype, n, dram_class):
    """The streamed kernel's fused residual add (norm_fwd_stream_from(1), a bf16 residual) to FP8:
    delayed scaling with the transposed copy and current scaling (its statistics pass on the
    streamed kernel writes residual_out, its output pass normalises that on the register path),
    each the exact cast of the same path's fp32 output with its exact amax, with each card
    class's launch defaults."""
    from engine import cuda_backend

    check_fp8_path(is_rms, fp8_dtype, n, cuda_backend.norm_fwd_stream_from(1), residual=True,
                   dram_class=dram_class)


def fp8_own_kernel(n, lean, alone=True):
    """The knob (engine.cuda_backend) that puts an fp32 output of RMSNorm rows of n on the kernel
    CUDA's forward takes by default for an FP8 output without a residual, where that is its own
    (cuda_fp8_own_path; ``alone``: delayed scaling without a transposed copy): on a lean card the
    blocked kernel to 16K, above it the stream, but alone at 32K the register path's clusters;
    on another card alone the lean FP8 kernel's twin at its widths (lean_fp8_twin: the same sums
    up to 8192), else the stream."""
    from engine import cuda_backend

    if alone and fp8_lean_takes(True, n, 0, lean):
        return lean_fp8_twin()
    if lean and n <= FP8_OWN_RMS[1]:
        return cuda_backend.norm_fwd_blocked_from(n)
    if lean and alone:
        return register_path()
    return cuda_backend.norm_fwd_stream_from(n)


@contextlib.contextmanager
def lean_fp8_twin():
    """CUDA: the register path at 4 vectors per thread, one CTA per row, the bf16 lean kernel off:
    the lean FP8 kernel's row layout and order of sums where it lays rows out alike (up to 8192
    columns; past that, within one FP8 step at rounding boundaries: test_fwd_fp8_lean_kernel)."""
    from engine import cuda_backend

    with register_path(), cuda_backend.norm_fwd_vectors(4), cuda_backend.max_cluster_size(1), \
            cuda_backend.norm_fwd_lean(1):
        yield


@contextlib.contextmanager
def register_path():
    """CUDA: the forward's register path wherever the row fits it, the streamed, blocked and band
    kernels off (by default RMSNorm's FP8 outputs without a residual take the blocked kernel at
    4K-16K and the stream above: cuda_fp8_own_path; an FP8 output with its transposed copy asked
    in-kernel the band kernel at 1K-16K, NOTES P117, where its own row sums would make the bytes
    differ from the register path's cast at rounding boundaries)."""
    from engine import cuda_backend

    with cuda_backend.norm_fwd_stream_from(1 << 30), cuda_backend.norm_fwd_blocked_from(1 << 30), \
            cuda_backend.norm_fwd_band(1):
        yield


@pytest.mark.skipif(not ON_GPU, reason="the default paths of the CUDA forward")
@pytest.mark.parametrize("n,dram_class", [(4096, 1), (16384, 1), (16392, 1), (24584, 1), (32768, 1),
                                          (16384, 2), (24584, 2), (32768, 2)])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_fp8_own_kernel_widths(n, dram_class, fp8_dtype):
    """By default the CUDA forward takes another kernel for RMSNorm's FP8 outputs than for the
    others at 4K-32K on a lean card (cuda_fp8_own_path): its blocked kernel at 4K-16K
    (fwd_take_blocked; NOTES P100 / P102), its streamed kernel above with the transposed copy and
    in current scaling (fwd_take_stream; NOTES P59/P67/P68), where delayed scaling alone takes the
    fp32 output's path but at 32K, where it takes the clusters and the fp32 output the stream
    (P133); on another card the stream from 16K (P116; at 32K the fp32 output the lean kernel,
    P154), but alone at 16K the lean FP8 kernel (P181b), whose twin (lean_fp8_twin) adds the
    same sums only up to 8K: within one step of its cast there, amax to 1e-5, and current
    scaling's statistics pass still on the stream. test_norm_contract.py::
    test_fwd_fp8_default_path checks the paths taken. Here, over 67 rows (16392 and 24584: rows
    not a power of two), with each class's defaults (engine.cuda_backend.dram_class): delayed
    scaling's bytes, alone and (past 16K, where the copy comes after the norm) with the copy, are
    the exact cast of their kernel's fp32 output (its knob) with its exact amax, and where that
    kernel is not the default fp32 output's, within one step of that one's cast at rounding
    boundaries only; current scaling's bytes are delayed scaling's at its scale (its statistics
    pass on the kernel that delayed scaling with the copy takes, its output pass from them)."""
    from engine import cuda_backend

    lean = dram_class == 1
    if (n > FP8_OWN_RMS[1] or not lean) and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    use_backend("cuda")
    stack = contextlib.ExitStack()
    try:
        own = {alone: cuda_fp8_own_path(True, n, lean=lean, alone=alone) for alone in (True, False)}
        assert own[True] or own[False]  # the case this test is for
        stack.enter_context(cuda_backend.dram_class(dram_class))
        x, w, b = inputs(67, n, True)
        y32 = call(True, x, w, b, out_dtype=F32)
        after = n > FP8_OWN_RMS[1]  # the transposed copy from the tiled transpose after the norm
        # the lean FP8 kernel alone (wide card, 16K): its twin adds the same sums up to 8192 only
        twin_exact = not (fp8_lean_takes(True, n, 0, lean) and n > 8192)
        data = {}
        for alone in (True, False) if after else (True,):
            y32s = y32
            if own[alone]:
                with fp8_own_kernel(n, lean, alone):
                    y32s = call(True, x, w, b, out_dtype=F32)
            q = delayed(fp8_dtype, scale=3.0, amax=0.25, columnwise=not alone)
            t = call(True, x, w, b, quantizer=q)
            exact = twin_exact or not alone
            assert_cast_of(t.data, y32s, 3.0, b, exact=exact)
            if exact:
                assert q.amax.item() == max(0.25, y32s.abs().max().item())
            else:
                assert q.amax.item() == pytest.approx(max(0.25, y32s.abs().max().item()), rel=1e-5)
            assert_cast_of(t.data, y32, 3.0, b, exact=not own[alone])
            if not alone:
                assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
            data[alone] = y32s
        # current scaling does not take the lean FP8 kernel: its statistics pass runs where delayed
        # scaling with the copy would (the stream at 16K), so delayed scaling is put there too
        lean_alone = not after and fp8_lean_takes(True, n, 0, lean)
        if lean_alone:
            with fp8_own_kernel(n, lean, alone=False):
                data[True] = call(True, x, w, b, out_dtype=F32)
        qc = Float8CurrentScalingQuantizer(fp8_dtype)
        tc = call(True, x, w, b, quantizer=qc)
        assert qc.amax.item() == data[not after].abs().max().item()
        qd = delayed(fp8_dtype, scale=qc.scale.item(), amax=0.0, columnwise=after)
        with fp8_own_kernel(n, lean, alone=False) if lean_alone else contextlib.nullcontext():
            td = call(True, x, w, b, quantizer=qd)
        assert torch.equal(td.data.view(torch.uint8), tc.data.view(torch.uint8))
        assert qd.amax.item() == qc.amax.item()
    finally:
        stack.close()
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the default paths of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [2048, 4096, 8200, 16384])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_fp8_residual_blocked_widths(is_rms, n, fp8_dtype):
    """By default the CUDA forward takes its blocked kernel for the fused residual add of a 16-bit
    x to a non-FP8 output at 2K-16K (NOTES P91, P130), while an FP8 output keeps the register
    kernel at 2K-8K and the streamed kernel at 16K (fwd_take_blocked, fwd_take_stream; 8200
    leaves the last chunk partly past the row). Over many_rows() rows (past the few-rows layout of
    P146, whose register kernel adds a row in the blocked kernel's order here) with a bf16
    residual: the fp32 output is the blocked kernel's (its knob at n) bit for bit and not the FP8
    output's kernel's (the blocked knob at 1 << 30, the register kernel; at 16K the stream's knob
    at n); the FP8 bytes, delayed scaling, are the exact cast of that kernel's fp32 output with
    its exact amax, and within one step of the default fp32 output's cast at rounding boundaries
    only; residual_out is the same rounded sum on every path."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        assert not same_row_sums("cuda", is_rms, n, residual=True)  # the case this test is for
        x, w, b = inputs(many_rows(), n, is_rms)
        r = torch.randn_like(x)
        z = (x.float() + r.float()).to(x.dtype)
        y32, ro = call(is_rms, x, w, b, residual=r, out_dtype=F32)
        with cuda_backend.norm_fwd_blocked_from(n):
            y32b, rob = call(is_rms, x, w, b, residual=r, out_dtype=F32)
        other = (cuda_backend.norm_fwd_stream_from(n) if n >= 16384
                 else cuda_backend.norm_fwd_blocked_from(1 << 30))
        with other:
            y32o, roo = call(is_rms, x, w, b, residual=r, out_dtype=F32)
        assert torch.equal(ro, z) and torch.equal(rob, z) and torch.equal(roo, z)
        assert torch.equal(y32, y32b) and not torch.equal(y32, y32o)
        q = delayed(fp8_dtype, scale=3.0, amax=0.25)
        t, rot = call(is_rms, x, w, b, residual=r, quantizer=q)
        assert torch.equal(rot, z)
        assert_cast_of(t.data, y32o, 3.0, b, exact=True)
        assert q.amax.item() == max(0.25, y32o.abs().max().item())
        assert_cast_of(t.data, y32, 3.0, b, exact=False)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the default paths of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [16392, 32768, 40000, 131072])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_fp8_residual_default_wide(is_rms, n, fp8_dtype):
    """Past 16K the CUDA forward takes one kernel for the fused residual add (a bf16 residual)
    whatever the output dtype: the streamed kernel under 32K and from 64K on sm_90, the blocked
    kernel at 32K-64K (fwd_take_stream; NOTES P96, and P103 for FP8 outputs, which took the
    stream there before: 40000 leaves its last chunk partly past the row). At 16K itself the
    non-FP8 outputs take the blocked kernel (test_fp8_residual_blocked_widths). So by default,
    over 67 rows, delayed scaling with the transposed copy and current scaling are each the exact
    cast of the default fp32 output with its exact amax (check_fp8_path with no knob);
    test_norm_contract.py::test_fwd_stream_residual_taken checks which kernel runs."""
    if n != 32768 and n != 40000 and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    assert same_row_sums("cuda", is_rms, n, residual=True)
    check_fp8_path(is_rms, fp8_dtype, n, contextlib.nullcontext(), residual=True)


@pytest.mark.parametrize("is_rms", NORMS)
def test_saturation_regression(backend, is_rms):
    """gamma = [2**20] + [0]*127 drives y far past the FP8 range: +-max, never NaN or Inf."""
    n = 128
    x = torch.randn(64, n, device=DEVICE)
    x[:, 0] = torch.sign(x[:, 0]) * (1.0 + torch.rand(64, device=DEVICE))  # |xhat_0| > 0.5
    x = x.to(BF16)
    w = torch.tensor([2.0 ** 20] + [0.0] * (n - 1), device=DEVICE, dtype=BF16)
    for fp8_dtype in (E4M3, E5M2):
        fmax = torch.finfo(fp8_dtype).max
        t = call(is_rms, x, w, quantizer=delayed(fp8_dtype, scale=1.0, amax=0.0))
        d = t.data.float()
        assert torch.isfinite(d).all()
        assert set(d[:, 0].abs().unique().tolist()) == {fmax}
        assert (d[:, 1:] == 0).all()
        assert torch.isfinite(t.dequantize()).all()


@pytest.mark.parametrize("is_rms", NORMS)
def test_rows_of_zeros(backend, is_rms):
    n = 96
    x = torch.zeros(5, n, device=DEVICE, dtype=BF16)
    x[2] = torch.randn(n, device=DEVICE)
    w = torch.ones(n, device=DEVICE, dtype=BF16)
    t = call(is_rms, x, w, quantizer=delayed(E4M3, scale=2.0))
    assert (t.data[[0, 1, 3, 4]].float() == 0).all()
    q = Float8CurrentScalingQuantizer(E4M3)
    t = call(is_rms, torch.zeros(3, n, device=DEVICE, dtype=BF16), w, quantizer=q)
    assert q.amax.item() == 0.0 and q.scale.item() == 1.0 and t.scale_inv.item() == 1.0
    assert (t.data.float() == 0).all()


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("external", ["0", "1"], ids=["in-kernel", "external"])
@pytest.mark.parametrize("m,n", SHAPES + WIDE + [(40, 4096), (33, 1024)])  # 4096: a 32-row tile needs > 48 KB
# of smem (CUDA); N % 16 == 0: the store triton 3.6 miscompiled when its bound was specialised (Triton)
@pytest.mark.parametrize("current", [False, True], ids=["delayed", "current"])
def test_transposed_bitwise(backend, is_rms, external, m, n, current):
    """transpose_data equals data.T bitwise, on both transpose paths and both scalings."""
    use_backend(backend, ENGINE_NORM_EXTERNAL_TRANSPOSE=external)
    x, w, b = inputs(m, n, is_rms)
    q = Float8CurrentScalingQuantizer(E4M3, columnwise=True) if current else delayed(E4M3, columnwise=True)
    t = call(is_rms, x, w, b, quantizer=q)
    assert t.transpose_data.shape == (n, m)
    assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    # The rowwise data matches the rowwise-only output: bitwise on the external path (the same
    # kernel runs); the in-kernel path reduces its statistics over column chunks (another
    # summation order), so a value within fp32 rounding of an FP8 tie may land one step away.
    q2 = Float8CurrentScalingQuantizer(E4M3) if current else delayed(E4M3)
    t2 = call(is_rms, x, w, b, quantizer=q2)
    if external == "1":
        assert torch.equal(t.data.view(torch.uint8), t2.data.view(torch.uint8))
    else:
        steps = fp8_steps(t.data, t2.data)
        assert steps.max().item() <= 1 and (steps > 0).sum().item() <= 2 + 1e-3 * steps.numel()


@pytest.mark.skipif(not ON_GPU, reason="the transpose's grid")
@pytest.mark.parametrize("name,kernel", [("cuda", "byte_transpose_kernel"), ("triton", "_cast_transpose_kernel")])
def test_transpose_after_norm_sm_margin(name, kernel):
    """The tiled transpose after a norm (ENGINE_NORM_EXTERNAL_TRANSPOSE=1) takes the norm's
    sm_margin (NOTES P165): at sm_margin 0 its grid is more than SMs - 4 hold (so the margin must
    cut it), under sm_margin=4 no more than fit there (conftest.resident_bound, from the profiler
    trace); the bytes and scale_inv the same."""
    use_backend(name, ENGINE_NORM_EXTERNAL_TRANSPOSE="1")
    try:
        sms = gpu_sms()
        x, w, _ = inputs(4096, 16384, True)

        def launch(margin):
            out = {}

            def fn():
                out["t"] = call(True, x, w, quantizer=delayed(E4M3, columnwise=True), sm_margin=margin)

            found = [(g, a) for k, g, _, a in cuda_kernel_launches(fn) if kernel in k]
            assert len(found) == 1, found
            return found[0][0][0], found[0][1], out["t"]

        grid0, args0, t0 = launch(0)
        grid4, args4, t4 = launch(4)
        assert grid0 > (sms - 4) * resident_bound(args0)
        assert grid4 <= (sms - 4) * resident_bound(args4)
        for a, b in ((t0.data, t4.data), (t0.transpose_data, t4.transpose_data)):
            assert torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        assert torch.equal(t0.scale_inv, t4.scale_inv)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a layout knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("vectors", [0, 4, 8])
@pytest.mark.parametrize("m,n", [(33, 1024), (40, 4096), (29, 2056), (301, 8200)])
def test_fp8_vector_layouts(is_rms, vectors, m, n):
    """Every thread layout of the CUDA forward's register path (cuda_backend.norm_fwd_vectors): the
    FP8 bytes are the cast of the same layout's fp32 output bit for bit, amax its max, and the
    in-kernel transposed copy (a tile of rows a multiple of the layout's row groups) equals
    data.T bitwise. The streamed and blocked kernels are off (register_path: RMSNorm's FP8
    outputs take them by default from 4K), so that every width here runs the register path."""
    from engine import cuda_backend

    use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
    try:
        with cuda_backend.norm_fwd_vectors(vectors), register_path():
            x, w, b = inputs(m, n, is_rms)
            y32 = call(is_rms, x, w, b, out_dtype=F32)
            q = delayed(E4M3, scale=3.0, amax=0.25, columnwise=True)
            t = call(is_rms, x, w, b, quantizer=q)
        assert torch.equal(t.data.view(torch.uint8), fp8_quantize(y32, 3.0, E4M3).view(torch.uint8))
        assert q.amax.item() == max(0.25, y32.abs().max().item())
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="a grid knob of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [1024, 2056, 8192, 16384])
def test_fp8_grid_per_sm(is_rms, n):
    """The CUDA forward's register path to e4m3 at 1, 3, 16 and 64 CTAs per SM
    (cuda_backend.norm_fwd_grid_per_sm) over 3001 rows: the FP8 bytes and amax equal the default
    grid's bit for bit (the grid changes no row's arithmetic; every block's amax reaches the one
    global max). The streamed and blocked kernels are off (register_path: RMSNorm's FP8 outputs
    take them by default from 4K), so that every width here runs the register path."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        x, w, b = inputs(3001, n, is_rms)
        with register_path():
            q0 = delayed(E4M3, scale=8.0, amax=0.0)
            t0 = call(is_rms, x, w, b, quantizer=q0)
            for v in (1, 3, 16, 64):
                with cuda_backend.norm_fwd_grid_per_sm(v):
                    q = delayed(E4M3, scale=8.0, amax=0.0)
                    t = call(is_rms, x, w, b, quantizer=q)
                assert torch.equal(t.data.view(torch.uint8), t0.data.view(torch.uint8)), v
                assert torch.equal(q.amax, q0.amax), v
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the row loops of the CUDA forward")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("m,n", [(33, 1024), (29, 1032), (40, 4096), (41, 5120), (301, 8200),
                                 (17, 16384), (37, 40000)])
def test_fwd_fast_loop_same_bits(is_rms, m, n):
    """The CUDA forward's fast row loop (FwdPath: FP8 in mode kFull, gamma / beta in shared or
    global memory) and its general loop (cuda_backend.norm_fwd_general_loop(1)) write the same
    bits: e4m3 and e5m2 bytes, amax and the in-kernel transposed copy, with and without a bf16
    residual (LayerNorm with a bias). 1032, 5120 and 8200 leave slots outside the row (zeros
    there in the fast loop), 16384 reads gamma from global memory, 40000 splits rows over a
    cluster, with its residual too; m is odd where row groups share a CTA, so a row block ends in
    masked rows. The streamed and blocked kernels are off (register_path: RMSNorm's FP8 outputs
    without a residual take them by default from 4K), so that 4096-16384 run the register path
    without a residual too. The fast loop runs in every
    FP8 test of the default against float64 and the fp32 output's cast where neither takes the
    row."""
    from engine import cuda_backend

    use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
    try:
        x, w, b = inputs(m, n, is_rms)
        r = torch.randn(m, n, device=DEVICE, dtype=BF16)
        runs = []
        for general in (0, 1):
            outs = []
            with cuda_backend.norm_fwd_general_loop(general), register_path():
                for fmt in (E4M3, E5M2):
                    for res in (None, r):
                        q = delayed(fmt, scale=3.0, amax=0.25, columnwise=True)
                        t = call(is_rms, x, w, b, quantizer=q, residual=res)
                        if res is not None:
                            t, res_out = t
                            outs.append(res_out)
                        outs += [t.data.view(torch.uint8), t.transpose_data.view(torch.uint8), q.amax]
            runs.append(outs)
        for fast, general in zip(*runs):
            assert torch.equal(fast, general)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the row loops of the CUDA forward")
@pytest.mark.parametrize("general", [0, 1], ids=["fast", "general"])
def test_fwd_loop_taken(general):
    """The launcher picks the build (FwdPath, the kernel's last template argument): by default an
    RMSNorm to e4m3 of 4096 runs the fast loop with gamma in shared memory (1), of 16384 (gamma
    past the shared memory the launcher allows) the fast loop reading it from global memory (3;
    4 for e5m2); with the knob, and for bf16 outputs and current scaling always, the general
    loop (0). The streamed and blocked kernels are off (register_path): FP8 outputs of 4096 and
    16384 take the blocked kernel by default (test_fp8_own_kernel_widths)."""
    from engine import cuda_backend

    use_backend("cuda")
    try:
        x, w, _ = inputs(64, 4096, True)
        xw, ww, _ = inputs(16, 16384, True)
        with cuda_backend.norm_fwd_general_loop(general), register_path():
            e4m3 = cuda_kernel_names(lambda: call(True, x, w, quantizer=delayed(E4M3)))
            wide = cuda_kernel_names(lambda: call(True, xw, ww, quantizer=delayed(E4M3)))
            wide5 = cuda_kernel_names(lambda: call(True, xw, ww, quantizer=delayed(E5M2)))
            bf16 = cuda_kernel_names(lambda: call(True, x, w))
            current = Float8CurrentScalingQuantizer(E4M3)
            cur = cuda_kernel_names(lambda: call(True, x, w, quantizer=current))

        def loops(names):  # the last template argument of each norm_fwd_reg_kernel launched
            return {n.split("(")[0].rsplit(",", 1)[1].strip(" >")
                    for n in names if "norm_fwd_reg_kernel" in n}

        assert loops(e4m3) == ({"0"} if general else {"1"})
        assert loops(wide) == ({"0"} if general else {"3"})
        assert loops(wide5) == ({"0"} if general else {"4"})
        assert loops(bf16) == {"0"}
        assert loops(cur) == {"0"}
    finally:
        engine.backend.reset_for_tests()


# (rows, cols, vectors per thread) of the lean FP8 kernel under its knob: more row blocks than CTAs
# (the prefetch's loop: 2101 x 4096 is 526 blocks of 4 rows, 701 x 16384 351 of 2), a partial last
# block (67, 301, 37), one row, widths not a power of two (5120: three row groups of 160 threads,
# 480 a CTA; 6144: two of 192; 12288), the narrowest row group (1024: one warp, no barrier) and the
# widest row (16384: one group of 512)
FP8_LEAN_CASES = [(2101, 4096), (67, 1024), (1, 8192), (301, 5120), (67, 6144), (37, 12288), (33, 16384),
                  (701, 16384)]
# (RMSNorm, zero-centred gamma, bias); weights of x's dtype only (fp32 weights keep the other
# kernels: test_fwd_fp8_lean_widths)
FP8_LEAN_KINDS = {"rms": (True, False, False), "rms-zc": (True, True, False),
                  "ln": (False, False, True), "ln-nobias-zc": (False, True, False)}


def fp8_lean_runs(names):
    """How many of ``names`` are the lean FP8 kernel's (norm_fwd_fp8_lean_kernel)."""
    return sum("norm_fwd_fp8_lean_kernel" in n for n in names)


@pytest.mark.skipif(not ON_GPU, reason="the lean FP8 kernel of the CUDA forward")
@pytest.mark.parametrize("kind,m,n", [pytest.param(k, m, n, id=f"{name}-{m}x{n}")
                                      for name, k in FP8_LEAN_KINDS.items() for m, n in FP8_LEAN_CASES])
@pytest.mark.parametrize("fp8_dtype", FP8)
def test_fwd_fp8_lean_kernel(kind, m, n, fp8_dtype):
    """CUDA's lean FP8 forward (norm_fwd_fp8_lean.cuh, NOTES P179, P181) under its knob at every
    width it fits (engine.cuda_backend.norm_fwd_fp8_lean(2)): it runs (its name among the
    launched kernels, once), and its bytes, amax and scale_inv are those of the register kernel
    at 4 vectors per thread (norm_fwd_vectors(4); the streamed, blocked and band kernels and
    clusters off), whose sums it adds in the same order: the exact cast of that kernel's fp32
    output, bit for bit, with its exact amax, where that kernel lays the row out as it does (rows
    of up to 8192, 256 threads); past that within one step of it at rounding boundaries. Against
    float64: at most one step, rarely. Also the zero-centred gamma (held in registers), LayerNorm
    without a bias, both formats; rows past the last row group of the grid's last block (2101,
    701, 301, 67, 37, 33 rows) are zero-filled and not written."""
    from engine import cuda_backend

    is_rms, zc, bias = kind
    use_backend("cuda")
    try:
        x, w, b = inputs(m, n, is_rms)
        if not bias:
            b = None
        kw = {"zero_centered_gamma": zc}
        exact = n <= 8192
        with lean_fp8_twin():
            y32 = call(is_rms, x, w, b, out_dtype=F32, **kw)
        if not exact:  # the default fp32 output, at 8 vectors per thread
            y32 = call(is_rms, x, w, b, out_dtype=F32, **kw)
        with cuda_backend.norm_fwd_fp8_lean(2):
            q = delayed(fp8_dtype, scale=3.0, amax=0.25)
            names = cuda_kernel_names(lambda: call(is_rms, x, w, b, quantizer=q, **kw))
            q = delayed(fp8_dtype, scale=3.0, amax=0.25)
            t = call(is_rms, x, w, b, quantizer=q, **kw)
        assert fp8_lean_runs(names) == 1, names
        assert t.data.dtype == fp8_dtype and t.data.shape == x.shape and t.transpose_data is None
        assert_cast_of(t.data, y32, 3.0, b, exact=exact)
        if exact:
            assert q.amax.item() == max(0.25, y32.abs().max().item())
        else:
            assert q.amax.item() == pytest.approx(max(0.25, y32.abs().max().item()), rel=1e-5)
        assert t.scale_inv.item() == (1.0 / torch.tensor(3.0)).item()
        oracle = fp8_quantize(ref_fwd(x, w, b, 1e-5, is_rms, zc)["y"], 3.0, fp8_dtype)
        steps = fp8_steps(t.data, oracle)
        assert steps.max().item() <= 1
        assert (steps > 0).float().mean().item() < 0.01
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the dispatch of the CUDA forward")
@pytest.mark.parametrize("knob", [0, 1, 2])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_fwd_fp8_lean_widths(knob, dram_class):
    """Where the lean FP8 kernel runs (fp8_lean_takes): by default (knob 0) on a card that is not
    lean at RMSNorm's 4096, 8192, 12288 and 16384 and LayerNorm's 4096, 6144 and 8192 (NOTES
    P181b, P186c; not RMSNorm's 6144 or LayerNorm's 12288), never on a lean one; never under
    knob 1; under knob 2, on either card class, wherever its row groups are whole: not 1000, 4104
    or 32768 and up. Delayed scaling of a bf16 x without a residual, with a transposed
    copy made after the norm too (the copy the rowwise bytes transposed). Never current scaling, a
    residual, fp32 weights, or a copy asked of the kernel (ENGINE_NORM_EXTERNAL_TRANSPOSE=0)."""
    from engine import cuda_backend

    use_backend("cuda")
    lean = dram_class == 1
    try:
        with cuda_backend.dram_class(dram_class), cuda_backend.norm_fwd_fp8_lean(knob):
            for is_rms, n in [(True, 1000), (True, 2048), (True, 4096), (True, 6144), (True, 8192),
                              (True, 12288), (True, 16384), (True, 32768), (True, 65536), (True, 4104),
                              (False, 2048), (False, 4096), (False, 6144), (False, 8192), (False, 12288),
                              (False, 16384), (False, 32768)]:
                x, w, b = inputs(8, n, is_rms)
                want = fp8_lean_takes(is_rms, n, knob, lean)
                names = cuda_kernel_names(lambda: call(is_rms, x, w, b, quantizer=delayed(E4M3)))
                assert fp8_lean_runs(names) == want, (is_rms, n, names)
            x, w, _ = inputs(67, 8192, True)
            want = fp8_lean_takes(True, 8192, knob, lean)
            q = delayed(E4M3, columnwise=True)
            t = None

            def with_copy():
                nonlocal t
                t = call(True, x, w, quantizer=q)
            assert fp8_lean_runs(cuda_kernel_names(with_copy)) == want
            assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
            cur = Float8CurrentScalingQuantizer(E4M3)
            assert fp8_lean_runs(cuda_kernel_names(lambda: call(True, x, w, quantizer=cur))) == 0
            r = torch.randn_like(x)
            assert fp8_lean_runs(cuda_kernel_names(
                lambda: call(True, x, w, quantizer=delayed(E4M3), residual=r))) == 0
            w32 = w.float()
            assert fp8_lean_runs(cuda_kernel_names(lambda: call(True, x, w32, quantizer=delayed(E4M3)))) == 0
        use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
        with cuda_backend.dram_class(dram_class), cuda_backend.norm_fwd_fp8_lean(knob):
            names = cuda_kernel_names(lambda: call(True, x, w, quantizer=delayed(E4M3, columnwise=True)))
            assert fp8_lean_runs(names) == 0, names
    finally:
        engine.backend.reset_for_tests()


# (rows, cols, band knob): the band kernel (512 columns per CTA; knob 2 / 3: wherever it fits, in
# the layout with tiles of their own / the tile in the stage; knob 4: 1024 columns per CTA, the
# tile in the stage; 0: the launcher's default, which depends on the card's class) on a
# partial band (29 rows, M % 16 != 0: the transposed copy's byte stores), one row, a last slice
# shorter than the CTA's (1000, 1032, 7800), a 16-CTA cluster (8192, 7800) and more bands than
# resident clusters (6000 / 2100 / 700 rows: several bands per cluster, every exchange slot reused
# and its mbarrier phase flipped).
# M odd or a multiple of 16: an even M % 16 != 0 sends the copy to the tiled transpose even when
# asked in-kernel (NOTES P137)
BAND_CASES = [(29, 1000, 2), (1, 4096, 3), (6000, 2048, 0), (33, 1032, 0), (2101, 4096, 2),
              (2101, 4096, 3), (45, 7800, 3), (701, 8192, 0), (64, 512, 2), (29, 1000, 3),
              # 32 x 1024 per CTA (NOTES P117): a full and a short last slice, one row, a partial
              # last band, a rank with no columns
              (531, 16384, 4), (37, 15000, 4), (1, 16384, 4), (71, 12000, 4), (301, 1000, 4)]


@pytest.mark.skipif(not ON_GPU, reason="the band kernel of the CUDA forward (sm_90 clusters)")
@pytest.mark.parametrize("is_rms,zc,bias", [(True, False, False), (True, True, False),
                                            (False, False, True), (False, True, False)],
                         ids=["rms", "rms-zc", "ln", "ln-nobias-zc"])
@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("m,n,band", BAND_CASES)
def test_fp8_band_kernel(is_rms, zc, bias, fp8_dtype, m, n, band):
    """The band kernel (FP8 output and its transposed copy in one kernel, norm_fwd_band.cuh),
    asked for by ENGINE_NORM_EXTERNAL_TRANSPOSE=0: it runs (its name among the launched kernels),
    transpose_data is data.T bit for bit, the bytes are within one FP8 step of the cast of the
    same call's fp32 output (another kernel: another order of the row sums), at rounding
    boundaries only, amax is that output's max|y| to the last bits, scale_inv = 1 / scale, and the
    bytes are within one step of the float64 oracle's (rarely). Poisoned outputs: every byte of
    both copies is written."""
    check_band_kernel(is_rms, zc, bias, fp8_dtype, m, n, band, BF16)


@pytest.mark.skipif(not ON_GPU, reason="the band kernel of the CUDA forward (sm_90 clusters)")
@pytest.mark.parametrize("is_rms,bias", [(True, False), (False, True)], ids=["rms", "ln"])
@pytest.mark.parametrize("m,n,band", [(301, 2048, 2), (45, 7800, 3), (531, 16384, 4), (71, 4096, 0)])
def test_fp8_band_kernel_fp16(is_rms, bias, m, n, band):
    """The band kernel's fp16 x builds (every configuration; test_fp8_band_kernel's checks)."""
    check_band_kernel(is_rms, False, bias, E4M3, m, n, band, torch.float16)


def check_band_kernel(is_rms, zc, bias, fp8_dtype, m, n, band, x_dtype):
    """test_fp8_band_kernel's checks for an x of ``x_dtype``."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("thread-block clusters need sm_90")
    from engine import cuda_backend

    use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
    try:
        x = torch.randn(m, n, device=DEVICE, dtype=x_dtype)
        if not is_rms:
            x[: m // 2] += 8.0  # rows of a large mean against their spread: the centred pass
        w = (torch.rand(n, device=DEVICE) + 0.5).to(x_dtype)
        b = torch.randn(n, device=DEVICE).to(x_dtype) if bias else None
        kw = dict(zero_centered_gamma=zc)
        with cuda_backend.norm_fwd_band(band):
            y32 = call(is_rms, x, w, b, out_dtype=F32, **kw)
            q = delayed(fp8_dtype, scale=3.0, amax=0.25, columnwise=True)
            out = []
            names = cuda_kernel_names(lambda: out.append(call(is_rms, x, w, b, quantizer=q, **kw)))
        assert any("norm_fwd_band_kernel" in name for name in names), names
        assert not any("byte_transpose_kernel" in name for name in names)
        t = out[0]
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
        ref = ref_fwd(x, w, b, 1e-5, is_rms, zero_centered_gamma=zc)
        # the addends of y = (z - mean) * rsigma * g + b, which the statistics' last bits move
        g = w.double() + 1.0 if zc else w.double()
        terms = (x.double().abs() + ref["mu"].abs()[:, None]) * ref["rsigma"][:, None] * g.abs()
        if b is not None:
            terms = terms + b.double().abs()
        assert_cast_of(t.data, y32, 3.0, b, exact=False, terms=terms.float())
        ymax = y32.abs().max().item()
        assert abs(q.amax.item() - max(0.25, ymax)) <= 1e-6 * ymax
        assert torch.equal(t.scale_inv, torch.tensor([1.0 / 3.0], device=DEVICE))
        # every byte written: a second call into poisoned buffers gives the same bytes, on a grid
        # cut to one or two clusters by sm_margin, so that each cluster walks many bands: every
        # stage of the ring refilled (the tile over its stage in layout 2) and every exchange slot
        # reused, where the default grid gives most clusters two or three bands
        margin = torch.cuda.get_device_properties(DEVICE).multi_processor_count - 4
        data = torch.full((m, n), 0x7F, dtype=torch.uint8, device=DEVICE).view(fp8_dtype)
        data_t = torch.full((n, m), 0x7F, dtype=torch.uint8, device=DEVICE).view(fp8_dtype)
        with cuda_backend.norm_fwd_band(band):
            mu = torch.empty(m, device=DEVICE) if not is_rms else None
            rs = torch.full((m,), float("nan"), device=DEVICE)
            cuda_backend.norm_fwd(x, w, b, None, 1e-5, data, None, mu, rs,
                                  torch.tensor([3.0], device=DEVICE), torch.zeros(1, device=DEVICE),
                                  torch.empty(1, device=DEVICE), data_t, is_rms_norm=is_rms,
                                  zero_centered_gamma=zc, current_scaling=False, amax_epsilon=0.0,
                                  sm_margin=margin)
        assert torch.equal(data.view(torch.uint8), t.data.view(torch.uint8))
        assert torch.equal(data_t.view(torch.uint8), t.transpose_data.view(torch.uint8))
        torch.testing.assert_close(rs, ref["rsigma"].float(), rtol=1e-5, atol=0)
        if not is_rms:
            torch.testing.assert_close(mu, ref["mu"].float(), rtol=1e-5, atol=1e-5)
        oracle = fp8_quantize(ref["y"], 3.0, fp8_dtype)
        steps = fp8_steps(t.data, oracle)
        assert steps.max().item() <= 1
        assert (steps > 0).float().mean().item() < 0.01
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the band kernel of the CUDA forward")
def test_fp8_band_kernel_off():
    """norm_fwd_band(1): the band kernel does not run; 2K's transposed copy in-kernel then comes
    from the register path's tile, data.T bit for bit."""
    from engine import cuda_backend

    use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
    try:
        x, w, _ = inputs(64, 2048, True)
        q = delayed(E4M3, columnwise=True)
        out = []
        with cuda_backend.norm_fwd_band(1):
            names = cuda_kernel_names(lambda: out.append(call(True, x, w, quantizer=q)))
        assert not any("norm_fwd_band_kernel" in name for name in names)
        t = out[0]
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


# (norm, n, form) -> the default's writer of the transposed copy by card class (1 lean, 2 wide):
# None the register path's tile (no other kernel), "transpose" the tiled transpose after the norm,
# else the band kernel's configuration (norm_fwd_band.cuh: fwd_band_cfg; 1 / 2: 512 columns per
# CTA, tiles of their own / the tile in the stage; 3: 1024 columns per CTA).
TRANSPOSE_DEFAULT = {
    ("rms", 1024, "plain"): {1: None, 2: None}, ("rms", 2048, "plain"): {1: 1, 2: 2},
    ("rms", 8192, "plain"): {1: 1, 2: 2}, ("rms", 8200, "plain"): {1: 3, 2: "transpose"},
    ("rms", 16384, "plain"): {1: 3, 2: "transpose"},
    ("rms", 16392, "plain"): {1: "transpose", 2: "transpose"},
    ("rms", 4096, "residual"): {1: "transpose", 2: "transpose"},
    ("rms", 4096, "current"): {1: "transpose", 2: "transpose"},
    ("ln", 1024, "plain"): {1: None, 2: None}, ("ln", 2048, "plain"): {1: 3, 2: "transpose"},
    ("ln", 16384, "plain"): {1: 3, 2: "transpose"},
    ("ln", 16392, "plain"): {1: "transpose", 2: "transpose"},
}
BAND_CFG_OF = {(2, "false", 1): 1, (2, "true", 2): 2, (4, "true", 1): 3}


def band_cfg_of(names):
    """The band kernel's configuration (BAND_CFG_OF) among launched kernels' names, None if none
    ran; asserts at most one ran and that its name shows its shape."""
    band = [name for name in names if "norm_fwd_band_kernel" in name]
    assert len(band) <= 1, names
    if not band:
        return None
    shape = re.search(r"BandShape<(\d+)>\s*,\s*(true|false)\s*,\s*(\d+)", band[0])
    assert shape is not None, band[0]
    return BAND_CFG_OF[(int(shape[1]), shape[2], int(shape[3]))]


@pytest.mark.skipif(not ON_GPU, reason="which CUDA kernels write the transposed copy")
@pytest.mark.parametrize("norm,n,form", list(TRANSPOSE_DEFAULT))
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_default_transpose_path_by_width(monkeypatch, norm, n, form, dram_class):
    """With ENGINE_NORM_EXTERNAL_TRANSPOSE unset the CUDA backend writes the transposed copy
    (TRANSPOSE_DEFAULT, by card class: engine.cuda_backend.dram_class) of rows of 1024 in the
    norm kernel (the register path's tile), of RMSNorm's rows of 2K-8K in the band kernel (layout
    1 on a lean card, 2 on a wide one), of 8K-16K on a lean card in its configuration of 1024
    columns per CTA, LayerNorm's of 2K-16K too (NOTES P117), and otherwise with the tiled
    transpose after the norm: wider rows, the residual form and current scaling (which the band
    kernel does not take; out_t_auto: not the register path's 16-row tile, 30 % of copy). Each is
    data.T bitwise."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the band kernel needs thread-block clusters (sm_90)")
    from engine import cuda_backend

    monkeypatch.setattr(cuda_backend, "SMALL_COPY_ROWS", 0)  # the width defaults alone (P141)
    use_backend("cuda")
    try:
        is_rms = norm == "rms"
        x, w, b = inputs(64, n, is_rms)
        r = torch.randn_like(x) if form == "residual" else None
        out = []
        q = (Float8CurrentScalingQuantizer(E4M3, columnwise=True) if form == "current"
             else delayed(E4M3, columnwise=True))
        kw = {} if r is None else {"residual": r}
        with cuda_backend.dram_class(dram_class):
            names = cuda_kernel_names(lambda: out.append(call(is_rms, x, w, b, quantizer=q, **kw)))
        want = TRANSPOSE_DEFAULT[(norm, n, form)][dram_class]
        tiled = any("byte_transpose_kernel" in name for name in names)
        assert tiled is (want == "transpose"), names
        assert band_cfg_of(names) == (want if isinstance(want, int) else None), names
        t = out[0] if r is None else out[0][0]
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


def lean_copy_kernels(is_rms, m, n):
    """The CUDA kernels one norm to e4m3 with its transposed copy launches on a lean card's
    defaults (``engine.cuda_backend.dram_class(1)``), through the public API and the process's
    ENGINE_NORM_EXTERNAL_TRANSPOSE; asserts the copy is data.T bitwise."""
    from engine import cuda_backend

    x, w, b = inputs(m, n, is_rms)
    out = []
    with cuda_backend.dram_class(1):
        names = cuda_kernel_names(lambda: out.append(call(is_rms, x, w, b,
                                                          quantizer=delayed(E4M3, columnwise=True))))
    t = out[0]
    assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    return names


@pytest.mark.skipif(not ON_GPU, reason="which CUDA kernels write the transposed copy")
@pytest.mark.parametrize("m", [18, 20, 40, 17, 48])
@pytest.mark.parametrize("norm,n", [("rms", 1024), ("rms", 2048), ("ln", 4096)])
@pytest.mark.parametrize("external", [None, "0"], ids=["unset", "in-kernel"])
def test_transpose_path_narrow_rows(monkeypatch, norm, n, m, external):
    """With ENGINE_NORM_EXTERNAL_TRANSPOSE unset or 0, a copy whose rows of M bytes are 2-, 4- or
    8-byte aligned runs (M even, M % 16 != 0) comes from the tiled transpose after the norm, not
    from the norm kernel (the band kernel and the register path's tile would store such runs in
    bytes; the tiled transpose stores them in the runs' width: NOTES P134-P137); odd M and M % 16
    == 0 keep the norm kernel's copy (on a lean card, where both settings pick the same writer at
    these widths: the register path's tile at 1K, the band kernel at 2K-4K). The copy is data.T
    bitwise."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the band kernel needs thread-block clusters (sm_90)")
    from engine import cuda_backend

    monkeypatch.setattr(cuda_backend, "SMALL_COPY_ROWS", 0)  # the width defaults alone (P141)
    use_backend("cuda", **({} if external is None else {"ENGINE_NORM_EXTERNAL_TRANSPOSE": external}))
    try:
        names = lean_copy_kernels(norm == "rms", m, n)
        narrow = m % 16 != 0 and m % 2 == 0
        tiled = any("byte_transpose_kernel" in name for name in names)
        assert tiled is narrow, names
        band = band_cfg_of(names)
        assert (band is None) if (narrow or n == 1024) else (band is not None), names
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="which CUDA kernels write the transposed copy")
@pytest.mark.parametrize("norm,m,n,small", [
    (norm, m, n, small) for norm in ("rms", "ln")
    for m, n, small in [(32, 1024, True), (48, 4096, True), (2048, 4096, True), (4096, 2048, True),
                        (4096, 4096, norm == "ln"), (2048, 8192, norm == "ln"),
                        (8192, 1024, False), (8192, 2048, False)]])
def test_default_transpose_path_small_copies(norm, m, n, small):
    """With ENGINE_NORM_EXTERNAL_TRANSPOSE unset, a copy of at most cuda_backend.SMALL_COPY_ROWS
    rows and the norm's SMALL_COPY_VALUES (8M values for RMSNorm, 16M for LayerNorm) comes from
    the tiled transpose after the norm (the in-kernel writers leave SMs idle there: NOTES Q32,
    P141, Q33, P142); larger ones keep the width defaults (at these widths an in-kernel writer on
    a lean card: the band kernel or the register path's tile). The copy is data.T bitwise."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the band kernel needs thread-block clusters (sm_90)")
    use_backend("cuda")
    try:
        names = lean_copy_kernels(norm == "rms", m, n)
        tiled = any("byte_transpose_kernel" in name for name in names)
        assert tiled is small, names
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="which CUDA kernels a norm to FP8 launches")
@pytest.mark.parametrize("norm,n", [("rms", 24576), ("rms", 32768), ("ln", 32768), ("rms", 40960)])
@pytest.mark.parametrize("external", [None, "1"], ids=["unset", "external"])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_fp8_alone_kernel_by_copy(norm, n, external, dram_class):
    """Through the public API (ENGINE_NORM_EXTERNAL_TRANSPOSE unset, or 1), whether the quantizer
    asks for the transposed copy chooses the norm's kernel (NOTES P133): on a lean card delayed
    scaling without the copy runs the register path's clusters at RMSNorm 16K-32K and LayerNorm
    32K, with it the streamed kernel and then the tiled transpose; past 32K, on a wide card, and
    in current scaling (its statistics pass), the stream either way. The copy is data.T bitwise."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the streamed kernel needs thread-block clusters (sm_90)")
    from engine import cuda_backend

    use_backend("cuda", **({} if external is None else {"ENGINE_NORM_EXTERNAL_TRANSPOSE": external}))
    try:
        is_rms = norm == "rms"
        x, w, b = inputs(64, n, is_rms)
        for quantizer in (delayed(E4M3), delayed(E4M3, columnwise=True),
                          Float8CurrentScalingQuantizer(E4M3)):
            out = []
            with cuda_backend.dram_class(dram_class):
                names = cuda_kernel_names(lambda: out.append(call(is_rms, x, w, b, quantizer=quantizer)))
            copy = quantizer.columnwise
            alone = not copy and isinstance(quantizer, Float8Quantizer)
            stream = not (alone and dram_class == 1 and n <= 32768)
            assert any("norm_fwd_stream_kernel" in name for name in names) is stream, names
            assert any("byte_transpose_kernel" in name for name in names) is copy, names
            if copy:
                t = out[0]
                assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="which CUDA kernel writes the transposed copy in-kernel")
@pytest.mark.parametrize("norm,n,want", [("rms", 2048, {1: 1, 2: 2}), ("rms", 16384, {1: 3, 2: 3}),
                                         ("ln", 2048, {1: 3, 2: 3}), ("ln", 16384, {1: 3, 2: 3}),
                                         ("ln", 16392, {1: None, 2: None})])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_in_kernel_transpose_band_by_class(norm, n, want, dram_class):
    """Asked for the transposed copy in-kernel (ENGINE_NORM_EXTERNAL_TRANSPOSE=0), the CUDA
    forward takes the band kernel wherever the card's defaults have one (fwd_band_cfg), also on a
    wide card where out_t_auto takes the tiled transpose instead (RMSNorm 8K-16K, LayerNorm
    2K-16K: configuration 3 beats the register path's 16-row tile and layout 2 there, NOTES
    P117); beyond 16K no band kernel fits, and the tiled transpose after the norm writes it. data.T
    bitwise either way."""
    if torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("the band kernel needs thread-block clusters (sm_90)")
    from engine import cuda_backend

    use_backend("cuda", ENGINE_NORM_EXTERNAL_TRANSPOSE="0")
    try:
        is_rms = norm == "rms"
        x, w, b = inputs(48, n, is_rms)  # M % 16 == 0: not the narrow copy's hand-off (P137)
        out = []
        with cuda_backend.dram_class(dram_class):
            names = cuda_kernel_names(
                lambda: out.append(call(is_rms, x, w, b, quantizer=delayed(E4M3, columnwise=True))))
        assert band_cfg_of(names) == want[dram_class], names
        # beyond 16K the norm's path hands the copy to the tiled transpose (no tile of 16 rows fits)
        tiled = any("byte_transpose_kernel" in name for name in names)
        assert tiled is (want[dram_class] is None), names
        t = out[0]
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="shapes of 4M-16M values (the interpreter would take minutes)")
@pytest.mark.parametrize("m,n,after", [(8192, 1024, True), (4096, 2048, True), (8208, 512, False),
                                       (16384, 1024, False), (8192, 2048, False)])
def test_triton_small_copies_after_the_norm(m, n, after, monkeypatch):
    """Through the public API on Triton, with ENGINE_NORM_EXTERNAL_TRANSPOSE unset: an RMSNorm copy
    of at most triton_kernels.SMALL_COPY_ROWS (8192) rows and 8M values comes from the tiled
    transpose after the norm (counted here), a larger one from the norm kernel's bands (at these
    widths the bands' default on both card classes; NOTES Q34, P144). The copy is data.T bitwise."""
    use_backend("triton")
    from engine.triton_kernels import transpose

    calls = []
    real = transpose.fp8_transpose
    monkeypatch.setattr(transpose, "fp8_transpose", lambda d, t, *a: (calls.append(d.shape), real(d, t, *a)))
    try:
        x, w, _ = inputs(m, n, True)
        with torch.no_grad():
            t = engine.rmsnorm(x, w, quantizer=delayed(E4M3, columnwise=True))
        assert calls == ([(m, n)] if after else [])
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("m", [40, 18, 17, 32])
def test_triton_in_kernel_narrow_rows(m, monkeypatch):
    """Triton's norm_fwd asked for the copy in-kernel (neither out_t_auto nor out_t_after): the
    norm kernel's bands write it, except where M is even and M % 16 != 0 (narrow_copy: its runs
    2-, 4- or 8-byte aligned, which the bands would store byte by byte), where the tiled transpose
    after the norm does (counted here; NOTES P137). The copy is out.T either way."""
    use_backend("triton")  # skips on a CPU without the interpreter
    from engine.triton_kernels import norms, transpose

    calls = []
    real = transpose.fp8_transpose
    monkeypatch.setattr(transpose, "fp8_transpose", lambda d, t, *a: (calls.append(d.shape), real(d, t, *a)))
    try:
        n = 256
        x, w, _ = inputs(m, n, True)
        data = torch.empty(m, n, dtype=E4M3, device=DEVICE)
        data_t = torch.empty(n, m, dtype=E4M3, device=DEVICE)
        norms.norm_fwd(x, w, None, None, 1e-5, data, None, None, torch.empty(m, device=DEVICE),
                       torch.tensor([2.0], device=DEVICE), torch.zeros(1, device=DEVICE),
                       torch.empty(1, device=DEVICE), data_t, is_rms_norm=True,
                       zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0,
                       sm_margin=0)
        narrow = m % 16 != 0 and m % 2 == 0
        assert norms.narrow_copy(m) is narrow
        assert calls == ([(m, n)] if narrow else [])
        assert torch.equal(data_t.view(torch.uint8), data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("t_path", ["out_t_auto", "out_t_after"])
def test_out_t_auto_on_each_backend(backend, is_rms, t_path):
    """The backends' norm_fwd with ``out_t_auto=True`` (ENGINE_NORM_EXTERNAL_TRANSPOSE unset) or
    ``out_t_after=True`` (set to 1, or rows wider than the backend's IN_KERNEL_TRANSPOSE_MAX_N):
    whichever path each takes (the reference's one path, Triton's bands for RMSNorm and its tiled
    transpose after the norm for LayerNorm, CUDA's band kernel at 2048 or the register path's tile
    at 64; with out_t_after every backend's tiled transpose after the norm), out_t is out.T bit
    for bit and out is the bytes of the call without a transposed copy (within one step where
    the band kernel's own row sums add in another order). Both flags at once raise."""
    from engine import _norm_ops

    use_backend(backend)
    try:
        x, w, b = inputs(5, 64, is_rms)
        impl = _norm_ops._impl(is_rms, x.device)
        with pytest.raises(ValueError, match="exclude each other"):
            impl.norm_fwd(x, w, b, None, 1e-5, torch.empty(5, 64, dtype=E4M3, device=DEVICE), None,
                          None if is_rms else torch.empty(5, device=DEVICE),
                          torch.empty(5, device=DEVICE), torch.tensor([2.0], device=DEVICE),
                          torch.zeros(1, device=DEVICE), torch.empty(1, device=DEVICE),
                          torch.empty(64, 5, dtype=E4M3, device=DEVICE), is_rms_norm=is_rms,
                          zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0,
                          sm_margin=0, out_t_auto=True, out_t_after=True)
        for n in (64, 2048):
            x, w, b = inputs(37, n, is_rms)
            impl = _norm_ops._impl(is_rms, x.device)
            outs = []
            for with_t in (True, False):
                data = torch.empty(37, n, dtype=E4M3, device=DEVICE)
                data_t = torch.empty(n, 37, dtype=E4M3, device=DEVICE) if with_t else None
                mu = None if is_rms else torch.empty(37, device=DEVICE)
                impl.norm_fwd(x, w, b, None, 1e-5, data, None, mu, torch.empty(37, device=DEVICE),
                              torch.tensor([2.0], device=DEVICE), torch.zeros(1, device=DEVICE),
                              torch.empty(1, device=DEVICE), data_t, is_rms_norm=is_rms,
                              zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0,
                              sm_margin=0, **{t_path: True})
                outs.append((data, data_t))
            (data, data_t), (plain, _) = outs
            assert torch.equal(data_t.view(torch.uint8), data.view(torch.uint8).t())
            steps = fp8_steps(data, plain)  # the band kernel's own row sums: one step at most
            assert steps.max().item() <= 1 and (steps > 0).float().mean().item() < 0.01
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("residual,current", [(False, False), (True, False), (False, True)],
                         ids=["plain", "residual", "current"])
@pytest.mark.parametrize("dram_class", [1, 2], ids=["lean", "wide"])
def test_triton_out_t_auto_path(is_rms, residual, current, dram_class, monkeypatch):
    """Triton's norm_fwd with ``out_t_auto``: bands in the norm kernel for RMSNorm with delayed
    scaling and no residual (the form measured faster, NOTES P106), up to 4096 on a lean card (the
    H100) and 2048 on a wide one (the H200; NOTES P109, utils.DRAM_CLASS forces each), the tiled
    transpose after the norm otherwise (counted here), and wherever M is even and not a multiple of
    16 (the copy's runs 2-, 4- or 8-byte aligned: the tiled transpose's narrow stores, where the
    bands store bytes; NOTES P135); the copy is out.T either way."""
    use_backend("triton")  # skips on a CPU without the interpreter
    from engine.triton_kernels import norms, transpose, utils

    calls = []
    real = transpose.fp8_transpose
    monkeypatch.setattr(transpose, "fp8_transpose", lambda d, t, *a: (calls.append(d.shape), real(d, t, *a)))
    monkeypatch.setattr(utils, "DRAM_CLASS", dram_class)
    widest = 4096 if dram_class == 1 else 2048
    try:
        for m, n in ((32, 256), (40, 256), (17, 256), (40, 2056), (32, 4096), (40, 4104)):
            x, w, b = inputs(m, n, is_rms)
            r = torch.randn(m, n, device=DEVICE, dtype=BF16) if residual else None
            data = torch.empty(m, n, dtype=E4M3, device=DEVICE)
            data_t = torch.empty(n, m, dtype=E4M3, device=DEVICE)
            calls.clear()
            norms.norm_fwd(x, w, b, r, 1e-5, data, torch.empty_like(x) if residual else None,
                           None if is_rms else torch.empty(m, device=DEVICE), torch.empty(m, device=DEVICE),
                           torch.tensor([2.0], device=DEVICE), torch.zeros(1, device=DEVICE),
                           torch.empty(1, device=DEVICE), data_t, is_rms_norm=is_rms,
                           zero_centered_gamma=False, current_scaling=current, amax_epsilon=0.0,
                           sm_margin=0, out_t_auto=True)
            narrow = m % 16 != 0 and m % 2 == 0  # the copy's runs 2-, 4- or 8-byte aligned
            bands = is_rms and n <= widest and not residual and not current and not narrow
            assert bands == (norms.band_by_default(n, is_rms, residual, current, x.device)
                             and not norms.narrow_copy(m))
            assert calls == ([] if bands else [(m, n)]), n
            assert torch.equal(data_t.view(torch.uint8), data.view(torch.uint8).t())
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.parametrize("is_rms", NORMS)
def test_fp8_with_residual(backend, is_rms):
    x, w, b = inputs(29, 760, is_rms)
    r = torch.randn(29, 760, device=DEVICE)
    t, res_out = call(is_rms, x, w, b, residual=r, quantizer=delayed(E4M3))
    y32, res_out32 = call(is_rms, x, w, b, residual=r, out_dtype=F32)
    assert torch.equal(res_out, res_out32)
    assert torch.equal(t.data.view(torch.uint8), fp8_quantize(y32, 1.5, E4M3).view(torch.uint8))


def test_fp8_needs_no_grad(backend):
    x = torch.randn(4, 32, device=DEVICE, requires_grad=True)
    with pytest.raises(NotImplementedError, match="forward-only"):
        engine.rmsnorm(x, torch.ones(32, device=DEVICE), quantizer=delayed(E4M3))


@pytest.mark.parametrize("fp8_dtype", FP8)
@pytest.mark.parametrize("m,n", [(173, 409), (64, 64), (1, 1000), (300, 1)])
@pytest.mark.parametrize("usage", ["both", "rowwise", "columnwise"])
def test_cast_transpose(backend, fp8_dtype, m, n, usage):
    x = torch.randn(m, n, device=DEVICE, dtype=BF16) * 3
    rowwise, columnwise = usage in ("both", "rowwise"), usage in ("both", "columnwise")
    q = Float8Quantizer(torch.tensor([2.0], device=DEVICE), torch.zeros(1, device=DEVICE), fp8_dtype,
                        rowwise=rowwise, columnwise=columnwise)
    t = engine.cast_transpose(x, q)
    expect = fp8_quantize(x.float(), 2.0, fp8_dtype)
    assert q.amax.item() == x.float().abs().max().item()
    assert t.scale_inv.item() == 0.5
    if rowwise:
        assert torch.equal(t.data.view(torch.uint8), expect.view(torch.uint8))
    else:
        assert t.data is None
    if columnwise:
        assert torch.equal(t.transpose_data.view(torch.uint8), expect.view(torch.uint8).t())
    else:
        assert t.transpose_data is None
    assert t.shape == x.shape


def test_cast_transpose_current_scaling(backend):
    x = torch.randn(3, 5, 77, device=DEVICE, dtype=BF16)
    q = Float8CurrentScalingQuantizer(E5M2, columnwise=True)
    t = engine.cast_transpose(x, q)
    amax = x.float().abs().max()
    scale = torch.tensor(torch.finfo(E5M2).max, device=DEVICE) / amax  # one IEEE division
    assert q.amax.item() == amax.item() and q.scale.item() == scale.item()
    expect = fp8_quantize(x.float(), scale.item(), E5M2)
    assert torch.equal(t.data.view(torch.uint8), expect.view(torch.uint8))
    assert torch.equal(t.transpose_data.view(torch.uint8), expect.reshape(-1, 77).view(torch.uint8).t())


def test_fp8_transpose(backend):
    x = torch.randn(133, 250, device=DEVICE, dtype=BF16)
    t = engine.cast_transpose(x, delayed(E4M3))
    assert t.transpose_data is None
    engine.fp8_transpose(t)
    assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())


@pytest.mark.parametrize("order", [1, 2])
@pytest.mark.parametrize("shape", [(133, 250), (1, 17), (300, 520)])
def test_fp8_transpose_orders(backend, order, shape):
    """The tiled FP8 transpose in either tile order (NOTES P114: 1 the first rows first, 2 the last
    rows first with evict-first stores of the copy; engine.cuda_backend.fp8_transpose_order and
    its Triton twin engine.triton_kernels.transpose.FP8_TRANSPOSE_ORDER): the copy is the data
    transposed bit for bit, every byte written (poisoned with 0x7f, an e4m3 NaN, which the data
    never holds), over partial tiles and, at 300 x 520, more tiles than the persistent grid
    (3 x 5 tiles of 128 x 128; the interpreter's grid is 2 programs per stand-in SM). The
    reference backend has one order; it runs as a check of the test."""
    from engine.backend import OpFamily, select
    from engine.triton_kernels import transpose

    x = torch.randn(*shape, device=DEVICE, dtype=BF16)
    data = engine.cast_transpose(x, delayed(E4M3)).data
    assert not (data.view(torch.uint8) == 0x7F).any()
    out_t = torch.full((shape[1], shape[0]), 0x7F, device=DEVICE, dtype=torch.uint8).view(E4M3)
    saved = transpose.FP8_TRANSPOSE_ORDER
    with contextlib.ExitStack() as stack:
        if backend == "cuda":
            from engine import cuda_backend

            stack.enter_context(cuda_backend.fp8_transpose_order(order))
        transpose.FP8_TRANSPOSE_ORDER = order
        try:
            select(OpFamily.CAST_TRANSPOSE, data.device).fp8_transpose(data, out_t)
        finally:
            transpose.FP8_TRANSPOSE_ORDER = saved
    assert torch.equal(out_t.view(torch.uint8), data.view(torch.uint8).t())


@pytest.mark.parametrize("m", [18, 20, 24, 17, 130, 200])
@pytest.mark.parametrize("order", [1, 2])
def test_transposed_copy_narrow_runs(backend, m, order):
    """Copies whose rows of m bytes are not 16-byte runs (m mod 16 = 2, 4, 8: CUDA's kernels
    write them in 2-, 4- and 8-byte pieces, the kNarrow form of store_tile_transposed; 17 odd:
    bytes) over more than one tile of rows (130, 200 against tiles of 64 and 128 rows), in either
    tile order, from cast_transpose, fp8_transpose and a norm's copy (after the norm:
    ENGINE_NORM_EXTERNAL_TRANSPOSE=1; and the default, which sends the even m here too, NOTES
    P135): every byte of the copy written (poisoned with 0x7f, an e4m3 NaN the data never holds)
    and the data transposed bit for bit; fp8_transpose's copy also at addresses 1, 2, 4 and 8
    bytes past an aligned one (the pieces' width follows the address: NOTES P136), with the
    bytes around it untouched."""
    from engine.backend import OpFamily, select
    from engine.triton_kernels import transpose

    n = 260
    x = torch.randn(m, n, device=DEVICE, dtype=BF16)
    saved = transpose.FP8_TRANSPOSE_ORDER
    with contextlib.ExitStack() as stack:
        if backend == "cuda":
            from engine import cuda_backend

            stack.enter_context(cuda_backend.fp8_transpose_order(order))
        transpose.FP8_TRANSPOSE_ORDER = order
        stack.callback(setattr, transpose, "FP8_TRANSPOSE_ORDER", saved)
        t = engine.cast_transpose(x, delayed(E4M3, columnwise=True))
        data = t.data.view(torch.uint8)
        assert not (data == 0x7F).any()
        assert torch.equal(t.transpose_data.view(torch.uint8), data.t())
        for off in (0, 1, 2, 4, 8):  # the copy at an address of 1-, 2-, 4- or 8-byte alignment
            buf = torch.full((n * m + 16,), 0x7F, device=DEVICE, dtype=torch.uint8)
            out_t = buf[off:off + n * m].view(n, m).view(E4M3)
            select(OpFamily.CAST_TRANSPOSE, x.device).fp8_transpose(t.data, out_t)
            assert torch.equal(out_t.view(torch.uint8), data.t()), off
            assert (buf[:off] == 0x7F).all() and (buf[off + n * m:] == 0x7F).all(), off
        stack.callback(engine.backend.reset_for_tests)
        w = torch.rand(n, device=DEVICE, dtype=BF16) + 0.5
        for env in ({"ENGINE_NORM_EXTERNAL_TRANSPOSE": "1"}, {}):  # after the norm; the default
            use_backend(backend, **env)
            tn = call(True, x, w, quantizer=delayed(E4M3, columnwise=True))
            assert torch.equal(tn.transpose_data.view(torch.uint8), tn.data.view(torch.uint8).t())


def test_float8tensor_dequantize():
    data = torch.tensor([[1.0, -2.0], [0.5, 448.0]]).to(E4M3)
    t = Float8Tensor(data, torch.tensor([0.25]), E4M3)
    torch.testing.assert_close(t.dequantize(), torch.tensor([[0.25, -0.5], [0.125, 112.0]]))
    assert t.dequantize(BF16).dtype == BF16
    only_t = Float8Tensor(None, torch.tensor([1.0]), E4M3, transpose_data=data.t().contiguous())
    assert only_t.shape == (2, 2)
    torch.testing.assert_close(only_t.dequantize(), data.float())


def test_quantizer_validation():
    with pytest.raises(ValueError, match="fp8_dtype"):
        Float8CurrentScalingQuantizer(torch.bfloat16)
    with pytest.raises(ValueError, match="scale"):
        Float8Quantizer(torch.ones(2), torch.zeros(1), E4M3)
    with pytest.raises(ValueError, match="amax"):
        Float8Quantizer(torch.ones(1), torch.zeros(1, dtype=torch.float64), E4M3)
    with pytest.raises(ValueError, match="rowwise"):
        Float8CurrentScalingQuantizer(E4M3, rowwise=False, columnwise=False)
    with pytest.raises(ValueError, match="amax_epsilon"):
        Float8CurrentScalingQuantizer(E4M3, amax_epsilon=-1.0)


def test_amax_epsilon_floors_the_scale(backend):
    x = torch.full((4, 16), 1e-3, device=DEVICE, dtype=BF16)
    q = Float8CurrentScalingQuantizer(E4M3, amax_epsilon=0.5)
    engine.cast_transpose(x, q)
    assert q.scale.item() == 448.0 / 0.5


class TestDelayedScaling:
    def test_history_max_and_margin(self):
        rec = DelayedScaling(amax_history_len=4, margin=1, amax_compute_algo="max")
        q = rec.make_quantizer(E4M3)
        assert q.scale.item() == 1.0 and q.amax_history.shape == (4,)
        for step_amax, expect_hist_max in [(2.0, 2.0), (8.0, 8.0), (1.0, 8.0)]:
            q.amax.fill_(step_amax)  # what the kernels max-update during a step
            rec.update(q)
            assert q.scale.item() == 448.0 / expect_hist_max / 2.0
            assert q.amax.item() == 0.0  # slot 0 is zeroed for the next step
        assert q.amax_history.tolist() == [0.0, 2.0, 8.0, 1.0]

    def test_history_drops_oldest(self):
        rec = DelayedScaling(amax_history_len=2)
        q = rec.make_quantizer(E4M3)
        for a in (100.0, 1.0, 2.0):
            q.amax.fill_(a)
            rec.update(q)
        # the window holds the last step only (slot 0 is the next step's): 100 and 1 aged out
        assert q.scale.item() == 448.0 / 2.0

    def test_most_recent(self):
        rec = DelayedScaling(amax_history_len=8, amax_compute_algo="most_recent")
        q = rec.make_quantizer(E5M2)
        for a in (50.0, 4.0):
            q.amax.fill_(a)
            rec.update(q)
        assert q.scale.item() == 57344.0 / 4.0

    def test_zero_or_inf_amax_keeps_scale(self):
        rec = DelayedScaling(amax_history_len=1)
        q = rec.make_quantizer(E4M3)
        q.amax.fill_(7.0)
        rec.update(q)
        kept = q.scale.item()
        rec.update(q)  # amax 0
        assert q.scale.item() == kept
        q.amax.fill_(float("inf"))
        rec.update(q)
        assert q.scale.item() == kept

    def test_kernels_feed_the_recipe(self, backend):
        rec = DelayedScaling(amax_history_len=3)
        q = rec.make_quantizer(E4M3, device=DEVICE)
        x = torch.randn(16, 64, device=DEVICE, dtype=BF16)
        w = torch.ones(64, device=DEVICE, dtype=BF16)
        call(True, x, w, quantizer=q)
        y_amax = call(True, x, w, out_dtype=F32).abs().max().item()
        assert q.amax.item() == y_amax
        rec.update(q)
        assert q.scale.item() == pytest.approx(448.0 / y_amax, rel=1e-7)

    def test_bad_arguments(self):
        with pytest.raises(ValueError):
            DelayedScaling(amax_history_len=0)
        with pytest.raises(ValueError):
            DelayedScaling(amax_compute_algo="mean")


@pytest.mark.skipif(not ON_GPU, reason="torch._scaled_mm needs an FP8-capable GPU")
@pytest.mark.parametrize("is_rms", NORMS)
def test_scaled_mm_matches_bf16(backend, is_rms):
    """norm -> FP8 feeding torch._scaled_mm matches the bf16 matmul of the bf16 norm within FP8 error."""
    m, k, n = 256, 1024, 512
    x, w, b = inputs(m, k, is_rms)
    wt = torch.randn(n, k, device=DEVICE, dtype=BF16) / k ** 0.5
    a = call(is_rms, x, w, b, quantizer=Float8CurrentScalingQuantizer(E4M3))
    bq = engine.cast_transpose(wt, Float8CurrentScalingQuantizer(E4M3))
    out = torch._scaled_mm(a.data, bq.data.t(), scale_a=a.scale_inv, scale_b=bq.scale_inv, out_dtype=BF16)
    ref = call(is_rms, x, w, b) @ wt.t()
    rel = (out.float() - ref.float()).norm() / ref.float().norm()
    assert rel.item() < 0.06  # e4m3 has 3 mantissa bits: ~2**-4 relative per element, averaged down


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("row", [0, 150, 300])
def test_amax_finds_the_peak_in_any_row(backend, is_rms, row):
    """One large |y| (negative, at one end of its row) in the first, a middle or the last row of
    301: amax equals it exactly, and a NaN in the same place reaches amax. 301 rows are several row
    tiles per persistent program in every backend (the interpreter's grid is small), so a running
    max that kept only some iterations, or dropped NaN between them, fails here."""
    m, n = 301, 409
    x, w, b = inputs(m, n, is_rms)
    x *= 0.1
    col = 0 if row % 2 == 0 else n - 1
    x[row, col] = -60.0
    y32 = call(is_rms, x, w, b, out_dtype=F32)
    peak = y32.abs().max()
    assert (y32.abs() == peak).nonzero().tolist() == [[row, col]]  # the spike is the only peak
    q = delayed(E4M3, scale=1.0, amax=0.0)
    call(is_rms, x, w, b, quantizer=q)
    assert q.amax.item() == peak.item()
    x[row, col] = float("nan")
    qn = delayed(E4M3, scale=1.0, amax=0.0)
    call(is_rms, x, w, b, quantizer=qn)
    assert torch.isnan(qn.amax).item()


def test_nan_reaches_amax(backend):
    """A NaN in the input shows in amax on every backend (a float max would silently drop it), so
    the scaling recipe sees it; finite neighbours are unaffected in the other rows."""
    x = torch.randn(8, 64, device=DEVICE)
    x[3, 5] = float("nan")
    q = delayed(E4M3, scale=1.0, amax=0.0)
    t = call(True, x, torch.ones(64, device=DEVICE), quantizer=q)
    assert torch.isnan(q.amax).item()
    assert torch.isfinite(t.data[[0, 1, 2, 4, 5, 6, 7]].float()).all()
    # The saturating cast keeps NaN NaN (torch's cast, cvt.rn.satfinite): a clamp before the cast
    # with a NaN-dropping max would write -max instead.
    assert torch.isnan(t.data[3, 5].float()).item()
    qc = delayed(E4M3, scale=1.0, amax=0.5)
    tc = engine.cast_transpose(x, qc)
    assert torch.isnan(qc.amax).item()
    assert torch.isnan(tc.data[3, 5].float()).item()
