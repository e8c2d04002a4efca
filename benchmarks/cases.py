"""The benchmarked computations: engine's backends and their peers, one contract per mode.

A case is (norm, mode, impl). Modes:

=============== ==================================================================================
``fwd``         y = norm(x) (bf16 in and out, bf16 weight)
``fwd+bwd``     forward with requires_grad inputs, then the gradients for a fixed random dy
``res-fwd``     z = x + r; y = norm(z); returns (y, z)
``fp8-delayed`` norm -> e4m3 with a given scale, amax max-updated (rowwise)
``fp8-current`` norm -> e4m3, scale from this tensor's amax
``fp8-T``       fp8-delayed plus the transposed [N, M] copy
``res-fp8``     z = x + r; norm(z) -> e4m3 as fp8-delayed; returns (the FP8 output, z)
``cast-T``      x -> e4m3 rowwise + transposed, delayed scaling (no norm)
=============== ==================================================================================

Impls: ``cuda`` / ``triton`` (engine's public API on that backend, at its defaults; for ``fp8-T``
``ENGINE_NORM_EXTERNAL_TRANSPOSE`` unset: the transposed copy from the path the backend measured
faster at the width), ``cuda-int`` / ``triton-int`` (``fp8-T`` with the transposed stores inside
the norm kernel, ``=0``), ``cuda-ext`` / ``triton-ext`` (``fp8-T`` with the tiled transpose after
the norm, ``=1``), and the peers ``eager`` (hand-written
fp32 math), ``F`` (``torch.nn.functional.rms_norm`` / ``layer_norm``), ``compile`` (``torch.compile``
of the eager function, static shapes, one compile per shape) and ``liger`` (Liger-Kernel, when
installed). Each case checks its output against the test oracle (``tests/reference.py``, float64)
on the first rows before it is timed.
"""

from __future__ import annotations

import functools
import importlib.util
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from benchmarks import harness as H

import engine
from engine.backend import OpFamily

Tensor = torch.Tensor

RMS_EPS = 1e-6
LN_EPS = 1e-5
FP8 = torch.float8_e4m3fn
FP8_MAX = 448.0
#: Delayed scaling's scale: |y| stays under ~10 for the inputs below, so 32 keeps it in range.
DELAYED_SCALE = 32.0
#: Rows compared with the float64 oracle (rows are independent, so a prefix is a fair sample).
CHECK_ROWS = 256
#: Largest relative error ||out - ref|| / ||ref|| accepted per output.
TOL = {"y": 2e-2, "res": 1e-2, "dx": 3e-2, "q": 0.1, "qt": 0.0}

NORM_MODES = ("fwd", "fwd+bwd", "res-fwd")
FP8_MODES = ("fp8-delayed", "fp8-current", "fp8-T", "res-fp8", "cast-T")
ENGINE_IMPLS = ("cuda", "triton", "cuda-int", "triton-int", "cuda-ext", "triton-ext")
PEERS = ("eager", "F", "compile", "liger")
IMPL_ORDER = ENGINE_IMPLS + PEERS

_SHORT = {"rmsnorm": "rms", "layernorm": "ln"}
_MODE_LABEL = {"fwd": "fwd", "fwd+bwd": "f+b", "res-fwd": "+res fwd", "fp8-delayed": ">e4m3 dly",
               "fp8-current": ">e4m3 cur", "fp8-T": ">e4m3+T", "res-fp8": "+res>e4m3"}


class Skip(Exception):
    """The impl does not apply here (not installed, not defined for this mode)."""


@dataclass(frozen=True)
class Spec:
    norm: str  # "rmsnorm" | "layernorm" ("cast-T" ignores it)
    mode: str
    impl: str
    sm_margin: int = 0  # the engine impls' norm forward calls (profile_kernels.py --sm-margin)

    @property
    def is_rms(self) -> bool:
        return self.norm == "rmsnorm"

    @property
    def label(self) -> str:
        return "castT e4m3" if self.mode == "cast-T" else _SHORT[self.norm] + " " + _MODE_LABEL[self.mode]


def impls_for(norm: str, mode: str) -> Tuple[str, ...]:
    """The impls that take part in a mode."""
    if mode in NORM_MODES:
        return ("cuda", "triton") + PEERS
    if mode == "fp8-T":
        return ENGINE_IMPLS + ("eager", "compile")
    return ("cuda", "triton", "eager", "compile")


def nbytes(spec: Spec, m: int, n: int) -> int:
    """The fewest bytes the case must move (harness formulas, bf16 tensors)."""
    bias = not spec.is_rms
    if spec.mode == "fwd":
        return H.bytes_norm_fwd(m, n, bias=bias)
    if spec.mode == "fwd+bwd":
        return H.bytes_norm_fwd_bwd(m, n, bias=bias)
    if spec.mode == "res-fwd":
        return H.bytes_norm_fwd(m, n, bias=bias, residual=2)
    if spec.mode == "cast-T":
        return H.bytes_cast_transpose(m, n)
    if spec.mode == "res-fp8":  # also read the residual and write residual_out (bf16)
        return H.bytes_norm_fp8(m, n, bias=bias) + 2 * m * n * 2
    return H.bytes_norm_fp8(m, n, bias=bias, transposed=spec.mode == "fp8-T")


# --- inputs ---------------------------------------------------------------------------------------

def make_inputs(norm: str, mode: str, m: int, n: int, dev: torch.device, seed: int = 0) -> Dict[str, Tensor]:
    """Fresh random bf16 inputs (never zeros): x ~ N(0, 1), weight ~ 1 + N(0, 0.1^2), bias ~ N(0, 0.1^2)."""
    g = torch.Generator(device=dev).manual_seed(seed)
    bf = torch.bfloat16

    def randn(*shape, std=1.0, mean=0.0):
        return (torch.randn(*shape, generator=g, device=dev, dtype=torch.float32) * std + mean).to(bf)

    inp = {"x": randn(m, n), "w": randn(n, std=0.1, mean=1.0)}
    if norm == "layernorm":
        inp["b"] = randn(n, std=0.1)
    if mode in ("res-fwd", "res-fp8"):
        inp["r"] = randn(m, n)
    if mode == "fwd+bwd":
        inp["dy"] = randn(m, n)
    if mode in ("fp8-delayed", "fp8-T", "res-fp8", "cast-T"):
        inp["scale"] = torch.full((1,), DELAYED_SCALE, dtype=torch.float32, device=dev)
        inp["amax"] = torch.zeros(1, dtype=torch.float32, device=dev)
    return inp


# --- peers ----------------------------------------------------------------------------------------

def _norm_f32(x: Tensor, w: Tensor, b: Optional[Tensor], rms: bool) -> Tensor:
    """y in fp32 from fp32 statistics: the math every peer shares."""
    xf = x.float()
    if rms:
        return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + RMS_EPS) * w.float()
    xc = xf - xf.mean(-1, keepdim=True)
    return xc * torch.rsqrt(xc.pow(2).mean(-1, keepdim=True) + LN_EPS) * w.float() + b.float()


def _quantize(y: Tensor, scale: Tensor) -> Tensor:
    return (y * scale).clamp(-FP8_MAX, FP8_MAX).to(FP8)


def _quantize_delayed(y: Tensor, scale: Tensor, amax: Tensor) -> Tensor:
    """Delayed scaling: amax max-updated with max|y| (before scaling), y cast at the given scale."""
    amax.copy_(torch.maximum(amax, y.abs().amax().reshape(1)))
    return _quantize(y, scale)


@functools.lru_cache(maxsize=None)
def peer_fn(norm: str, mode: str) -> Callable:
    """The eager function of (norm, mode); one object per key, so its compiled twin is reused."""
    rms = norm == "rmsnorm"

    if mode in ("fwd", "fwd+bwd"):
        def f(x, w, b):
            return _norm_f32(x, w, b, rms).to(x.dtype)
    elif mode == "res-fwd":
        def f(x, w, b, r):
            z = x + r
            return _norm_f32(z, w, b, rms).to(x.dtype), z
    elif mode in ("fp8-delayed", "fp8-T"):
        transposed = mode == "fp8-T"

        def f(x, w, b, scale, amax):
            q = _quantize_delayed(_norm_f32(x, w, b, rms), scale, amax)
            return (q, scale.reciprocal(), q.t().contiguous()) if transposed else (q, scale.reciprocal())
    elif mode == "res-fp8":
        def f(x, w, b, r, scale, amax):
            z = x + r
            return _quantize_delayed(_norm_f32(z, w, b, rms), scale, amax), scale.reciprocal(), z
    elif mode == "fp8-current":
        def f(x, w, b):
            y = _norm_f32(x, w, b, rms)
            scale = FP8_MAX / y.abs().amax().clamp(min=1e-12)
            return _quantize(y, scale), scale.reciprocal()
    elif mode == "cast-T":
        def f(x, scale, amax):
            q = _quantize_delayed(x.float(), scale, amax)
            return q, scale.reciprocal(), q.t().contiguous()
    else:
        raise ValueError(f"unknown mode {mode!r}")
    f.__name__ = f"{norm}_{mode}".replace("-", "_").replace("+", "_")
    return f


def _raise_dynamo_limits() -> None:
    """Static shapes recompile per N; the default limit (8) would fall back to eager silently."""
    cfg = torch._dynamo.config
    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(cfg, name):
            setattr(cfg, name, 1024)
    if hasattr(cfg, "accumulated_recompile_limit"):
        cfg.accumulated_recompile_limit = 4096


@functools.lru_cache(maxsize=None)
def compiled_fn(norm: str, mode: str) -> Callable:
    """``torch.compile(peer_fn(norm, mode), dynamic=False)``, one object per key (recompiles per shape)."""
    _raise_dynamo_limits()
    return torch.compile(peer_fn(norm, mode), dynamic=False)


def _liger(norm: str, mode: str):
    try:
        if norm == "rmsnorm" and mode == "res-fwd":
            from liger_kernel.ops.fused_add_rms_norm import LigerFusedAddRMSNormFunction as fn
        elif norm == "rmsnorm":
            from liger_kernel.ops.rms_norm import LigerRMSNormFunction as fn
        elif mode != "res-fwd":
            from liger_kernel.ops.layer_norm import LigerLayerNormFunction as fn
        else:
            raise Skip("liger has no fused residual LayerNorm")
    except ImportError as e:
        raise Skip(f"liger-kernel not installed ({e})") from None
    return fn


# --- cases ----------------------------------------------------------------------------------------

@dataclass
class Case:
    """A ready-to-time call. ``first`` is the result of the first (warm-up / compile) call."""

    fn: Callable[[], object]
    outputs: Callable[[object], Dict[str, Tensor]]
    first: object
    setup_s: float
    backend: Optional[str] = None


def _engine_backend(spec: Spec) -> str:
    base, _, path = spec.impl.partition("-")
    if path and spec.mode != "fp8-T":
        raise Skip(f"{spec.impl} applies to fp8-T only")
    external = {"int": False, "ext": True}.get(path)  # None: the flag unset, the default
    fam = OpFamily.CAST_TRANSPOSE if spec.mode == "cast-T" else (
        OpFamily.RMSNORM if spec.is_rms else OpFamily.LAYERNORM)
    return H.use_backend(base, external_transpose=external, families=(fam,)).value


def _fp8_outputs(t) -> Dict[str, Tensor]:
    out = {"q": t.data, "scale_inv": t.scale_inv}
    if t.transpose_data is not None:
        out["qt"] = t.transpose_data
    return out


def _tuple_fp8_outputs(t) -> Dict[str, Tensor]:
    out = {"q": t[0], "scale_inv": t[1]}
    if len(t) > 2:
        out["qt"] = t[2]
    return out


def build(spec: Spec, inp: Dict[str, Tensor]) -> Case:
    """Make the timed closure for ``spec`` over ``inp``, run it once (compiles, warms up) and return it.

    Engine impls switch the process's backend first (``harness.use_backend``); the caller times the
    case before building another one. Raises :class:`Skip` where the impl does not apply.
    """
    x, w, b = inp["x"], inp["w"], inp.get("b")
    mode, impl = spec.mode, spec.impl
    backend = None
    if impl in ENGINE_IMPLS:
        backend = _engine_backend(spec)
    elif impl not in PEERS:
        raise ValueError(f"unknown impl {impl!r}")
    if mode == "fwd+bwd":
        for t in (x, w, b):
            if t is not None:
                t.requires_grad_(True)
    params = tuple(t for t in (x, w, b) if t is not None)

    fwd = _forward(spec, inp)
    if mode == "fwd":
        fn, outputs = fwd, (lambda y: {"y": y})
    elif mode == "fwd+bwd":
        dy = inp["dy"]

        def fn():
            return torch.autograd.grad(fwd(), params, dy)

        def outputs(g):
            return {"dx": g[0]}
    elif mode == "res-fwd":
        fn, outputs = fwd, (lambda t: {"y": t[0], "res": t[1]})
    elif mode == "res-fp8":
        fn = fwd
        if impl in ENGINE_IMPLS:  # (Float8Tensor, residual_out)
            def outputs(t):
                return {**_fp8_outputs(t[0]), "res": t[1]}
        else:  # (data, scale_inv, z)
            def outputs(t):
                return {"q": t[0], "scale_inv": t[1], "res": t[2]}
    else:
        fn = fwd
        outputs = _fp8_outputs if impl in ENGINE_IMPLS else _tuple_fp8_outputs
    t0 = time.perf_counter()
    first = fn()
    H.sync()
    return Case(fn, outputs, first, time.perf_counter() - t0, backend)


def _forward(spec: Spec, inp: Dict[str, Tensor]) -> Callable[[], object]:
    """The forward call of ``spec`` (the whole case except the backward of ``fwd+bwd``)."""
    x, w, b, r = inp["x"], inp["w"], inp.get("b"), inp.get("r")
    scale, amax = inp.get("scale"), inp.get("amax")
    n = x.shape[-1]
    mode, impl, rms = spec.mode, spec.impl, spec.is_rms

    if impl in ENGINE_IMPLS:
        if mode == "cast-T":
            q = engine.Float8Quantizer(scale, amax, FP8, rowwise=True, columnwise=True)
            return lambda: engine.cast_transpose(x, q)
        kw = {"sm_margin": spec.sm_margin} if spec.sm_margin else {}
        if mode in ("res-fwd", "res-fp8"):
            kw["residual"] = r
        if mode in ("fp8-delayed", "fp8-T", "res-fp8"):
            kw["quantizer"] = engine.Float8Quantizer(scale, amax, FP8, columnwise=mode == "fp8-T")
        elif mode == "fp8-current":
            kw["quantizer"] = engine.Float8CurrentScalingQuantizer(FP8)
        if rms:
            return lambda: engine.rmsnorm(x, w, RMS_EPS, **kw)
        return lambda: engine.layernorm(x, w, b, LN_EPS, **kw)

    if impl == "F":
        if mode not in NORM_MODES:
            raise Skip("F has no FP8 output")
        if rms:
            def norm(z):
                return F.rms_norm(z, (n,), w, RMS_EPS)
        else:
            def norm(z):
                return F.layer_norm(z, (n,), w, b, LN_EPS)
        if mode == "res-fwd":
            def res_fwd():
                z = x + r
                return norm(z), z
            return res_fwd
        return lambda: norm(x)

    if impl == "liger":
        if mode not in NORM_MODES:
            raise Skip("liger has no FP8 output")
        fn = _liger(spec.norm, mode)
        if mode == "res-fwd":
            return lambda: fn.apply(x, r, w, RMS_EPS, 0.0, "llama", False)
        if rms:  # in_place=False: dy stays the fixed input across repetitions
            return lambda: fn.apply(x, w, RMS_EPS, 0.0, "llama", False)
        return lambda: fn.apply(x, w, b, LN_EPS)

    f = compiled_fn(spec.norm, mode) if impl == "compile" else peer_fn(spec.norm, mode)
    if mode in ("fwd", "fwd+bwd", "fp8-current"):
        return lambda: f(x, w, b)
    if mode == "res-fwd":
        return lambda: f(x, w, b, r)
    if mode == "res-fp8":
        return lambda: f(x, w, b, r, scale, amax)
    if mode == "cast-T":
        return lambda: f(x, scale, amax)
    return lambda: f(x, w, b, scale, amax)


# --- the check ------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _oracle():
    """tests/reference.py (float64 oracle of the test suite), loaded by path; None if absent."""
    path = H.ROOT / "tests" / "reference.py"
    if not path.exists():
        return None
    spec = importlib.util.spec_from_file_location("engine_tests_reference", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _rel(a: Tensor, ref: Tensor) -> float:
    a, ref = a.double(), ref.double()
    d = torch.linalg.vector_norm(a - ref).item()
    r = torch.linalg.vector_norm(ref).item()
    err = d / r if r > 0 else d
    return err if err == err else float("inf")


def check(spec: Spec, inp: Dict[str, Tensor], outs: Dict[str, Tensor]) -> Dict[str, float]:
    """Relative error of each output against the float64 oracle on the first ``CHECK_ROWS`` rows.

    Returns ``{output: error}``; ``qt`` is 0 when the transposed copy equals the rowwise data
    transposed bitwise, else 1. Empty when the oracle is not there.
    """
    ref = _oracle()
    if ref is None:
        return {}
    x = inp["x"].detach()
    k = min(x.shape[0], CHECK_ROWS)
    w = inp["w"].detach()
    b = None if inp.get("b") is None else inp["b"].detach()
    eps = RMS_EPS if spec.is_rms else LN_EPS
    xs = x[:k]
    with torch.no_grad():
        if spec.mode == "cast-T":
            y = xs.double()
        else:
            z = xs if inp.get("r") is None else ref.residual_sum(xs, inp["r"][:k])
            y = ref.norm_fwd(z, w, b, eps, spec.is_rms)["y"]
        errs: Dict[str, float] = {}
        if "y" in outs:
            errs["y"] = _rel(outs["y"][:k], y)
        if "res" in outs:
            errs["res"] = _rel(outs["res"][:k], z)
        if "q" in outs:
            errs["q"] = _rel(outs["q"][:k].double() * outs["scale_inv"].double(), y)
        if "qt" in outs:
            same = torch.equal(outs["qt"][:, :k].view(torch.uint8), outs["q"][:k].t().view(torch.uint8))
            errs["qt"] = 0.0 if same else 1.0
    if "dx" in outs:
        dref = ref.norm_bwd(inp["dy"][:k], xs, w, b, eps, spec.is_rms)["dx"]
        errs["dx"] = _rel(outs["dx"][:k].detach(), dref)
    return errs


def check_ok(errs: Dict[str, float]) -> bool:
    return all(e <= TOL[k] for k, e in errs.items())
