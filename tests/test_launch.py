"""The Triton fast launch path (engine.triton_kernels.launch): its cache key against Triton's own
specialisation (CPU), and cache hits that must not reuse a kernel compiled for other arguments (GPU)."""

from __future__ import annotations

import itertools
import types

import pytest
import torch

import engine
from engine.triton_kernels.launch import Launcher, arg_key, scalars_key, tensors_key
from engine.triton_kernels import norms as nm

from conftest import DEVICE, ON_GPU, use_backend
from reference import norm_fwd as ref_fwd
from tolerances import FWD

INTS = [0, 1, 2, 15, 16, 17, 32, 48, 4096, 17389, -16, -1, 2**31 - 16, 2**31 - 1, 2**31, 2**31 + 16,
        2**40, -(2**31), -(2**31) - 16]
FLOATS = [0.0, 1.0, 1e-6, 448.0]


def _tensors():
    base = torch.empty(256, dtype=torch.uint8)
    out = []
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float8_e4m3fn, torch.uint8):
        size = dtype.itemsize
        for off in (0, size, 2 * size, 8, 16, 32):  # 16-byte aligned only where off % 16 == 0
            out.append(base[off:off + 64].view(dtype))
    return out


def _triton_spec(a, specialize=True):
    libtriton = pytest.importorskip("triton._C.libtriton")
    from triton.backends.compiler import BaseBackend

    if not hasattr(libtriton, "native_specialize_impl"):
        pytest.skip("this triton has no native_specialize_impl to compare against")
    return libtriton.native_specialize_impl(BaseBackend, a, False, specialize, True)


@pytest.mark.parametrize("specialize", [True, False], ids=["specialised", "do_not_specialize"])
def test_key_separates_what_triton_specialises(specialize):
    """Two arguments with the same key must get the same Triton specialisation, for specialised and
    do_not_specialize parameters alike; otherwise a cached kernel compiled for one would run with
    the other (e.g. a kernel assuming 16-byte alignment)."""
    args = INTS + FLOATS + _tensors()
    by_key = {}
    for a in args:
        by_key.setdefault((type(a).__name__, arg_key(a)), []).append(a)
    for group in by_key.values():
        specs = {repr(_triton_spec(a, specialize)) for a in group}
        assert len(specs) == 1, f"one key, several Triton specialisations: {group} -> {specs}"


def test_group_keys_are_arg_key_per_argument():
    """The launch key of a group of tensors (one map, one OR of the pointers) and of the scalars is
    the per-argument key: with every pointer aligned, with one misaligned among them (the OR),
    and in any order."""
    ts = _tensors()
    aligned = [t for t in ts if t.data_ptr() % 16 == 0]
    misaligned = [t for t in ts if t.data_ptr() % 16]
    assert aligned and misaligned
    for group in (aligned, aligned[:3] + misaligned[:1] + aligned[3:6], misaligned, ts, ts[::-1]):
        assert tensors_key(group, [t.data_ptr() for t in group]) == tuple(arg_key(t) for t in group)
    assert tensors_key(aligned, [t.data_ptr() for t in aligned]) == tuple(t.dtype for t in aligned)
    scalars = INTS + FLOATS
    assert scalars_key(scalars) == tuple(arg_key(a) for a in scalars)
    assert scalars_key(scalars[::-1]) == tuple(arg_key(a) for a in scalars[::-1])


def test_key_rejects_unknown_types():
    with pytest.raises(TypeError, match="unsupported argument type"):
        arg_key("a string")
    # a tensor among the scalars would otherwise share a float's key
    with pytest.raises(TypeError, match="unsupported argument type"):
        scalars_key((1, torch.zeros(1), 0.5))


def test_launcher_rejects_tensors_and_scalars_swapped():
    """A miss checks the split: tensors in ``tensors``, ints and floats in ``scalars``."""
    from engine.triton_kernels import norms_common as nc

    launch = Launcher(nc._partials_reduce_kernel)
    part, out = torch.zeros(1, 2, 4), torch.zeros(4)
    with pytest.raises(TypeError, match="must be torch.Tensors"):
        launch._slow(1, (part, out, 2), (4,), (16, 16, False), 4, 3)
    with pytest.raises(TypeError, match="unsupported argument type"):
        launch._slow(1, (part, out), (out, 2, 4), (16, 16, False), 4, 3)


def test_launcher_pins_fp_fusion():
    """Every compile (a cache miss goes through kernel[grid]) asks for fused multiply-adds
    explicitly, so a change of Triton's default (3.10) cannot change the kernels silently."""
    from engine.triton_kernels import launch as launch_mod
    from engine.triton_kernels import norms_common as nc

    seen = {}

    class Kernel:
        fn = nc._partials_reduce_kernel.fn

        def __getitem__(self, grid):
            return lambda *args, **kw: seen.update(kw)

    launch = Launcher(nc._partials_reduce_kernel)
    launch.kernel = Kernel()
    launch._slow(1, (torch.zeros(1, 2, 4), torch.zeros(4)), (2, 4), (16, 16, False), 4, 3)
    assert seen.get("enable_fp_fusion") is True
    assert launch_mod.COMPILE_OPTIONS == {"enable_fp_fusion": True}


def test_launcher_checks_constexpr_names():
    launch = Launcher(nm._norm_bwd_kernel)
    with pytest.raises(TypeError, match="constexprs"):
        launch(1, (), (), 4, 3, IS_RMS_NORM=True)


def test_launcher_wants_constexprs_last():
    import triton
    import triton.language as tl

    def k(A, B: tl.constexpr, C):
        pass

    with pytest.raises(ValueError, match="constexpr parameters must come last"):
        Launcher(triton.jit(k))


def _recording_launcher(monkeypatch):
    """A Launcher of the partials-reduce kernel whose fast path runs on CPU: a compile (a miss,
    ``_slow``) returns a stand-in kernel named by the arguments' specialisation, and every launch
    records which kernel ran (the stand-in's ``run``, or the compile's own launch)."""
    from engine.triton_kernels import launch as launch_mod
    from engine.triton_kernels import norms_common as nc

    ran = []

    class Compiled:
        function = packed_metadata = None

        def __init__(self, spec):
            self.spec = spec

        def run(self, *args):
            ran.append(self.spec)

    def slow(grid, tensors, scalars, constexprs, num_warps, num_stages):
        spec = (tensors_key(tensors, [t.data_ptr() for t in tensors]), scalars_key(scalars))
        ran.append(spec)
        return Compiled(spec)

    monkeypatch.setattr(launch_mod, "FORCE_JIT", False)
    monkeypatch.setattr(launch_mod, "_hooks_set", lambda: False)
    la = Launcher(nc._partials_reduce_kernel)
    la._interpreted = False
    la._driver = types.SimpleNamespace(get_current_device=lambda: 0, get_current_stream=lambda device: 0)
    la._slow = slow
    return la, ran


def test_memo_runs_the_kernel_of_the_scalars_specialisation(monkeypatch):
    """The memo keyed by the scalars' values runs, on a hit, the kernel compiled for their
    specialisation: scalars of one specialisation share a kernel, another specialisation (17: not
    divisible by 16) or another tensor alignment gets its own, and a memo at its size limit is
    cleared without losing a kernel."""
    from engine.triton_kernels import launch as launch_mod

    la, ran = _recording_launcher(monkeypatch)
    part, out = torch.zeros(1, 2, 32), torch.zeros(32)
    odd = torch.zeros(33)[1:]  # a data pointer 4 bytes past an aligned one
    ce = (16, 16, False)

    def go(scalars, tensors=(part, out, out)):
        ran.clear()
        la.launch(1, tensors, scalars, 4, 3, ce)
        return ran[0]

    k16 = go((1, 16))
    assert go((1, 16)) is k16 and go((1, 32)) is k16 and go((1, 32)) is k16  # same specialisation
    k17 = go((1, 17))
    assert k17 != k16 and k17[1] == scalars_key((1, 17))
    assert go((1, 17)) is k17 and go((1, 16)) is k16
    assert go((2, 16)) != k16  # (== 1) is specialised
    k_odd = go((1, 16), (part, odd, out))
    ptrs = [t.data_ptr() for t in (part, odd, out)]
    assert k_odd != k16 and k_odd[0] == tensors_key((part, odd, out), ptrs)
    assert go((1, 16)) is k16
    monkeypatch.setattr(launch_mod, "MEMO_SIZE", 4)
    for v in range(32, 32 + 16 * 10, 16):
        assert go((1, v)) is k16
        assert len(la._memo) <= 4
    assert go((1, 17)) is k17


@pytest.mark.skipif(not ON_GPU, reason="the cache is only used on the GPU (the interpreter always binds)")
@pytest.mark.parametrize("is_rms", [True, False], ids=["rms", "ln"])
def test_cache_hit_with_other_alignment_and_sizes(is_rms):
    """The same shapes' kernel first runs on aligned rows of N % 16 == 0, then on a view whose data
    pointer is not 16-byte aligned and on sizes that are not multiples of 16: each must match the
    float64 oracle (a key that missed a specialisation would reuse the aligned kernel)."""
    use_backend("triton")
    gen = torch.Generator(device=DEVICE).manual_seed(0)
    for (m, n), offset in itertools.product([(64, 1024), (33, 1024), (64, 1000), (1, 1024)], [0, 1]):
        buf = torch.randn(m * n + 8, device=DEVICE, generator=gen).to(torch.bfloat16)
        x = buf[offset:offset + m * n].view(m, n)
        w = torch.randn(n, device=DEVICE, generator=gen).to(torch.bfloat16)
        b = None if is_rms else torch.randn(n, device=DEVICE, generator=gen).to(torch.bfloat16)
        y = engine.rmsnorm(x, w, 1e-5) if is_rms else engine.layernorm(x, w, b, 1e-5)
        ref = ref_fwd(x.double(), w.double(), None if b is None else b.double(), 1e-5, is_rms, False)["y"]
        torch.testing.assert_close(y.double(), ref, **FWD[torch.bfloat16], msg=lambda e: f"{m}x{n}+{offset}: {e}")
    assert len(nm._FWD._cache) >= 2  # the fast path really cached kernels


def test_compile_check_specialises_like_the_launcher():
    """ci/triton_compile_check.py compiles each variant with the attributes Triton's launcher gives
    its arguments. Without them (as before session 10) every pointer lacked ``tt.divisibility``:
    the check compiled kernels of scalar 2-byte loads, not the 16-byte vectors the GPU runs."""
    import sys
    from pathlib import Path
    from types import SimpleNamespace

    pytest.importorskip("triton._C.libtriton")
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
    try:
        import triton_compile_check as cc
    finally:
        sys.path.pop(0)
    p = SimpleNamespace(do_not_specialize=False, do_not_specialize_on_alignment=False)
    dns = SimpleNamespace(do_not_specialize=True, do_not_specialize_on_alignment=False)
    base = torch.empty(64, dtype=torch.uint8)
    aligned = base[:32].view(torch.bfloat16)
    misaligned = base[2:34].view(torch.bfloat16)
    assert aligned.data_ptr() % 16 == 0 and misaligned.data_ptr() % 16 == 2
    assert cc._arg_spec(p, aligned) == ("*bf16", "D")
    assert cc._arg_spec(p, misaligned) == ("*bf16", "")
    assert cc._arg_spec(p, 16384) == ("i32", "D")
    assert cc._arg_spec(p, 17389) == ("i32", "")
    assert cc._arg_spec(p, 1) == ("constexpr", 1)
    assert cc._arg_spec(dns, 16384)[1] in ("", None)  # do_not_specialize: no divisibility
    assert cc._arg_spec(p, 0.5)[0] == "fp32"
    with pytest.raises(TypeError):
        cc._arg_spec(p, "x")


def test_reduce_partials_two_sets_in_one_launch():
    """dW and dB partials ([2, P, N]) reduce in one launch through a 2-D grid (the Launcher's tuple
    grid), each set into its own output and dtype; a set count that does not match raises."""
    from engine.triton_kernels import norms_common as nc

    use_backend("triton")
    try:
        part = torch.randn(2, 37, 300, device=DEVICE)
        a = torch.full((300,), float("nan"), device=DEVICE)
        b = torch.full((300,), float("nan"), device=DEVICE, dtype=torch.bfloat16)
        for _ in range(2):  # the second call takes the Launcher's cached path on a GPU
            nc.reduce_partials(part, a, b)
            torch.testing.assert_close(a, part[0].sum(0), rtol=1e-5, atol=1e-5)
            # one bf16 step at most: the fp32 sums differ in order only
            torch.testing.assert_close(b, part[1].sum(0).to(torch.bfloat16), rtol=2 ** -8, atol=1e-6)
        with pytest.raises(ValueError, match="partial sets"):
            nc.reduce_partials(part, a)
    finally:
        engine.backend.reset_for_tests()


def test_reduce_tile_spreads_over_the_sms():
    """norms_common.reduce_tile (NOTES P168): the column block narrows (128 -> 16) until the grid of
    ceil(N / BLOCK_N) x K programs covers the SMs, and BLOCK_P grows so that a step loads 4096
    values, within [32, next power of two of P]; rule 0 the fixed 128 x 32 tile; rule 2 (P170)
    from 1024 columns to a grid of twice the SMs, with steps of fewer than 32 rows."""
    from engine.triton_kernels import norms_common as nc

    tile = nc.reduce_tile
    assert tile(2, 528, 1024, 132, spread=1) == (16, 256)  # LayerNorm bwd 1K: 128 programs
    assert tile(1, 528, 1024, 132, spread=1) == (16, 256)  # RMSNorm: 64, the narrowest block
    assert tile(2, 264, 4096, 132, spread=1) == (32, 128)  # 256 programs
    assert tile(2, 37, 300, 132, spread=1) == (16, 64)  # P's power of two caps the rows per step
    assert tile(2, 5, 300, 132, spread=1) == (16, 32)  # never under 32 rows
    assert tile(2, 132, 8192, 132, spread=1) == (64, 64)  # 128 programs < 132 SMs: 256
    assert tile(2, 66, 16384, 132, spread=1) == (128, 32)  # 256 programs already: as before
    assert nc.reduce_tile(2, 528, 1024, 132, spread=0) == (128, 32)
    # rule 2 (P170, the default): blocks from 1024 until the grid covers 2 x the SMs, any rows
    # per step
    assert nc.REDUCE_SPREAD == 2 and nc.reduce_tile(2, 8, 131072, 132) == (512, 8)
    assert nc.reduce_tile(2, 8, 131072, 132, spread=2) == (512, 8)
    assert nc.reduce_tile(2, 66, 16384, 132, spread=2) == (64, 64)
    assert nc.reduce_tile(2, 528, 1024, 132, spread=2) == (16, 256)
    assert nc.reduce_tile(1, 3, 300, 132, spread=2) == (16, 4)


@pytest.mark.parametrize("k,p,n", [(2, 528, 1024), (1, 528, 1024), (2, 264, 4096), (2, 131, 1000),
                                   (1, 7, 17), (2, 8, 131072), (2, 3, 5000)])
@pytest.mark.parametrize("spread", [0, 1, 2])
def test_reduce_partials_against_float64(monkeypatch, k, p, n, spread):
    """Every reduction tile rule (0 the fixed tile, 1 P168's, 2 P170's) sums the partials to the
    float64 sum within fp32 rounding, into poisoned outputs; masked columns and rows past P add
    nothing. On CPU every rule takes the interpreter's one wide block."""
    from engine.triton_kernels import norms_common as nc

    monkeypatch.setattr(nc, "REDUCE_SPREAD", spread)
    gen = torch.Generator().manual_seed(p * n + k)
    part = torch.randn(k, p, n, generator=gen).to(DEVICE)
    outs = [torch.full((n,), float("nan"), device=DEVICE) for _ in range(k)]
    nc.reduce_partials(part, *outs)
    want = part.double().sum(1)
    for i in range(k):
        # fp32 sums of p values of magnitude ~1: a few ulps of sqrt(p) at most
        torch.testing.assert_close(outs[i].double(), want[i], rtol=0, atol=p * 2.0 ** -22)


def test_reduce_partials_strides_under_a_cut_grid(monkeypatch):
    """The reduction's programs stride over the column blocks (NOTES P173): a grid cut by an
    sm_margin (here forced to one program per set through margin_grid) sums every block, to the
    same bits as the full grid, into poisoned outputs."""
    from engine.triton_kernels import norms_common as nc

    k, p, n = 2, 37, 9000  # three of the interpreter's 4096-column blocks (more on a GPU)
    part = torch.randn(k, p, n, generator=torch.Generator().manual_seed(7)).to(DEVICE)
    full = [torch.full((n,), float("nan"), device=DEVICE) for _ in range(k)]
    nc.reduce_partials(part, *full)
    monkeypatch.setattr(nc, "margin_grid", lambda grid, *a: k)
    cut = [torch.full((n,), float("nan"), device=DEVICE) for _ in range(k)]
    nc.reduce_partials(part, *cut, sm_margin=1)
    for f, c in zip(full, cut):
        assert torch.equal(f, c)
    torch.testing.assert_close(cut[0].double(), part[0].double().sum(0), rtol=0, atol=p * 2.0 ** -22)


@pytest.mark.skipif(not ON_GPU, reason="the reduction's grid on a GPU")
def test_reduce_partials_sm_margin_grid():
    """Under sm_margin = SMs - 1 the reduction launches no more programs than one SM holds at once
    (conftest.resident_bound, from the profiler trace), split between dW and dB, with the bits of
    sm_margin 0 (NOTES P173)."""
    from conftest import cuda_kernel_launches, gpu_sms, resident_bound
    from engine.triton_kernels import norms_common as nc

    part = torch.randn(2, 528, 4096, device=DEVICE)
    outs = {}
    grids = {}
    for margin in (0, gpu_sms() - 1):
        o = [torch.full((4096,), float("nan"), device=DEVICE) for _ in range(2)]
        found = [(g, a) for name, g, _, a in cuda_kernel_launches(
            lambda: nc.reduce_partials(part, *o, sm_margin=margin)) if "partials_reduce" in name]
        assert len(found) == 1, found
        outs[margin], grids[margin] = o, found[0]
    (g0, _), (g1, args) = grids[0], grids[gpu_sms() - 1]
    assert g1[1] == 2 and g1[0] * 2 <= resident_bound(args) < g0[0] * 2
    for a, b in zip(outs[0], outs[gpu_sms() - 1]):
        assert torch.equal(a, b)


def _plan_cases(n: int):
    """Norm calls of one width that differ in one option each (the keys of the launch plans)."""
    from engine.fp8 import Float8CurrentScalingQuantizer, Float8Quantizer

    g = torch.Generator(device=DEVICE).manual_seed(3)

    def rnd(*shape, dtype=torch.bfloat16):
        return torch.randn(*shape, device=DEVICE, generator=g).to(dtype)

    x, r, r32, dy = rnd(5, n), rnd(5, n), rnd(5, n, dtype=torch.float32), rnd(5, n)
    w, b, w32 = rnd(n), rnd(n), rnd(n, dtype=torch.float32)

    def delayed(dt, columnwise=False):
        return Float8Quantizer(torch.full((1,), 2.0, device=DEVICE), torch.zeros(1, device=DEVICE), dt,
                               columnwise=columnwise)

    def fp8(t):
        return (t.data.view(torch.uint8), t.scale_inv) + (
            () if t.transpose_data is None else (t.transpose_data.view(torch.uint8),))

    def fb(fn, *inputs):
        leaves = [t.clone().requires_grad_(True) for t in inputs]
        y = fn(*leaves)
        y = y if isinstance(y, tuple) else (y,)
        return (*y, *torch.autograd.grad(y[0], leaves, dy))

    e4, e5 = torch.float8_e4m3fn, torch.float8_e5m2
    return {
        "rms": lambda: engine.rmsnorm(x, w),
        "rms zcg": lambda: engine.rmsnorm(x, w, zero_centered_gamma=True),
        "rms fp32 out": lambda: engine.rmsnorm(x, w, out_dtype=torch.float32),
        "rms fp32 w": lambda: engine.rmsnorm(x, w32),
        "rms res": lambda: engine.rmsnorm(x, w, residual=r),
        "rms res32": lambda: engine.rmsnorm(x, w, residual=r32),
        "rms sm_margin": lambda: engine.rmsnorm(x, w, sm_margin=1),
        "ln": lambda: engine.layernorm(x, w),
        "ln bias": lambda: engine.layernorm(x, w, b),
        "ln bias zcg": lambda: engine.layernorm(x, w, b, zero_centered_gamma=True),
        "ln res": lambda: engine.layernorm(x, w, b, residual=r),
        "rms e4m3": lambda: fp8(engine.rmsnorm(x, w, quantizer=delayed(e4))),
        "rms e5m2": lambda: fp8(engine.rmsnorm(x, w, quantizer=delayed(e5))),
        "rms e4m3 T": lambda: fp8(engine.rmsnorm(x, w, quantizer=delayed(e4, True))),
        "rms e4m3 cur": lambda: fp8(engine.rmsnorm(x, w, quantizer=Float8CurrentScalingQuantizer(e4))),
        "ln e4m3 cur res": lambda: fp8(engine.layernorm(x, w, b, residual=r,
                                                        quantizer=Float8CurrentScalingQuantizer(e4))[0]),
        "rms f+b": lambda: fb(lambda a, c: engine.rmsnorm(a, c), x, w),
        "rms f+b zcg": lambda: fb(lambda a, c: engine.rmsnorm(a, c, zero_centered_gamma=True), x, w),
        "ln f+b": lambda: fb(lambda a, c: engine.layernorm(a, c), x, w),
        "ln f+b bias": lambda: fb(lambda a, c, d: engine.layernorm(a, c, d), x, w, b),
        "rms f+b res": lambda: fb(lambda a, c, d: engine.rmsnorm(a, c, residual=d), x, w, r),
        "rms f+b res32": lambda: fb(lambda a, c, d: engine.rmsnorm(a, c, residual=d), x, w, r32),
    }


@pytest.mark.parametrize("n", [96, 1000])
def test_plans_keep_options_apart(monkeypatch, n):
    """The Triton launches take their config, grid cap and constexprs from plans cached by width,
    dtypes and options (norms.FWD_PLANS / BWD_PLANS). Every case must give, bit for bit, what it
    gives with an empty plan cache, after all the others have filled it (in both orders): a plan key
    that missed an option would hand one case another's constexprs. The small copies' rule is off
    (SMALL_COPY_ROWS = 0), so that "rms e4m3 T" takes RMSNorm's bands and a plan of its own."""
    from engine import triton_kernels

    monkeypatch.setattr(triton_kernels, "SMALL_COPY_ROWS", 0)
    cases = _plan_cases(n)
    fresh = {}
    try:
        for name, fn in cases.items():
            use_backend("triton")
            fresh[name] = fn()
            if name == "rms":
                assert len(nm.FWD_PLANS) == 1
        use_backend("triton")
        assert not nm.FWD_PLANS and not nm.BWD_PLANS  # reset_for_tests empties them
        for names in (list(cases), list(reversed(cases))):
            for name in names:
                got, want = cases[name](), fresh[name]
                got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
                assert len(got) == len(want)
                for i, (a, b) in enumerate(zip(got, want)):
                    assert a.dtype == b.dtype and torch.equal(a, b), f"{name}: output {i} differs"
        # one plan per distinct forward (14) and backward (5) key above: the weight's and the
        # residual's dtypes need none of their own; the transposed copy does (RMSNorm's bands in
        # the norm kernel, norms.band_by_default: "rms e4m3 T" is not "rms e4m3")
        assert len(nm.FWD_PLANS) == 14 and len(nm.BWD_PLANS) == 5
    finally:
        engine.backend.reset_for_tests()


def test_row_sums_two_operand_reduction():
    """norms._row_sums: LayerNorm's two row sums in one two-operand tl.reduce (the GPU path; the
    interpreter's kernels take two tl.sum, SEPARATE) against torch, and RMSNorm's one sum."""
    import triton
    import triton.language as tl

    @triton.jit
    def k(A, B, S2, S1, IS_RMS_NORM: tl.constexpr, SEPARATE: tl.constexpr, BM: tl.constexpr,
          BN: tl.constexpr):
        r = tl.arange(0, BM)
        c = tl.arange(0, BN)
        a = tl.load(A + r[:, None] * BN + c[None, :])
        b = tl.load(B + r[:, None] * BN + c[None, :])
        s2, s1 = nm._row_sums(a, b, IS_RMS_NORM, SEPARATE)
        tl.store(S2 + r, s2)
        tl.store(S1 + r, s1)

    g = torch.Generator(device=DEVICE).manual_seed(5)
    a = torch.randn(4, 64, device=DEVICE, generator=g)
    b = torch.randn(4, 64, device=DEVICE, generator=g)
    for is_rms, separate in [(False, False), (False, True), (True, False)]:
        s2 = torch.full((4,), float("nan"), device=DEVICE)
        s1 = torch.full((4,), float("nan"), device=DEVICE)
        k[(1,)](a, b, s2, s1, IS_RMS_NORM=is_rms, SEPARATE=separate, BM=4, BN=64)
        torch.testing.assert_close(s2, a.sum(1), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(s1, torch.zeros(4, device=DEVICE) if is_rms else b.sum(1), rtol=1e-5, atol=1e-5)


def test_triton_fwd_refuses_residual_without_residual_out():
    """With a residual the kernel stores x + residual into residual_out and normalises that; the
    launcher once put x in a missing residual_out's slot (the kernel would have overwritten x).
    It raises instead, as the CUDA backend does."""
    use_backend("triton")
    try:
        x, r = torch.randn(3, 64, device=DEVICE), torch.randn(3, 64, device=DEVICE)
        x0 = x.clone()
        w = torch.ones(64, device=DEVICE)
        out, rs = torch.empty_like(x), torch.empty(3, device=DEVICE)
        with pytest.raises(ValueError, match="without residual_out"):
            nm.norm_fwd(x, w, None, r, 1e-5, out, None, None, rs, None, None, None, None, is_rms_norm=True,
                        zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0, sm_margin=0)
        assert torch.equal(x, x0)
    finally:
        engine.backend.reset_for_tests()


def test_margin_grid_caps_at_resident(monkeypatch):
    """utils.margin_grid: under an sm_margin on a GPU, the grid is cut to (SMs - sm_margin) x the
    fewest resident programs among the launches' kernels; sm_margin 0 and CPU tensors (the
    interpreter) keep it. A stand-in launcher answers resident_per_sm by the constexprs."""
    class Stub:
        def resident_per_sm(self, tensors, scalars, num_warps, num_stages, constexprs):
            return {"a": 3, "b": 2}[constexprs]

    from engine.triton_kernels import utils

    monkeypatch.setattr(utils, "sm_count", lambda device: 10)
    gpu = torch.device("cuda", 0)  # a device object only: no CUDA call is made
    both = [((), (), 8, 3, "a"), ((), (), 8, 3, "b")]
    assert utils.margin_grid(1000, 0, gpu, Stub(), both) == 1000
    assert utils.margin_grid(1000, 4, gpu, Stub(), both) == 12  # (10 - 4) x min(3, 2)
    assert utils.margin_grid(1000, 4, gpu, Stub(), both[:1]) == 18
    assert utils.margin_grid(7, 4, gpu, Stub(), both) == 7  # a grid under the cap stays
    assert utils.margin_grid(1000, 12, gpu, Stub(), both) == 2  # at least one SM's worth
    assert utils.margin_grid(1000, 4, torch.device("cpu"), Stub(), both) == 1000


@pytest.mark.skipif(ON_GPU, reason="the interpreter's launcher")
def test_resident_per_sm_interpreter():
    """Under TRITON_INTERPRET=1 a Launcher has no multiprocessors to fill: resident_per_sm is 0
    (margin_grid does not ask it for CPU tensors)."""
    x = torch.zeros(4, 8)
    assert nm._FWD.resident_per_sm((x,), (1,), 4, 3, ()) == 0
