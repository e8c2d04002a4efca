"""Triton implementations of engine's op contracts (see :mod:`engine.reference` for the contracts).

They run on CUDA tensors, and on CPU tensors in Triton's interpreter (``TRITON_INTERPRET=1``).
"""

from engine.triton_kernels.norms import norm_bwd, norm_fwd
from engine.triton_kernels.transpose import cast_transpose, fp8_transpose

__all__ = ["norm_fwd", "norm_bwd", "cast_transpose", "fp8_transpose", "IN_KERNEL_TRANSPOSE_MAX_N"]

#: The FP8 transposed norm output comes from the norm kernel at no width when
#: ENGINE_NORM_EXTERNAL_TRANSPOSE is unset: Triton's in-kernel path (_norm_fwd_kernel_t, compiled
#: without N's specialisation) measured 4-30 % of copy against 44-65 % external (README).
IN_KERNEL_TRANSPOSE_MAX_N = {"rmsnorm": 0, "layernorm": 0}
