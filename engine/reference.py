"""The op contracts in plain PyTorch (fp32 math): the CPU path of every op family.

Every backend (this module, ``engine.triton_kernels``, ``engine.cuda_backend``) implements the same
non-allocating functions with the same signatures. The caller allocates every output (the allocating
wrappers live in ``engine._norm_ops``); implementations write into them and never reshape or copy
their inputs. Inputs are 2-D ``[M, N]`` with unit stride in the last dim and any row stride.
Statistics (``mu``, ``rsigma``) are fp32 ``[M]``.

Norm forward (``is_rms_norm`` picks the formula)::

    z      = x + residual            (residual given; written to residual_out in its dtype)
    mu     = mean(z)                 (LayerNorm; 0 for RMSNorm)
    rsigma = 1 / sqrt(mean((z - mu)^2) + eps)           (RMSNorm: 1 / sqrt(mean(z^2) + eps))
    g      = 1 + weight if zero_centered_gamma else weight
    y      = (z - mu) * rsigma * g + bias

``out`` receives ``y`` in its dtype. When ``out`` is an FP8 tensor (e4m3fn / e5m2) the FP8 metadata
tensors are required: ``scale`` (fp32 [1]), ``amax`` (fp32 [1]), ``scale_inv`` (fp32 [1]), and
``out`` receives ``saturate(y * scale)`` cast with round-to-nearest-even, where ``saturate`` clamps
to the format's finite range. Delayed scaling (``current_scaling=False``) reads ``scale`` and
max-updates ``amax`` with ``max|y|`` (before scaling). Current scaling first computes
``amax = max|y|`` (written to ``amax``), then ``scale = fp8_max / max(amax, amax_epsilon)`` (1 when
that is 0 or not finite), written to ``scale``, and quantizes with it. Both write
``scale_inv = 1 / scale``. ``out_t``, if given, receives the FP8 data transposed, ``[N, M]``;
with ``out_t_auto`` a backend writes it by whichever of its paths is faster at that width (its norm
kernel or a tiled transpose after it), with ``out_t_after`` by a tiled transpose after the norm,
with neither by its norm kernel where that can; the bytes are the same in every case (here there
is one path).

Norm backward: ``dz = d(norm)/dz . dy + dresidual``; ``dx`` receives ``dz`` (and ``dres``, when
given, the same values in the residual's dtype); ``dweight = sum_rows(dy * xhat)``,
``dbias = sum_rows(dy)``. With ``xhat = (z - mu) * rsigma`` and ``dyg = dy * g``::

    RMSNorm:    dz = rsigma * (dyg - xhat * mean(dyg * xhat))
    LayerNorm:  dz = rsigma * (dyg - mean(dyg) - xhat * mean(dyg * xhat))
"""

from __future__ import annotations

from typing import Optional

import torch

from engine.fp8 import fp8_format

Tensor = torch.Tensor

__all__ = ["norm_fwd", "norm_bwd", "cast_transpose", "fp8_transpose", "compute_scale", "quantize",
           "check_out_t_modes", "IN_KERNEL_TRANSPOSE_MAX_N", "SMALL_COPY_ROWS"]

#: The reference writes both layouts either way (bitwise the same); with
#: ENGINE_NORM_EXTERNAL_TRANSPOSE unset the transposed copy comes from fp8_transpose, as on GPUs.
IN_KERNEL_TRANSPOSE_MAX_N = {"rmsnorm": 0, "layernorm": 0}
#: The reference has no in-kernel writer to leave SMs idle (engine._norm_ops.external_transpose).
SMALL_COPY_ROWS = 0


def check_out_t_modes(out_t_auto: bool, out_t_after: bool) -> None:
    """The norm forward's two ways of choosing the transposed copy's writer exclude each other
    (every backend's ``norm_fwd`` checks its arguments with this): raises ValueError for both."""
    if out_t_auto and out_t_after:
        raise ValueError("norm_fwd: out_t_auto and out_t_after exclude each other")


def compute_scale(amax: Tensor, fp8_max: float, amax_epsilon: float) -> Tensor:
    """Current-scaling scale from an fp32 amax: ``fp8_max / max(amax, eps)``, 1 if not usable.

    One IEEE fp32 division, as the kernels do (torch evaluates ``float / tensor`` as
    ``tensor.reciprocal() * float``, two roundings, so the numerator is made a tensor).
    """
    a = torch.clamp(amax.float(), min=amax_epsilon)
    scale = torch.full_like(a, fp8_max) / a
    ok = (a > 0) & torch.isfinite(scale) & (scale > 0)
    return torch.where(ok, scale, torch.ones_like(scale))


def quantize(y: Tensor, scale: Tensor, fp8_dtype: torch.dtype) -> Tensor:
    """Saturating FP8 cast of fp32 ``y * scale`` (round to nearest even)."""
    fmax = fp8_format(fp8_dtype).max
    return torch.clamp(y * scale, -fmax, fmax).to(fp8_dtype)


def _emit(
    y: Tensor,
    out: Tensor,
    scale: Optional[Tensor],
    amax: Optional[Tensor],
    scale_inv: Optional[Tensor],
    out_t: Optional[Tensor],
    current_scaling: bool,
    amax_epsilon: float,
) -> None:
    """Write fp32 ``y`` to ``out``: a plain cast, or the FP8 epilogue (amax, scale, cast, transpose)."""
    if not out.dtype.is_floating_point or out.element_size() != 1:
        out.copy_(y)
        return
    fmt = fp8_format(out.dtype)
    tile_amax = y.abs().amax() if y.numel() else y.new_zeros(())
    if current_scaling:
        amax.copy_(tile_amax.reshape(1))
        scale.copy_(compute_scale(amax, fmt.max, amax_epsilon))
    else:
        amax.copy_(torch.maximum(amax, tile_amax.reshape(1)))
    q = quantize(y, scale.float(), out.dtype)
    out.copy_(q)
    if out_t is not None:
        out_t.copy_(q.t())
    scale_inv.copy_(1.0 / scale.float())


def norm_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    out: Tensor,
    residual_out: Optional[Tensor],
    mu: Optional[Tensor],
    rsigma: Tensor,
    scale: Optional[Tensor],
    amax: Optional[Tensor],
    scale_inv: Optional[Tensor],
    out_t: Optional[Tensor],
    *,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    current_scaling: bool,
    amax_epsilon: float,
    sm_margin: int,
    out_t_auto: bool = False,
    out_t_after: bool = False,
) -> None:
    """Norm forward (see the module docstring). ``sm_margin``, ``out_t_auto`` and ``out_t_after``
    are accepted and unused here (one path)."""
    check_out_t_modes(out_t_auto, out_t_after)
    del sm_margin
    z = x.float()
    if residual is not None:
        z = z + residual.float()
        residual_out.copy_(z)
        z = residual_out.float()  # normalise what was stored, as the kernels do
    n = z.shape[1]
    if is_rms_norm:
        var = (z * z).sum(dim=1) / n
        zc = z
    else:
        mean = z.sum(dim=1) / n
        zc = z - mean[:, None]
        var = (zc * zc).sum(dim=1) / n
        mu.copy_(mean)
    rs = torch.rsqrt(var + eps)
    rsigma.copy_(rs)
    g = weight.float() + 1.0 if zero_centered_gamma else weight.float()
    y = zc * rs[:, None] * g
    if bias is not None:
        y = y + bias.float()
    _emit(y, out, scale, amax, scale_inv, out_t, current_scaling, amax_epsilon)


def norm_bwd(
    dy: Tensor,
    x: Tensor,
    mu: Optional[Tensor],
    rsigma: Tensor,
    weight: Tensor,
    dresidual: Optional[Tensor],
    dx: Tensor,
    dres: Optional[Tensor],
    dweight: Tensor,
    dbias: Optional[Tensor],
    *,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    sm_margin: int,
) -> None:
    """Norm backward (see the module docstring). ``x`` is the normalised input (z)."""
    del sm_margin
    z = x.float()
    dyf = dy.float()
    n = z.shape[1]
    rs = rsigma.float()[:, None]
    xhat = z * rs if is_rms_norm else (z - mu.float()[:, None]) * rs
    g = weight.float() + 1.0 if zero_centered_gamma else weight.float()
    dyg = dyf * g
    c2 = (dyg * xhat).sum(dim=1, keepdim=True) / n
    if is_rms_norm:
        dz = rs * (dyg - xhat * c2)
    else:
        c1 = dyg.sum(dim=1, keepdim=True) / n
        dz = rs * (dyg - c1 - xhat * c2)
    if dresidual is not None:
        dz = dz + dresidual.float()
    dx.copy_(dz)
    if dres is not None:
        dres.copy_(dz)
    dweight.copy_((dyf * xhat).sum(dim=0))
    if dbias is not None:
        dbias.copy_(dyf.sum(dim=0))


def cast_transpose(
    x: Tensor,
    scale: Tensor,
    amax: Tensor,
    scale_inv: Tensor,
    out: Optional[Tensor],
    out_t: Optional[Tensor],
    *,
    current_scaling: bool,
    amax_epsilon: float,
) -> None:
    """FP8 cast of ``x`` with fused amax into ``out`` (``[M, N]``) and/or ``out_t`` (``[N, M]``).

    Scaling, amax and ``scale_inv`` follow the norm's FP8 epilogue; at least one output is given.
    """
    y = x.float()
    target = out if out is not None else torch.empty_like(y, dtype=out_t.dtype)
    _emit(y, target, scale, amax, scale_inv, out_t, current_scaling, amax_epsilon)


def fp8_transpose(data: Tensor, out_t: Tensor) -> None:
    """``out_t[n, m] = data[m, n]`` for FP8 ``data`` ``[M, N]`` (bitwise copy)."""
    out_t.copy_(data.t())
