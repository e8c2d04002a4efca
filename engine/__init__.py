"""engine: fused norm, FP8 and activation kernels for training transformers.

Public API:

* :func:`rmsnorm`, :func:`layernorm`, :class:`RMSNorm`, :class:`LayerNorm` -- norms with optional
  fused residual add and FP8 output (``engine.normalization``).
* :func:`cast_transpose`, :func:`fp8_transpose` -- FP8 cast with fused amax and tiled transposes.
* :class:`Float8Quantizer`, :class:`Float8CurrentScalingQuantizer`, :class:`Float8Tensor`,
  :class:`DelayedScaling` -- FP8 scaling (``engine.fp8``).
* :mod:`engine.backend` -- backend selection; ``engine.backend.describe()`` says what runs where.
"""

from engine import backend
from engine.fp8 import DelayedScaling, Float8CurrentScalingQuantizer, Float8Quantizer, Float8Tensor
from engine.normalization import LayerNorm, RMSNorm, layernorm, rmsnorm
from engine.transpose import cast_transpose, fp8_transpose

__version__ = "0.1.0"

__all__ = [
    "backend",
    "rmsnorm",
    "layernorm",
    "RMSNorm",
    "LayerNorm",
    "cast_transpose",
    "fp8_transpose",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8Tensor",
    "DelayedScaling",
]
