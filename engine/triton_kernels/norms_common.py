"""Launch configuration of the norm kernels and the deterministic reduction of dW/dB partials.

Configs are frozen dataclasses from a heuristic on (N, dtype) -- never on M, so a compiled kernel
serves every batch size. ``ENGINE_TRITON_AUTOTUNE=1`` swaps the heuristic for a measured choice among
a few candidates, cached on (N, dtypes, flags).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from engine.triton_kernels.utils import _cast, interpreter_rounding

#: Widest row (in elements) held in registers; wider rows take the blocked two-pass path.
MAX_FUSED_N = 16384
#: Column chunk of the blocked path.
BLOCKED_CHUNK_N = 4096
#: Rows per program tile for the in-kernel FP8 transpose: a transposed store writes this many
#: contiguous bytes per column (32 B = one DRAM sector).
TRANSPOSE_BLOCK_M = 32
TRANSPOSE_BLOCK_N = 128


@dataclass(frozen=True)
class NormConfig:
    """How one norm kernel is launched.

    block_m: rows per tile; block_n: columns per tile (>= N unless ``blocked``);
    blocked: two passes over column chunks per row tile; num_warps; programs_per_sm: persistent
    programs per multiprocessor; num_stages: software-pipelining depth Triton may apply to the
    persistent row loop.
    """

    block_m: int
    block_n: int
    blocked: bool
    num_warps: int
    programs_per_sm: int
    num_stages: int = 3


def _warps_for(tile_elems: int, elems_per_thread: int) -> int:
    w = tile_elems // (32 * elems_per_thread)
    return int(min(16, max(4, triton.next_power_of_2(max(1, w)))))


def fwd_config(n: int, dtype: torch.dtype, transpose: bool) -> NormConfig:
    """Forward config for rows of ``n`` elements of ``dtype``.

    ``transpose``: the FP8 transposed copy is written by the norm kernel, so a tile is
    ``TRANSPOSE_BLOCK_M`` rows by column chunks (the row tile's statistics come first).
    """
    if transpose:
        bn = min(TRANSPOSE_BLOCK_N, triton.next_power_of_2(n))
        return NormConfig(TRANSPOSE_BLOCK_M, bn, n > bn, 4, 2)
    p2 = triton.next_power_of_2(n)
    if p2 <= MAX_FUSED_N:
        # Tiles of about 8K elements: several rows per tile when rows are short.
        bm = max(1, min(16, 8192 // p2))
        return NormConfig(bm, p2, False, _warps_for(bm * p2, 16), 2)
    return NormConfig(1, BLOCKED_CHUNK_N, True, _warps_for(BLOCKED_CHUNK_N, 8), 2)


def bwd_config(n: int, dtype: torch.dtype) -> NormConfig:
    """Backward config: like the forward, with smaller tiles (it keeps dy, x and dW partials live)."""
    p2 = triton.next_power_of_2(n)
    if p2 <= MAX_FUSED_N:
        bm = max(1, min(16, 4096 // p2))
        return NormConfig(bm, p2, False, _warps_for(bm * p2, 8), 2)
    return NormConfig(1, BLOCKED_CHUNK_N, True, _warps_for(BLOCKED_CHUNK_N, 8), 1)


@triton.jit
def _partials_reduce_kernel(
    PART,  # [P, N] fp32 partials, one row per program of the backward kernel
    OUT,  # [N] result, in OUT's dtype
    P,  # number of partial rows
    N,  # columns
    BLOCK_P: tl.constexpr,  # partial rows summed per step
    BLOCK_N: tl.constexpr,  # columns per program
    INTERPRETER: tl.constexpr,  # interpreter-only rounding workaround (utils._cast)
):
    """OUT[n] = sum_p PART[p, n], in a fixed order: deterministic, no atomics."""
    cols = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cmask = cols < N
    acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        rows = p0 + tl.arange(0, BLOCK_P)
        m = (rows[:, None] < P) & cmask[None, :]
        acc += tl.load(PART + tl.cast(rows, tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0)
    tl.store(OUT + cols, _cast(tl.sum(acc, axis=0), OUT.dtype.element_ty, INTERPRETER), mask=cmask)


def reduce_partials(part: torch.Tensor, out: torch.Tensor) -> None:
    """``out[:] = part.sum(0)`` (fp32 accumulation, fixed order), cast to ``out``'s dtype."""
    p, n = part.shape
    # The interpreter pays per program, the GPU wants many programs: wide column blocks on CPU.
    block_n = 128 if part.is_cuda else 4096
    _partials_reduce_kernel[(triton.cdiv(n, block_n),)](part, out, p, n, BLOCK_P=32, BLOCK_N=block_n,
                                                         INTERPRETER=interpreter_rounding(), num_warps=4)
