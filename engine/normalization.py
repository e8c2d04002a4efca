"""RMSNorm and LayerNorm: autograd, functionals and modules.

``engine.rmsnorm`` / ``engine.layernorm`` normalise the trailing dims given by the weight's shape
(any leading dims). Optional, on both norms:

* ``residual=r``: fused residual add. Returns ``(out, residual_out)`` with ``residual_out = x + r``
  in ``r``'s dtype (keep your residual stream in fp32 by passing an fp32 ``r``); the norm is applied
  to ``residual_out``. One pass forward, one pass backward (the gradient of ``residual_out`` is added
  to the norm's input gradient inside the kernel).
* ``quantizer=q`` (an :class:`engine.fp8.Float8Quantizer` or
  :class:`engine.fp8.Float8CurrentScalingQuantizer`): FP8 output as an :class:`engine.fp8.Float8Tensor`,
  with ``transpose_data`` when ``q.columnwise``. FP8 outputs are forward-only: they feed an FP8 GEMM
  whose module owns the backward; asking for a gradient through one raises.
* ``out_dtype``: high-precision output dtype (default: x's), e.g. bf16 in, fp32 out.
* ``zero_centered_gamma``: ``y = xhat * (1 + weight)``, the weight initialised to zeros.
* ``sm_margin``: leave this many SMs free (for concurrent communication kernels): both backends'
  grids, and the tiled transpose after an FP8 norm, then hold no more CTAs (programs) per SM
  than are resident at once, on SMs - sm_margin (Triton: the compiled kernel's occupancy from
  the CUDA driver, ``engine.triton_kernels.utils.margin_grid``).

The backend (CUDA C++ or Triton) is chosen per norm by ``ENGINE_USE_RMSNORM_TRITON`` /
``ENGINE_USE_LAYERNORM_TRITON`` (see :mod:`engine.backend`).
"""

from __future__ import annotations

import numbers
from typing import Optional, Sequence, Tuple, Union

import torch
from torch import nn

from engine import _norm_ops as ops
from engine.fp8 import Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor

Tensor = torch.Tensor

__all__ = ["rmsnorm", "layernorm", "RMSNorm", "LayerNorm"]


def _grad_rows(g: Optional[Tensor], m: int, n: int, dtype: torch.dtype, device) -> Tensor:
    if g is None:
        return torch.zeros((m, n), dtype=dtype, device=device)
    if n > 1 and g.stride(-1) != 1:
        g = g.contiguous()
    if g.dim() == 2:  # _NormFunction's outputs are [m, n] (the views to x's shape are autograd's
        return g      # own ops, whose backward reshapes), so their gradients come as [m, n]
    try:
        return g.view(m, n)
    except RuntimeError:
        return g.reshape(m, n)


class _NormFunction(torch.autograd.Function):
    """Autograd of the high-precision norm on ``[M, N]`` views."""

    @staticmethod
    def forward(ctx, x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin):
        out, res_out, mu, rsigma = ops.run_norm_fwd(
            x, weight, bias, residual, eps, is_rms_norm, zero_centered_gamma, out_dtype, sm_margin)
        z = x if residual is None else res_out
        ctx.save_for_backward(z, weight, mu, rsigma)
        # An output whose gradient nobody asked for comes to backward as None, not as a tensor of
        # zeros: no memset, and no read of it in the backward kernel (dres_out of residual_out).
        ctx.set_materialize_grads(False)
        ctx.cfg = (bias is not None, is_rms_norm, zero_centered_gamma, x.dtype,
                   None if residual is None else residual.dtype, sm_margin, out.dtype)
        # One output without a residual, two with: a None output would trip torch.compile.
        return out if res_out is None else (out, res_out)

    @staticmethod
    def backward(ctx, dout, dres_out=None):
        z, weight, mu, rsigma = ctx.saved_tensors
        has_bias, is_rms_norm, zcg, x_dtype, res_dtype, sm_margin, out_dtype = ctx.cfg
        m, n = z.shape
        dy = _grad_rows(dout, m, n, out_dtype, z.device)
        dres_in = None
        if res_dtype is not None and dres_out is not None:
            dres_in = _grad_rows(dres_out, m, n, res_dtype, z.device)
        dx, dres, dw, db = ops.run_norm_bwd(
            dy, z, mu, rsigma, weight, dres_in, has_bias, is_rms_norm, zcg, x_dtype, res_dtype, sm_margin)
        dresidual = None
        if res_dtype is not None:
            dresidual = dres if dres is not None else dx
        return dx, dw, db, dresidual, None, None, None, None, None


def _needs_grad(x: Tensor, weight: Tensor, bias: Optional[Tensor], residual: Optional[Tensor]) -> bool:
    if not torch.is_grad_enabled():
        return False
    return (x.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)
            or (residual is not None and residual.requires_grad))


def _norm(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    eps: float,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    residual: Optional[Tensor],
    quantizer,
    out_dtype: Optional[torch.dtype],
    sm_margin: int,
):
    x2, w, b, r2 = ops.check_norm_inputs(x, weight, bias, residual, eps, sm_margin)
    if quantizer is not None:
        return _norm_fp8(x, x2, w, b, r2, residual, weight, bias, eps, is_rms_norm,
                         zero_centered_gamma, quantizer, out_dtype, sm_margin)
    out_dtype = x.dtype if out_dtype is None else out_dtype
    if out_dtype not in ops.HIGH_PRECISION:
        raise ValueError(
            f"out_dtype must be float32, float16 or bfloat16, got {out_dtype}; for FP8 output pass a "
            f"quantizer"
        )
    if _needs_grad(x, weight, bias, residual):
        res = _NormFunction.apply(x2, w, b, r2, float(eps), is_rms_norm, zero_centered_gamma, out_dtype,
                                  sm_margin)
        out, res_out = (res, None) if residual is None else res
    else:
        out, res_out, _, _ = ops.run_norm_fwd(x2, w, b, r2, float(eps), is_rms_norm,
                                              zero_centered_gamma, out_dtype, sm_margin)
    if x2 is not x:  # x was not [M, N] already (check_norm_inputs returns x itself when it is)
        out = out.view(x.shape)
        if residual is not None:
            res_out = res_out.view(x.shape)
    return out if residual is None else (out, res_out)


def _norm_fp8(x, x2, w, b, r2, residual, weight, bias, eps, is_rms_norm, zero_centered_gamma,
              quantizer, out_dtype, sm_margin):
    if not isinstance(quantizer, (Float8Quantizer, Float8CurrentScalingQuantizer)):
        raise TypeError(f"quantizer must be a Float8Quantizer or Float8CurrentScalingQuantizer, got {quantizer!r}")
    if out_dtype is not None:
        raise ValueError("out_dtype and quantizer are exclusive: the quantizer sets the FP8 output dtype")
    if _needs_grad(x, weight, bias, residual):
        raise NotImplementedError(
            "FP8 norm outputs are forward-only: run under torch.no_grad(), or use the high-precision "
            "output (no quantizer) when you need gradients through the norm"
        )
    if not quantizer.rowwise:
        raise ValueError("norm FP8 outputs always carry rowwise data: construct the quantizer with rowwise=True")
    scale, amax = quantizer.kernel_buffers(x.device)
    data, data_t, scale_inv, res_out, _, _ = ops.run_norm_fwd_fp8(
        x2, w, b, r2, scale, amax, float(eps), is_rms_norm, zero_centered_gamma, quantizer.fp8_dtype,
        quantizer.columnwise, quantizer.current_scaling, quantizer.amax_epsilon, sm_margin)
    quantizer.record(scale, amax)
    same = x2 is x  # x was [M, N] already: no views back (a view costs host time: 2 us here)
    t = Float8Tensor(data if same else data.view(x.shape), scale_inv, quantizer.fp8_dtype,
                     transpose_data=data_t)
    if residual is None:
        return t
    return t, res_out if same else res_out.view(x.shape)


def rmsnorm(
    x: Tensor,
    weight: Tensor,
    eps: float = 1e-6,
    *,
    zero_centered_gamma: bool = False,
    residual: Optional[Tensor] = None,
    quantizer=None,
    out_dtype: Optional[torch.dtype] = None,
    sm_margin: int = 0,
):
    """RMSNorm over the trailing dims of ``x`` given by ``weight.shape``.

    ``y = x / sqrt(mean(x^2) + eps) * g`` with ``g = weight`` (``1 + weight`` when
    ``zero_centered_gamma``). x: float32/float16/bfloat16, any leading dims, unit stride in the last
    dim; weight: x's dtype or float32. Returns ``y`` (``out_dtype``, default x's dtype), or
    ``(y, residual_out)`` with ``residual=``, or a :class:`Float8Tensor` with ``quantizer=`` (see the
    module docstring).
    """
    return _norm(x, weight, None, eps, True, zero_centered_gamma, residual, quantizer, out_dtype, sm_margin)


def layernorm(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor] = None,
    eps: float = 1e-5,
    *,
    zero_centered_gamma: bool = False,
    quantizer=None,
    residual: Optional[Tensor] = None,
    out_dtype: Optional[torch.dtype] = None,
    sm_margin: int = 0,
):
    """LayerNorm over the trailing dims of ``x`` given by ``weight.shape``.

    ``y = (x - mean(x)) / sqrt(var(x) + eps) * g + bias`` (biased variance in fp32: from one pass's
    sums of x and x^2 where mean^2 <= 3 var, from centred values otherwise). The CUDA backend
    forms ``(x - mean) * rsigma`` as one FMA, ``fma(x, rsigma, -mean * rsigma)``, on rows whose
    mean is within 4 standard deviations (at most 2^-22 more error, in units of the standard
    deviation, than the subtraction; the other rows subtract, as do the 16-bit outputs of its
    streamed path: 16-bit x without a residual, rows of 16K columns or more). Same dtypes, options
    and returns as :func:`rmsnorm`; ``bias`` is optional and has weight's shape and dtype.
    """
    return _norm(x, weight, bias, eps, False, zero_centered_gamma, residual, quantizer, out_dtype, sm_margin)


def _shape(normalized_shape: Union[int, Sequence[int]]) -> Tuple[int, ...]:
    if isinstance(normalized_shape, numbers.Integral):
        return (int(normalized_shape),)
    return tuple(int(s) for s in normalized_shape)


class _NormBase(nn.Module):
    def __init__(self, normalized_shape, eps, zero_centered_gamma, sm_margin, bias, device, dtype):
        super().__init__()
        self.normalized_shape = _shape(normalized_shape)
        self.eps = eps
        self.zero_centered_gamma = zero_centered_gamma
        self.sm_margin = sm_margin
        kw = {"device": device, "dtype": dtype}
        self.weight = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        if bias:
            self.bias = nn.Parameter(torch.empty(self.normalized_shape, **kw))
        else:
            self.register_parameter("bias", None)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        """Weight to ones (zeros under ``zero_centered_gamma``), bias to zeros."""
        with torch.no_grad():
            if self.zero_centered_gamma:
                self.weight.zero_()
            else:
                self.weight.fill_(1.0)
            if self.bias is not None:
                self.bias.zero_()

    def extra_repr(self) -> str:
        return (f"{self.normalized_shape}, eps={self.eps}, zero_centered_gamma={self.zero_centered_gamma}, "
                f"sm_margin={self.sm_margin}")


class RMSNorm(_NormBase):
    """RMSNorm layer; its ``state_dict`` loads from and into ``torch.nn.RMSNorm``.

    Args:
        normalized_shape: trailing dims to normalise (int or tuple).
        eps: added to the mean square.
        zero_centered_gamma: ``y = xhat * (1 + weight)``; weight starts at zeros instead of ones.
        sm_margin: SMs the kernels leave free.
        device, dtype: of the weight.

    ``forward(x, residual=None, quantizer=None)`` returns what :func:`engine.rmsnorm` returns.
    """

    def __init__(self, normalized_shape, eps: float = 1e-6, *, zero_centered_gamma: bool = False,
                 sm_margin: int = 0, device=None, dtype=None) -> None:
        super().__init__(normalized_shape, eps, zero_centered_gamma, sm_margin, False, device, dtype)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, quantizer=None):
        """RMSNorm of ``x`` (or of ``x + residual``): what :func:`engine.rmsnorm` returns."""
        return _norm(x, self.weight, None, self.eps, True, self.zero_centered_gamma, residual, quantizer,
                     None, self.sm_margin)


class LayerNorm(_NormBase):
    """LayerNorm layer; its ``state_dict`` loads from and into ``torch.nn.LayerNorm``.

    Args:
        normalized_shape: trailing dims to normalise (int or tuple).
        eps: added to the variance.
        bias: learn an additive bias (``torch.nn.LayerNorm(bias=...)``).
        zero_centered_gamma: ``y = xhat * (1 + weight) + bias``; weight starts at zeros.
        sm_margin: SMs the kernels leave free.
        device, dtype: of the parameters.

    ``forward(x, residual=None, quantizer=None)`` returns what :func:`engine.layernorm` returns.
    """

    def __init__(self, normalized_shape, eps: float = 1e-5, *, bias: bool = True,
                 zero_centered_gamma: bool = False, sm_margin: int = 0, device=None, dtype=None) -> None:
        super().__init__(normalized_shape, eps, zero_centered_gamma, sm_margin, bias, device, dtype)

    def forward(self, x: Tensor, residual: Optional[Tensor] = None, quantizer=None):
        """LayerNorm of ``x`` (or of ``x + residual``): what :func:`engine.layernorm` returns."""
        return _norm(x, self.weight, self.bias, self.eps, False, self.zero_centered_gamma, residual,
                     quantizer, None, self.sm_margin)
