"""Norm ops: input checks, allocating wrappers over the backend contracts, torch.library custom ops.

Layering (see shared design): backend contract (non-allocating, ``engine.reference`` & co.) ->
allocating wrappers here (``norm_fwd`` / ``norm_fwd_fp8`` / ``norm_bwd``) -> custom ops
``engine::norm_fwd``, ``engine::norm_fwd_fp8``, ``engine::norm_bwd`` with fake implementations
(what ``torch.compile`` traces) -> autograd and modules in :mod:`engine.normalization`.

Eager calls skip the custom-op dispatcher (it costs ~10-20 us of host time per call, more than the
whole small-shape budget) and call the wrappers directly; under ``torch.compile`` the custom ops are
used so the graph stays whole. Both run the same wrapper.

One op serves both norms (``is_rms_norm``), as the kernels do; the backend is chosen per family
(``ENGINE_USE_RMSNORM_TRITON`` / ``ENGINE_USE_LAYERNORM_TRITON``).
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from engine import backend
from engine.backend import OpFamily
from engine.fp8 import FP8_DTYPES

Tensor = torch.Tensor

HIGH_PRECISION = (torch.float32, torch.float16, torch.bfloat16)


def _bad_tensor(name: str, t, device: torch.device):
    if not isinstance(t, torch.Tensor):
        return TypeError(f"{name} must be a torch.Tensor, got {type(t).__name__}")
    return ValueError(f"{name} is on {t.device} but x is on {device}; move them to one device")


def as_rows(t: Tensor, n: int, name: str) -> Tensor:
    """View ``t`` (``[..., n]`` with unit stride in the last dim) as ``[M, n]`` without copying."""
    if n > 1 and t.stride(-1) != 1:
        raise ValueError(
            f"{name} must have unit stride in its last dimension (got strides {tuple(t.stride())}); "
            f"call .contiguous() first"
        )
    if t.dim() == 2 and t.shape[1] == n:  # already [M, n]: no view needed
        return t
    try:
        return t.view(-1, n)
    except RuntimeError:
        raise ValueError(
            f"{name} of shape {tuple(t.shape)} and strides {tuple(t.stride())} cannot be viewed as "
            f"[rows, {n}] with one row stride; call .contiguous() first"
        ) from None


def check_norm_inputs(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    sm_margin: int,
) -> Tuple[Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    """Validate norm inputs; return ``x`` and ``residual`` as ``[M, N]`` views, weight and bias as ``[N]``.

    The normalised dims are ``weight.shape``, which ``x`` must end in; ``N`` is their product.
    Raises ``TypeError`` / ``ValueError`` naming the fix for anything the kernels do not accept,
    identically for every backend. Written for a short host path (it runs on every call).
    """
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in HIGH_PRECISION:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    dev = x.device
    if not isinstance(weight, torch.Tensor) or weight.device != dev:
        raise _bad_tensor("weight", weight, dev)
    wdim = weight.dim()
    if wdim == 1:
        n = weight.shape[0]
        if n < 1:
            raise ValueError("weight must have at least one element per normalised row, got shape (0,)")
        if x.dim() < 1 or x.shape[-1] != n:
            raise ValueError(
                f"x of shape {tuple(x.shape)} does not end in the normalised shape ({n},) (weight's shape)"
            )
    else:
        nshape = tuple(weight.shape)
        n = weight.numel()
        if wdim < 1 or n < 1:
            raise ValueError(f"weight must have at least one element per normalised row, got shape {nshape}")
        if x.dim() < wdim or tuple(x.shape[x.dim() - wdim:]) != nshape:
            raise ValueError(
                f"x of shape {tuple(x.shape)} does not end in the normalised shape {nshape} (weight's shape)"
            )
    wdt = weight.dtype
    if wdt is not x.dtype and wdt is not torch.float32:
        raise ValueError(f"weight must be float32 or x's dtype ({x.dtype}), got {wdt}")
    if not weight.is_contiguous():
        raise ValueError("weight must be contiguous")
    w = weight if wdim == 1 else weight.view(n)
    b = None
    if bias is not None:
        if not isinstance(bias, torch.Tensor) or bias.device != dev:
            raise _bad_tensor("bias", bias, dev)
        if bias.shape != weight.shape or bias.dtype is not wdt or not bias.is_contiguous():
            raise ValueError(
                f"bias must be contiguous, of weight's shape {tuple(weight.shape)} and dtype {wdt}; got "
                f"{tuple(bias.shape)} {bias.dtype}"
            )
        b = bias if wdim == 1 else bias.view(n)
    # Plain isinstance checks: torch.compile (2.11) traces these; class-identity shortcuts it does not.
    if isinstance(eps, bool) or not isinstance(eps, (float, int)) or not eps >= 0:
        raise ValueError(f"eps must be a float >= 0, got {eps!r}")
    if isinstance(sm_margin, bool) or not isinstance(sm_margin, int) or sm_margin < 0:
        raise ValueError(f"sm_margin must be an int >= 0, got {sm_margin!r}")
    x2 = as_rows(x, n, "x")
    r2 = None
    if residual is not None:
        if not isinstance(residual, torch.Tensor) or residual.device != dev:
            raise _bad_tensor("residual", residual, dev)
        if residual.shape != x.shape:
            raise ValueError(f"residual shape {tuple(residual.shape)} != x shape {tuple(x.shape)}")
        if residual.dtype is not x.dtype and residual.dtype is not torch.float32:
            raise ValueError(f"residual must be float32 or x's dtype ({x.dtype}), got {residual.dtype}")
        r2 = as_rows(residual, n, "residual")
    return x2, w, b, r2


_FAMILY = {True: OpFamily.RMSNORM, False: OpFamily.LAYERNORM}


def _impl(is_rms_norm: bool, device: torch.device):
    return backend.select(_FAMILY[is_rms_norm], device)


def alloc_entry(impl, name: str):
    """Backend module ``impl``'s allocating entry ``name`` (``norm_fwd_alloc`` & co., which only
    the CUDA backend has), or None: a lookup in the module's dict, where ``getattr`` with a default
    raises and catches an AttributeError for the backends without one (0.5 us per call here)."""
    return impl.__dict__.get(name)


#: With ENGINE_NORM_EXTERNAL_TRANSPOSE unset, the FP8 transposed copy of at most the backend's
#: ``SMALL_COPY_ROWS`` rows (CUDA 4096, Triton 8192) and (per norm) this many values comes from
#: the tiled transpose after the norm: the in-kernel writers (CUDA's band kernel and register-path
#: tile, Triton's bands) were chosen on shapes of 64M values and lose 3-43 % of kernel time where
#: their few bands leave SMs idle (benchmarks/NOTES.md Q32, P141). LayerNorm's in-kernel writers
#: lose 5-16 % up to 16M values as well, where RMSNorm's tie or win (Q33, P142: two H100 calls).
#: Tests set a backend's SMALL_COPY_ROWS to 0 to see its width defaults alone.
SMALL_COPY_VALUES = {True: 1 << 23, False: 1 << 24}  # keyed by is_rms_norm


def external_transpose(impl, m: int, n: int, is_rms_norm: bool) -> Optional[bool]:
    """Whether the FP8 transposed norm output of ``m`` rows of ``n`` on backend module ``impl``
    comes from a tiled transpose after the norm (True: ``out_t_after``), from the norm kernel itself
    (False), or from whichever the backend measured faster for the call (None: ``out_t_auto``):
    ``ENGINE_NORM_EXTERNAL_TRANSPOSE`` where it is set; else True for rows wider than the norm's
    ``impl.IN_KERNEL_TRANSPOSE_MAX_N`` and for small copies (``impl.SMALL_COPY_ROWS``, the norm's
    ``SMALL_COPY_VALUES``), None for the others."""
    flag = backend.settings().norm_external_transpose
    if flag is not None:
        return flag
    widest = impl.IN_KERNEL_TRANSPOSE_MAX_N["rmsnorm" if is_rms_norm else "layernorm"]
    if n > widest or (m <= impl.SMALL_COPY_ROWS and m * n <= SMALL_COPY_VALUES[is_rms_norm]):
        return True
    return None


def _stats(m: int, is_rms_norm: bool, device) -> Tuple[Optional[Tensor], Tensor]:
    mu = None if is_rms_norm else torch.empty(m, dtype=torch.float32, device=device)
    return mu, torch.empty(m, dtype=torch.float32, device=device)


def norm_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    out_dtype: torch.dtype,
    sm_margin: int,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Tensor]:
    """Allocate and run the high-precision forward on 2-D inputs: ``(out, residual_out, mu, rsigma)``.

    A backend with ``norm_fwd_alloc`` (the CUDA extension) allocates the outputs itself in the same
    call: one host call instead of one per output, for the small shapes whose time is the host's.
    """
    impl = _impl(is_rms_norm, x.device)
    alloc = alloc_entry(impl, "norm_fwd_alloc")
    if alloc is not None:
        return alloc(x, weight, bias, residual, eps, out_dtype, is_rms_norm, zero_centered_gamma, sm_margin)
    m, n = x.shape
    # Sizes as separate ints: torch's argument parser takes them 0.5 us faster than a tuple (CPU of
    # the development machine, per allocation; the Python backends allocate here on every call).
    out = torch.empty(m, n, dtype=out_dtype, device=x.device)
    res_out = None if residual is None else torch.empty(m, n, dtype=residual.dtype, device=x.device)
    mu, rsigma = _stats(m, is_rms_norm, x.device)
    impl.norm_fwd(
        x, weight, bias, residual, eps, out, res_out, mu, rsigma, None, None, None, None,
        is_rms_norm=is_rms_norm, zero_centered_gamma=zero_centered_gamma, current_scaling=False,
        amax_epsilon=0.0, sm_margin=sm_margin,
    )
    return out, res_out, mu, rsigma


def norm_fwd_fp8(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    scale: Tensor,
    amax: Tensor,
    eps: float,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    fp8_dtype: torch.dtype,
    columnwise: bool,
    current_scaling: bool,
    amax_epsilon: float,
    sm_margin: int,
) -> Tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor], Optional[Tensor], Tensor]:
    """FP8 forward on 2-D inputs: ``(data, data_t, scale_inv, residual_out, mu, rsigma)``.

    ``scale`` is read (delayed) or written (current); ``amax`` is max-updated (delayed) or written
    (current). The transposed copy comes from the norm kernel or from a tiled transpose of the
    rowwise data (:func:`external_transpose`); both are bitwise equal. The backend makes it in
    either case, so that its launcher knows whether a copy is made (CUDA chooses the norm's
    kernel by it: benchmarks/NOTES.md P133).
    """
    m, n = x.shape
    dev = x.device
    impl = _impl(is_rms_norm, dev)
    how = external_transpose(impl, m, n, is_rms_norm) if columnwise else False
    alloc = alloc_entry(impl, "norm_fwd_fp8_alloc")
    if alloc is not None:  # the outputs allocated by the backend in the same call (norm_fwd)
        return alloc(x, weight, bias, residual, scale, amax, eps, is_rms_norm, zero_centered_gamma,
                     fp8_dtype, columnwise, current_scaling, amax_epsilon, sm_margin, how is None,
                     how is True)
    data = torch.empty(m, n, dtype=fp8_dtype, device=dev)
    data_t = torch.empty(n, m, dtype=fp8_dtype, device=dev) if columnwise else None
    scale_inv = torch.empty(1, dtype=torch.float32, device=dev)
    res_out = None if residual is None else torch.empty(m, n, dtype=residual.dtype, device=dev)
    mu, rsigma = _stats(m, is_rms_norm, dev)
    impl.norm_fwd(
        x, weight, bias, residual, eps, data, res_out, mu, rsigma, scale, amax, scale_inv, data_t,
        is_rms_norm=is_rms_norm, zero_centered_gamma=zero_centered_gamma,
        current_scaling=current_scaling, amax_epsilon=amax_epsilon, sm_margin=sm_margin,
        out_t_auto=how is None, out_t_after=how is True,
    )
    return data, data_t, scale_inv, res_out, mu, rsigma


def norm_bwd(
    dy: Tensor,
    z: Tensor,
    mu: Optional[Tensor],
    rsigma: Tensor,
    weight: Tensor,
    dresidual: Optional[Tensor],
    has_bias: bool,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    dx_dtype: torch.dtype,
    dres_dtype: Optional[torch.dtype],
    sm_margin: int,
) -> Tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor]]:
    """Allocate and run the backward on 2-D inputs: ``(dx, dres, dweight, dbias)``.

    ``dres`` (the gradient of the residual input, in ``dres_dtype``) is produced only when
    ``dres_dtype`` is given and differs from ``dx_dtype``; otherwise it is None and ``dx`` serves.
    A backend with ``norm_bwd_alloc`` allocates them itself, as in :func:`norm_fwd`.
    """
    dev = z.device
    impl = _impl(is_rms_norm, dev)
    alloc = alloc_entry(impl, "norm_bwd_alloc")
    if alloc is not None:
        return alloc(dy, z, mu, rsigma, weight, dresidual, has_bias, dx_dtype, dres_dtype, is_rms_norm,
                     zero_centered_gamma, sm_margin)
    m, n = z.shape
    dx = torch.empty(m, n, dtype=dx_dtype, device=dev)
    dres = None
    if dres_dtype is not None and dres_dtype != dx_dtype:
        dres = torch.empty(m, n, dtype=dres_dtype, device=dev)
    dweight = torch.empty(n, dtype=weight.dtype, device=dev)
    dbias = torch.empty(n, dtype=weight.dtype, device=dev) if has_bias else None
    impl.norm_bwd(
        dy, z, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias,
        is_rms_norm=is_rms_norm, zero_centered_gamma=zero_centered_gamma, sm_margin=sm_margin,
    )
    return dx, dres, dweight, dbias


# --- torch.library custom ops (used under torch.compile) ------------------------------------------
# Optional outputs travel as empty tensors: custom-op schemas need a fixed number of tensor returns.

def _none_to_empty(t: Optional[Tensor], like: Tensor) -> Tensor:
    return like.new_empty(0) if t is None else t


@torch.library.custom_op("engine::norm_fwd", mutates_args=())
def _norm_fwd_op(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], eps: float,
    is_rms_norm: bool, zero_centered_gamma: bool, out_dtype: torch.dtype, sm_margin: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    out, res_out, mu, rsigma = norm_fwd(x, weight, bias, residual, eps, is_rms_norm,
                                        zero_centered_gamma, out_dtype, sm_margin)
    return out, _none_to_empty(res_out, rsigma), _none_to_empty(mu, rsigma), rsigma


@_norm_fwd_op.register_fake
def _(x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin):
    m, n = x.shape
    out = x.new_empty((m, n), dtype=out_dtype)
    res_out = x.new_empty(0, dtype=torch.float32) if residual is None else x.new_empty((m, n), dtype=residual.dtype)
    mu = x.new_empty(0 if is_rms_norm else m, dtype=torch.float32)
    return out, res_out, mu, x.new_empty(m, dtype=torch.float32)


@torch.library.custom_op("engine::norm_fwd_fp8", mutates_args=("scale", "amax"))
def _norm_fwd_fp8_op(
    x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor], scale: Tensor,
    amax: Tensor, eps: float, is_rms_norm: bool, zero_centered_gamma: bool, fp8_dtype: torch.dtype,
    columnwise: bool, current_scaling: bool, amax_epsilon: float, sm_margin: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor]:
    data, data_t, scale_inv, res_out, mu, rsigma = norm_fwd_fp8(
        x, weight, bias, residual, scale, amax, eps, is_rms_norm, zero_centered_gamma, fp8_dtype,
        columnwise, current_scaling, amax_epsilon, sm_margin)
    return (data, _none_to_empty(data_t, data), scale_inv, _none_to_empty(res_out, rsigma),
            _none_to_empty(mu, rsigma), rsigma)


@_norm_fwd_fp8_op.register_fake
def _(x, weight, bias, residual, scale, amax, eps, is_rms_norm, zero_centered_gamma, fp8_dtype,
      columnwise, current_scaling, amax_epsilon, sm_margin):
    m, n = x.shape
    data = x.new_empty((m, n), dtype=fp8_dtype)
    data_t = x.new_empty((n, m) if columnwise else (0,), dtype=fp8_dtype)
    res_out = x.new_empty(0, dtype=torch.float32) if residual is None else x.new_empty((m, n), dtype=residual.dtype)
    mu = x.new_empty(0 if is_rms_norm else m, dtype=torch.float32)
    return (data, data_t, x.new_empty(1, dtype=torch.float32), res_out, mu,
            x.new_empty(m, dtype=torch.float32))


@torch.library.custom_op("engine::norm_bwd", mutates_args=())
def _norm_bwd_op(
    dy: Tensor, z: Tensor, mu: Optional[Tensor], rsigma: Tensor, weight: Tensor,
    dresidual: Optional[Tensor], has_bias: bool, is_rms_norm: bool, zero_centered_gamma: bool,
    dx_dtype: torch.dtype, dres_dtype: Optional[torch.dtype], sm_margin: int,
) -> Tuple[Tensor, Tensor, Tensor, Tensor]:
    dx, dres, dw, db = norm_bwd(dy, z, mu, rsigma, weight, dresidual, has_bias, is_rms_norm,
                                zero_centered_gamma, dx_dtype, dres_dtype, sm_margin)
    return dx, _none_to_empty(dres, rsigma), dw, _none_to_empty(db, rsigma)


@_norm_bwd_op.register_fake
def _(dy, z, mu, rsigma, weight, dresidual, has_bias, is_rms_norm, zero_centered_gamma, dx_dtype,
      dres_dtype, sm_margin):
    m, n = z.shape
    dx = z.new_empty((m, n), dtype=dx_dtype)
    two = dres_dtype is not None and dres_dtype != dx_dtype
    dres = z.new_empty((m, n) if two else (0,), dtype=dres_dtype if two else torch.float32)
    dw = z.new_empty(n, dtype=weight.dtype)
    db = z.new_empty(n if has_bias else 0, dtype=weight.dtype if has_bias else torch.float32)
    return dx, dres, dw, db


def _compiling() -> bool:
    return torch.compiler.is_compiling()


def run_norm_fwd(x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin):
    """:func:`norm_fwd` directly in eager mode, through ``engine::norm_fwd`` under torch.compile."""
    if not _compiling():
        return norm_fwd(x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin)
    out, res_out, mu, rsigma = torch.ops.engine.norm_fwd(
        x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin)
    return out, (None if residual is None else res_out), (None if is_rms_norm else mu), rsigma


def run_norm_fwd_fp8(x, weight, bias, residual, scale, amax, eps, is_rms_norm, zero_centered_gamma,
                     fp8_dtype, columnwise, current_scaling, amax_epsilon, sm_margin):
    """:func:`norm_fwd_fp8` directly in eager mode, through ``engine::norm_fwd_fp8`` under compile."""
    args = (x, weight, bias, residual, scale, amax, eps, is_rms_norm, zero_centered_gamma, fp8_dtype,
            columnwise, current_scaling, amax_epsilon, sm_margin)
    if not _compiling():
        return norm_fwd_fp8(*args)
    data, data_t, scale_inv, res_out, mu, rsigma = torch.ops.engine.norm_fwd_fp8(*args)
    return (data, data_t if columnwise else None, scale_inv, None if residual is None else res_out,
            None if is_rms_norm else mu, rsigma)


def run_norm_bwd(dy, z, mu, rsigma, weight, dresidual, has_bias, is_rms_norm, zero_centered_gamma,
                 dx_dtype, dres_dtype, sm_margin):
    """:func:`norm_bwd` directly in eager mode, through ``engine::norm_bwd`` under torch.compile."""
    args = (dy, z, mu, rsigma, weight, dresidual, has_bias, is_rms_norm, zero_centered_gamma,
            dx_dtype, dres_dtype, sm_margin)
    if not _compiling():
        return norm_bwd(*args)
    dx, dres, dw, db = torch.ops.engine.norm_bwd(*args)
    two = dres_dtype is not None and dres_dtype != dx_dtype
    return dx, dres if two else None, dw, db if has_bias else None


__all__ = [
    "HIGH_PRECISION",
    "FP8_DTYPES",
    "check_norm_inputs",
    "as_rows",
    "alloc_entry",
    "norm_fwd",
    "norm_fwd_fp8",
    "norm_bwd",
    "run_norm_fwd",
    "run_norm_fwd_fp8",
    "run_norm_bwd",
]
