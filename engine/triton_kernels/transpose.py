"""Tiled FP8 cast + transpose with fused amax, and the bitwise FP8 transpose, in Triton.

A program owns ``BLOCK_M x BLOCK_N`` tiles (persistent loop over tiles): it reads the tile with
coalesced row loads and writes the transposed tile with ``tl.trans`` (the compiler stages it through
shared memory), so both sides are coalesced. The launchers implement the contracts of
:func:`engine.reference.cast_transpose` and :func:`engine.reference.fp8_transpose`.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine.fp8 import fp8_format
from engine.reference import compute_scale
from engine.triton_kernels.launch import Launcher
from engine.triton_kernels.utils import (
    _abs_max,
    _atomic_amax,
    _div_rn,
    _fp8_saturate_cast,
    _scale_from_amax,
    check_fp8_output,
    fp8_consts,
    margin_grid,
    persistent_grid,
    interpreter_rounding,
)

#: (BLOCK_M, BLOCK_N, num_warps, programs_per_sm) of the cast (+ transpose) launches and of the
#: bitwise transpose. Measured on an H200 at M*N = 64M (benchmarks/tune_transpose.py,
#: benchmarks/results/h200_tune_transpose.log): 128 x 128 tiles against the former 64 x 64 with 4
#: warps and 4 programs per SM took cast_transpose from 74-75 to 81-82 % of copy and the bitwise
#: transpose from 53-54 to 77-79 %.
CAST_CONFIG = (128, 128, 8, 4)
COPY_CONFIG = (128, 128, 4, 8)
#: The bitwise transpose's tile order (the CUDA knob engine.cuda_backend.fp8_transpose_order's
#: twin): 1 from the first rows to the last; 2 from the last rows to the first, the transposed
#: copy stored with the evict-first policy, so that the transpose after a norm reads first the
#: rows the norm wrote last, the likeliest still in L2 (NOTES P114); 0 the default (2: on the H100
#: Triton's + T rows gained 0.5-2 points with it, none lost; the CUDA knob's default stays 1). The
#: bytes are the same either way.
FP8_TRANSPOSE_ORDER = 0


@triton.jit
def _cast_transpose_kernel(
    X,  # [M, N] high-precision input, or 1-byte data for a plain transpose
    OUT,  # [M, N] FP8 rowwise output or dummy
    OUT_T,  # [N, M] FP8 transposed output or dummy
    SCALE, AMAX, SCALE_INV,  # [1] fp32 FP8 metadata (dummies for a plain transpose)
    stride_x, stride_o,  # row strides in elements
    M, N,
    fp8_max, amax_epsilon,
    CAST: tl.constexpr,  # False: bitwise transpose of 1-byte data (no scaling, no amax)
    STORE_ROW: tl.constexpr,
    STORE_T: tl.constexpr,
    PASS: tl.constexpr,  # 0: full, 1: amax only (current scaling), 2: quantize with scale from amax
    INTERPRETER: tl.constexpr,
    MANT: tl.constexpr,
    MIN_EXP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    REV: tl.constexpr,  # tiles from the last to the first, OUT_T stored evict-first (FP8_TRANSPOSE_ORDER)
    T_ALIGN: tl.constexpr,  # the largest power of two up to 16 that divides M (t_align)
):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    tiles_n = tl.cdiv(N, BLOCK_N)
    scale = 1.0
    if CAST:
        if PASS == 2:
            scale = _scale_from_amax(tl.load(AMAX), fp8_max, amax_epsilon)
        else:
            scale = tl.load(SCALE)
    amax = 0.0  # running max |x| (utils._abs_max: NaN-propagating)
    ntiles = tl.cdiv(M, BLOCK_M) * tiles_n
    for t0 in tl.range(pid, ntiles, nprog):
        t = ntiles - 1 - t0 if REV else t0
        tm = t // tiles_n
        tn = t % tiles_n
        rows = tm * BLOCK_M + tl.arange(0, BLOCK_M)
        cols = tn * BLOCK_N + tl.arange(0, BLOCK_N)
        mask = (rows[:, None] < M) & (cols[None, :] < N)
        x = tl.load(X + tl.cast(rows, tl.int64)[:, None] * stride_x + cols[None, :], mask=mask, other=0.0)
        if CAST:
            xf = x.to(tl.float32)
            amax = tl.maximum(amax, _abs_max(xf, mask, False, INTERPRETER),  # masked lanes: 0
                              propagate_nan=tl.PropagateNan.ALL)
            q = _fp8_saturate_cast(xf * scale, fp8_max, OUT_T.dtype.element_ty, INTERPRETER, MANT, MIN_EXP)
        else:
            q = x
        if PASS != 1:
            if STORE_ROW:
                tl.store(OUT + tl.cast(rows, tl.int64)[:, None] * stride_o + cols[None, :], q, mask=mask)
            if STORE_T:
                # M itself; written (M // T_ALIGN) * T_ALIGN below 16 so that the compiler knows
                # the copy's rows and mask come in runs of T_ALIGN bytes (Triton specializes M
                # on 16 only) and stores them T_ALIGN bytes at a time, not byte by byte (P134)
                m_t = M if T_ALIGN == 16 else (M // T_ALIGN) * T_ALIGN
                mask_t = (cols[:, None] < N) & (rows[None, :] < m_t)  # built, not tl.trans(mask)
                tl.store(OUT_T + tl.cast(cols, tl.int64)[:, None] * m_t + rows[None, :], tl.trans(q),
                         mask=mask_t, eviction_policy="evict_first" if REV else "")
    if CAST:
        if PASS != 2:
            _atomic_amax(AMAX, amax)
        if pid == 0:
            tl.store(SCALE_INV, _div_rn(1.0, scale))
            if PASS == 2:
                tl.store(SCALE, scale)


_LAUNCH = Launcher(_cast_transpose_kernel)


def t_align(m: int) -> int:
    """The largest power of two up to 16 that divides ``m`` (the transposed copy's row length)."""
    return min(16, m & -m) if m > 0 else 16


@functools.lru_cache(maxsize=None)
def _constexprs(cast, store_row, store_t, pass_, interpreter, mant, min_exp, block_m, block_n,
                rev=False, align=16) -> tuple:
    """The kernel's constexpr tuple (Launcher.launch), built once per combination."""
    return _LAUNCH.constexprs(CAST=cast, STORE_ROW=store_row, STORE_T=store_t, PASS=pass_,
                              INTERPRETER=interpreter, MANT=mant, MIN_EXP=min_exp, BLOCK_M=block_m,
                              BLOCK_N=block_n, REV=rev, T_ALIGN=align)


def _grid(m: int, n: int, device: torch.device, cfg: tuple, sm_margin: int = 0) -> int:
    tiles = -(-m // cfg[0]) * -(-n // cfg[1])
    return persistent_grid(tiles, device, sm_margin, cfg[3])


def cast_transpose(x, scale, amax, scale_inv, out, out_t, *, current_scaling, amax_epsilon):
    """FP8 cast + optional transpose with fused amax; the contract of
    :func:`engine.reference.cast_transpose`."""
    m, n = x.shape
    fp8_dtype = (out if out is not None else out_t).dtype
    check_fp8_output(fp8_dtype, x.device)
    if m == 0:
        if current_scaling:
            amax.zero_()
            scale.copy_(compute_scale(amax, fp8_format(fp8_dtype).max, amax_epsilon))
        scale_inv.copy_(1.0 / scale)
        return
    fp8_max, mant, min_exp = fp8_consts(fp8_dtype)
    bm, bn, warps, _ = cfg = CAST_CONFIG
    grid = _grid(m, n, x.device, cfg)
    any_out = out if out is not None else out_t

    def launch(pass_):
        _LAUNCH.launch(grid, (x, any_out, out_t if out_t is not None else any_out, scale, amax, scale_inv), (
            x.stride(0), out.stride(0) if out is not None else 0, m, n, float(fp8_max),
            float(amax_epsilon)), warps, 3,
            _constexprs(True, out is not None, out_t is not None, pass_, interpreter_rounding(), mant,
                        min_exp, bm, bn, align=t_align(m)))

    if current_scaling:
        amax.zero_()
        launch(1)
        launch(2)
    else:
        launch(0)


def fp8_transpose(data, out_t, sm_margin=0):
    """Bitwise ``out_t = data.T``; the contract of :func:`engine.reference.fp8_transpose`.
    ``sm_margin``: the norm's, where the copy is the tiled transpose after a norm (SMs left free,
    the grid no more than resident on the others: :func:`~engine.triton_kernels.utils.margin_grid`)."""
    m, n = data.shape
    if m == 0 or n == 0:
        return
    src = data.view(torch.uint8)
    dst = out_t.view(torch.uint8)
    bm, bn, warps, _ = cfg = COPY_CONFIG
    tensors, scalars = (src, dst, dst, src, src, src), (src.stride(0), 0, m, n, 0.0, 0.0)
    constexprs = _constexprs(False, False, True, 0, False, 0, 0, bm, bn, FP8_TRANSPOSE_ORDER != 1, t_align(m))
    grid = _grid(m, n, data.device, cfg, sm_margin)
    if sm_margin:
        grid = margin_grid(grid, sm_margin, data.device, _LAUNCH, [(tensors, scalars, warps, 3, constexprs)])
    _LAUNCH.launch(grid, tensors, scalars, warps, 3, constexprs)
