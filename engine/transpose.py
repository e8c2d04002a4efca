"""FP8 cast + transpose (``engine.cast_transpose``) and FP8 transpose (``engine.fp8_transpose``).

The backend is chosen by ``ENGINE_USE_CAST_TRANSPOSE_TRITON`` (see :mod:`engine.backend`).
"""

from __future__ import annotations

import torch

from engine import backend
from engine._norm_ops import HIGH_PRECISION, alloc_entry, as_rows
from engine.backend import OpFamily
from engine.fp8 import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

Tensor = torch.Tensor

__all__ = ["cast_transpose", "fp8_transpose"]


def cast_transpose(x: Tensor, quantizer) -> Float8Tensor:
    """Quantize ``x`` (``[..., N]``, float32/float16/bfloat16) to FP8 with fused amax.

    Returns a :class:`Float8Tensor` with rowwise ``data`` (x's shape) if ``quantizer.rowwise`` and
    ``transpose_data`` (``[N, M]`` of the flattened ``[M, N]`` view) if ``quantizer.columnwise``.
    Scaling follows the quantizer: delayed (read ``scale``, max-update ``amax``) or current (amax of
    ``x``, then ``scale = fp8_max / amax``). Not differentiable.
    """
    if not isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        raise TypeError(f"quantizer must be a Float8Quantizer or Float8CurrentScalingQuantizer, got {quantizer!r}")
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"x must be a torch.Tensor, got {type(x).__name__}")
    if x.dtype not in HIGH_PRECISION:
        raise ValueError(f"x must be float32, float16 or bfloat16, got {x.dtype}")
    if x.dim() < 1 or x.shape[-1] < 1:
        raise ValueError(f"x must have a last dimension of size >= 1, got shape {tuple(x.shape)}")
    n = x.shape[-1]
    x2 = as_rows(x, n, "x")
    m = x2.shape[0]
    dev = x.device
    dt = quantizer.fp8_dtype
    scale, amax = quantizer.kernel_buffers(dev)
    impl = backend.select(OpFamily.CAST_TRANSPOSE, dev)
    alloc = alloc_entry(impl, "cast_transpose_alloc")
    if alloc is not None:  # the outputs allocated by the backend in the same call (one host call)
        out, out_t, scale_inv = alloc(x2, scale, amax, dt, quantizer.rowwise, quantizer.columnwise,
                                      quantizer.current_scaling, quantizer.amax_epsilon)
    else:
        out = torch.empty(m, n, dtype=dt, device=dev) if quantizer.rowwise else None
        out_t = torch.empty(n, m, dtype=dt, device=dev) if quantizer.columnwise else None
        scale_inv = torch.empty(1, dtype=torch.float32, device=dev)
        impl.cast_transpose(
            x2, scale, amax, scale_inv, out, out_t,
            current_scaling=quantizer.current_scaling, amax_epsilon=quantizer.amax_epsilon,
        )
    quantizer.record(scale, amax)
    if out is not None and x2 is not x:  # x was not [M, N] already
        out = out.view(x.shape)
    return Float8Tensor(out, scale_inv, dt,
                        transpose_data=out_t, shape=x.shape)


def fp8_transpose(t: Float8Tensor) -> Float8Tensor:
    """Fill ``t.transpose_data`` (``[N, M]``) from its rowwise data, bitwise; returns ``t``."""
    if not isinstance(t, Float8Tensor):
        raise TypeError(f"fp8_transpose takes a Float8Tensor, got {type(t).__name__}")
    if t.data is None:
        raise ValueError("fp8_transpose needs rowwise data")
    n = t.data.shape[-1]
    d2 = as_rows(t.data, n, "data")
    out_t = torch.empty((n, d2.shape[0]), dtype=t.data.dtype, device=t.data.device)
    backend.select(OpFamily.CAST_TRANSPOSE, d2.device).fp8_transpose(d2, out_t)
    t.transpose_data = out_t
    return t
