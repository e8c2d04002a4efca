"""The test oracle: the op contracts in float64, independent of engine's code.

The backward oracle differentiates the float64 forward with autograd, so it checks the hand-derived
backward formulas of every backend rather than repeating them.
"""

from __future__ import annotations

from typing import Optional

import torch

Tensor = torch.Tensor


def residual_sum(x: Tensor, residual: Tensor) -> Tensor:
    """``x + residual`` rounded to the residual's dtype, as the contract stores it."""
    return (x.double() + residual.double()).to(residual.dtype)


def norm_fwd(x: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float, is_rms_norm: bool,
             zero_centered_gamma: bool = False) -> dict:
    """float64 ``y``, ``mu``, ``rsigma`` of a [M, N] input (already summed with any residual)."""
    z = x.double()
    g = weight.double() + 1.0 if zero_centered_gamma else weight.double()
    if is_rms_norm:
        mu = torch.zeros(z.shape[0], dtype=torch.float64, device=z.device)
        var = (z * z).mean(dim=1)
    else:
        mu = z.mean(dim=1)
        var = ((z - mu[:, None]) ** 2).mean(dim=1)
    rsigma = 1.0 / torch.sqrt(var + eps)
    y = (z - mu[:, None]) * rsigma[:, None] * g
    if bias is not None:
        y = y + bias.double()
    return {"y": y, "mu": mu, "rsigma": rsigma}


def norm_bwd(dy: Tensor, z: Tensor, weight: Tensor, bias: Optional[Tensor], eps: float,
             is_rms_norm: bool, zero_centered_gamma: bool = False,
             dresidual: Optional[Tensor] = None) -> dict:
    """float64 gradients ``dz`` (plus ``dresidual``), ``dweight``, ``dbias`` by autograd."""
    z64 = z.double().detach().requires_grad_(True)
    w64 = weight.double().detach().requires_grad_(True)
    b64 = None if bias is None else bias.double().detach().requires_grad_(True)
    y = norm_fwd(z64, w64, b64, eps, is_rms_norm, zero_centered_gamma)["y"]
    y.backward(dy.double())
    dz = z64.grad
    if dresidual is not None:
        dz = dz + dresidual.double()
    return {"dx": dz, "dweight": w64.grad, "dbias": None if b64 is None else b64.grad}


def fp8_quantize(y: Tensor, scale: float, fp8_dtype: torch.dtype) -> Tensor:
    """Saturating round-to-nearest-even FP8 cast of ``y * scale`` (torch's own cast)."""
    fmax = torch.finfo(fp8_dtype).max
    return torch.clamp(y.double() * scale, -fmax, fmax).float().to(fp8_dtype)
