"""Triton implementations of engine's op contracts (see :mod:`engine.reference` for the contracts).

They run on CUDA tensors, and on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from engine.triton_kernels.norms import IN_KERNEL_TRANSPOSE_MAX_N, SMALL_COPY_ROWS, norm_bwd, norm_fwd
from engine.triton_kernels.transpose import cast_transpose, fp8_transpose

__all__ = ["norm_fwd", "norm_bwd", "cast_transpose", "fp8_transpose", "IN_KERNEL_TRANSPOSE_MAX_N",
           "SMALL_COPY_ROWS"]
