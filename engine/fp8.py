"""FP8 formats, quantizers, the delayed-scaling recipe and ``Float8Tensor``.

A *quantizer* tells a kernel how to turn its fp32 result ``y`` into FP8::

    data      = saturate(y * scale).to(fp8_dtype)     # round to nearest even, clamp to +-fp8_max
    scale_inv = 1 / scale                             # written by the kernel, kept with the data
    amax      = max(amax, max|y|)                     # delayed scaling: max-updated in the same pass

Two kinds, as in Transformer Engine:

* :class:`Float8Quantizer` -- *delayed scaling*: ``scale`` comes from the amax history of earlier
  steps (see :class:`DelayedScaling`); the kernel reads it once and updates ``amax`` in place.
* :class:`Float8CurrentScalingQuantizer` -- *current scaling*: the scale comes from this tensor's own
  amax, ``scale = fp8_max / max(amax, amax_epsilon)``; the kernels compute the amax first (pass 1)
  and quantize with it (pass 2).

The result is a :class:`Float8Tensor`: rowwise ``data`` of the input's shape, ``scale_inv``, and
optionally ``transpose_data`` (``[N, M]`` of the flattened 2-D view), the operand layout the
weight-gradient GEMM wants. Both feed ``torch._scaled_mm`` directly.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

Tensor = torch.Tensor

__all__ = [
    "FP8Format",
    "fp8_format",
    "FP8_DTYPES",
    "Float8Quantizer",
    "Float8CurrentScalingQuantizer",
    "Float8Tensor",
    "DelayedScaling",
]


@dataclass(frozen=True)
class FP8Format:
    """Facts about one FP8 format.

    ``max`` is the largest finite value, ``mantissa_bits`` the stored mantissa width and
    ``min_normal_exp`` the exponent of the smallest normal number (subnormals step by
    ``2 ** (min_normal_exp - mantissa_bits)``).
    """

    dtype: torch.dtype
    max: float
    mantissa_bits: int
    min_normal_exp: int


_FORMATS = {
    torch.float8_e4m3fn: FP8Format(torch.float8_e4m3fn, 448.0, 3, -6),
    torch.float8_e5m2: FP8Format(torch.float8_e5m2, 57344.0, 2, -14),
}
#: The FP8 dtypes engine produces (e4m3 "fn": no inf, max 448; e5m2: max 57344).
FP8_DTYPES = tuple(_FORMATS)


def fp8_format(dtype: torch.dtype) -> FP8Format:
    """The :class:`FP8Format` of ``dtype``; ``ValueError`` for anything but e4m3fn / e5m2."""
    try:
        return _FORMATS[dtype]
    except KeyError:
        raise ValueError(
            f"fp8_dtype must be torch.float8_e4m3fn or torch.float8_e5m2, got {dtype}"
        ) from None


def _check_meta(name: str, t: Tensor) -> None:
    if not isinstance(t, torch.Tensor) or t.dtype != torch.float32 or t.numel() != 1:
        raise ValueError(f"{name} must be a float32 tensor of one element, got {t!r}")


class _QuantizerBase:
    fp8_dtype: torch.dtype
    rowwise: bool
    columnwise: bool

    def _init_usage(self, fp8_dtype: torch.dtype, rowwise: bool, columnwise: bool) -> None:
        fp8_format(fp8_dtype)
        if not (rowwise or columnwise):
            raise ValueError("a quantizer must produce rowwise data, columnwise data, or both")
        self.fp8_dtype = fp8_dtype
        self.rowwise = bool(rowwise)
        self.columnwise = bool(columnwise)

    @property
    def fp8_max(self) -> float:
        """Largest finite value of the format."""
        return fp8_format(self.fp8_dtype).max

    def kernel_buffers(self, device: torch.device):
        """``(scale, amax)`` device tensors a kernel quantizing for tensors on ``device`` uses.

        Delayed scaling: the quantizer's own (read / max-updated). Current scaling: fresh ones the
        kernel writes; hand them back with :meth:`record` afterwards.
        """
        if self.current_scaling:
            return (torch.empty(1, dtype=torch.float32, device=device),
                    torch.empty(1, dtype=torch.float32, device=device))
        if self.scale.device != device:
            raise ValueError(f"the quantizer's scale/amax are on {self.scale.device} but the input is on {device}")
        return self.scale, self.amax

    def record(self, scale: Tensor, amax: Tensor) -> None:
        """Current scaling: keep the scale and amax used for the last tensor (no-op for delayed)."""
        if self.current_scaling:
            self.scale, self.amax = scale, amax


class Float8Quantizer(_QuantizerBase):
    """Delayed scaling: quantize with a given ``scale`` and max-update ``amax``.

    Args:
        scale: fp32 device tensor of one element, read by the kernel.
        amax: fp32 device tensor of one element; the kernel sets it to ``max(amax, max|y|)``.
        fp8_dtype: ``torch.float8_e4m3fn`` or ``torch.float8_e5m2``.
        rowwise: produce ``data`` (``[..., N]``, the input's shape).
        columnwise: also produce ``transpose_data`` (``[N, M]``).
    """

    current_scaling = False
    amax_epsilon = 0.0

    def __init__(
        self,
        scale: Tensor,
        amax: Tensor,
        fp8_dtype: torch.dtype,
        *,
        rowwise: bool = True,
        columnwise: bool = False,
    ) -> None:
        _check_meta("scale", scale)
        _check_meta("amax", amax)
        if scale.device != amax.device:
            raise ValueError(f"scale ({scale.device}) and amax ({amax.device}) must share a device")
        self._init_usage(fp8_dtype, rowwise, columnwise)
        self.scale = scale.reshape(1)
        self.amax = amax.reshape(1)
        self.amax_history: Optional[Tensor] = None

    def __repr__(self) -> str:
        return (
            f"Float8Quantizer(fp8_dtype={self.fp8_dtype}, rowwise={self.rowwise}, "
            f"columnwise={self.columnwise})"
        )


class Float8CurrentScalingQuantizer(_QuantizerBase):
    """Current scaling: the scale comes from the tensor's own amax.

    ``scale = fp8_max / max(amax, amax_epsilon)`` (1 if that is zero or not finite). After a
    quantization, :attr:`amax` and :attr:`scale` hold the values used for the last tensor.
    """

    current_scaling = True

    def __init__(
        self,
        fp8_dtype: torch.dtype,
        *,
        rowwise: bool = True,
        columnwise: bool = False,
        amax_epsilon: float = 0.0,
    ) -> None:
        self._init_usage(fp8_dtype, rowwise, columnwise)
        if not amax_epsilon >= 0.0:
            raise ValueError(f"amax_epsilon must be >= 0, got {amax_epsilon}")
        self.amax_epsilon = float(amax_epsilon)
        self.amax: Optional[Tensor] = None
        self.scale: Optional[Tensor] = None

    def __repr__(self) -> str:
        return (
            f"Float8CurrentScalingQuantizer(fp8_dtype={self.fp8_dtype}, rowwise={self.rowwise}, "
            f"columnwise={self.columnwise}, amax_epsilon={self.amax_epsilon})"
        )


Quantizer = (Float8Quantizer, Float8CurrentScalingQuantizer)


class Float8Tensor:
    """FP8 data with its scale.

    Attributes:
        data: FP8 tensor of the logical shape (rowwise), or None if only columnwise was asked.
        scale_inv: fp32 tensor of one element; ``dequantized = data.float() * scale_inv``.
        transpose_data: FP8 ``[N, M]`` (the flattened 2-D view transposed), or None.
        fp8_dtype: the FP8 dtype of ``data`` / ``transpose_data``.

    ``torch._scaled_mm(a.data, b.transpose_data.t(), scale_a=a.scale_inv, scale_b=...)`` consumes
    it directly.
    """

    __slots__ = ("data", "scale_inv", "transpose_data", "fp8_dtype", "_shape")

    def __init__(
        self,
        data: Optional[Tensor],
        scale_inv: Tensor,
        fp8_dtype: torch.dtype,
        transpose_data: Optional[Tensor] = None,
        shape: Optional[torch.Size] = None,
    ) -> None:
        fp8_format(fp8_dtype)
        if data is None and transpose_data is None:
            raise ValueError("Float8Tensor needs data, transpose_data, or both")
        self.data = data
        self.scale_inv = scale_inv
        self.transpose_data = transpose_data
        self.fp8_dtype = fp8_dtype
        if shape is None:
            shape = data.shape if data is not None else transpose_data.t().shape
        self._shape = torch.Size(shape)

    @property
    def shape(self) -> torch.Size:
        """The logical shape (that of the high-precision tensor it quantizes)."""
        return self._shape

    @property
    def device(self) -> torch.device:
        """The device of the data (that of ``scale_inv``)."""
        return self.scale_inv.device

    def size(self, dim: Optional[int] = None):
        """The logical shape, or its extent in ``dim``, as ``torch.Tensor.size``."""
        return self._shape if dim is None else self._shape[dim]

    def dequantize(self, dtype: torch.dtype = torch.float32) -> Tensor:
        """``data * scale_inv`` in ``dtype`` (from ``transpose_data`` if there is no rowwise data)."""
        if self.data is not None:
            d = self.data
        else:
            d = self.transpose_data.t().reshape(self._shape)
        return (d.float() * self.scale_inv.float()).to(dtype)

    def __repr__(self) -> str:
        return (
            f"Float8Tensor(shape={tuple(self._shape)}, fp8_dtype={self.fp8_dtype}, "
            f"transpose={'yes' if self.transpose_data is not None else 'no'}, "
            f"device={self.device})"
        )


class DelayedScaling:
    """Delayed-scaling recipe: the next scale comes from a history of amaxes.

    Each :class:`Float8Quantizer` made by :meth:`make_quantizer` owns an ``amax_history``
    ``[amax_history_len]``; its ``amax`` is ``amax_history[0]``, the slot the kernels max-update
    during a step. :meth:`update` then, as Transformer Engine does:

    1. ``amax = max(history)`` (``"max"``) or ``history[0]`` (``"most_recent"``);
    2. ``scale = fp8_max / amax / 2**margin``, keeping the old scale when ``amax`` is 0 or not finite;
    3. rolls the history by one (the newest amax moves to the end, the oldest is dropped) and zeroes
       slot 0 for the next step.
    """

    def __init__(
        self, amax_history_len: int = 1024, margin: int = 0, amax_compute_algo: str = "max"
    ) -> None:
        if amax_history_len < 1:
            raise ValueError(f"amax_history_len must be >= 1, got {amax_history_len}")
        if amax_compute_algo not in ("max", "most_recent"):
            raise ValueError(
                f"amax_compute_algo must be 'max' or 'most_recent', got {amax_compute_algo!r}"
            )
        self.amax_history_len = int(amax_history_len)
        self.margin = int(margin)
        self.amax_compute_algo = amax_compute_algo

    def make_quantizer(
        self,
        fp8_dtype: torch.dtype = torch.float8_e4m3fn,
        *,
        device=None,
        rowwise: bool = True,
        columnwise: bool = False,
    ) -> Float8Quantizer:
        """A quantizer with ``scale = 1`` and a zeroed history on ``device``."""
        hist = torch.zeros(self.amax_history_len, dtype=torch.float32, device=device)
        scale = torch.ones(1, dtype=torch.float32, device=device)
        q = Float8Quantizer(scale, hist[0:1], fp8_dtype, rowwise=rowwise, columnwise=columnwise)
        q.amax_history = hist
        return q

    @torch.no_grad()
    def update(self, quantizer: Float8Quantizer) -> None:
        """Compute the next scale from the history and roll it (see the class docstring)."""
        hist = quantizer.amax_history
        if hist is None:
            raise ValueError("update() needs a quantizer made by DelayedScaling.make_quantizer")
        amax = hist.max() if self.amax_compute_algo == "max" else hist[0]
        new = torch.full_like(amax, quantizer.fp8_max) / amax / (2.0**self.margin)
        ok = (amax > 0) & torch.isfinite(amax)
        quantizer.scale.copy_(torch.where(ok, new, quantizer.scale[0]).reshape(1))
        hist.copy_(torch.roll(hist, -1, 0))
        hist[0].zero_()
