"""RMSNorm and LayerNorm in Triton: one forward and one backward kernel, ``IS_RMS_NORM`` picks the norm.

Both kernels are persistent: a grid of about ``programs_per_sm * (SMs - sm_margin)`` programs, each
looping over tiles of ``BLOCK_M`` rows (under an sm_margin no more than fit those SMs at once:
:func:`engine.triton_kernels.utils.margin_grid`). On the register path (``BLOCKED`` false) a row
tile stays in registers from its load to its output, and gamma, beta and the FP8 scale are loaded
once, before the row loop. The blocked path makes two passes over column chunks per row tile
(statistics, then output), the second re-reading x from L2; the configs (norms_common) take it for
every row too wide for registers and, where it measured faster, for rows that would fit (one chunk
of 16K at 16K: no row held in registers across its reduction, so more rows in flight per SM). The LayerNorm
forward runs without masks where every tile lies inside the tensor and converts bf16 by bit
shifts (``_lean``: it is issue-bound; RMSNorm's is not, and keeps both). The FP8 transposed copy
written in the norm kernel goes by bands (``BAND > 0``): a program owns bands of ``BAND_ROWS``
rows, runs their rowwise tiles, then reads the band's FP8 bytes back (from L2) and stores them
turned (``_transpose_band``), so DRAM sees each byte written once.
Offsets are 64-bit. The launchers implement the op contract of ``engine.reference`` exactly.
"""

from __future__ import annotations

from typing import Optional

import torch
import triton
import triton.language as tl

from engine import backend
from engine.reference import check_out_t_modes, compute_scale
from engine.triton_kernels import norms_common as nc
from engine.triton_kernels.launch import Launcher
from engine.triton_kernels.utils import (
    _abs_max_all,
    _abs_max_part,
    _atomic_amax,
    _cast,
    _div_rn,
    _fp8_saturate_cast,
    _scale_from_amax,
    check_fp8_output,
    fp8_consts,
    is_fp8,
    lean_dram,
    margin_grid,
    persistent_grid,
    interpreter_rounding,
)

Tensor = torch.Tensor

# Forward passes. Delayed scaling and high-precision outputs take PASS_FULL. Current scaling takes
# PASS_AMAX (statistics + amax, no output) then PASS_APPLY (quantize with the stored statistics).
PASS_FULL, PASS_AMAX, PASS_APPLY = 0, 1, 2


@triton.jit
def _to_f32(v, BITS: tl.constexpr):
    """``v.to(float32)``, exact. BITS: bf16 as its bits shifted into the upper half of an fp32,
    which LLVM turns into one instruction per value (the high half of a pair: a mask), where
    PTX's ``cvt.f32.bf16`` becomes a byte permute and a shift (NOTES P27)."""
    if BITS and v.dtype == tl.bfloat16:
        return (v.to(tl.uint16, bitcast=True).to(tl.uint32) << 16).to(tl.float32, bitcast=True)
    return v.to(tl.float32)


@triton.jit
def _ld(ptr, mask, EVICT: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr):
    """fp32 load of a tile; lanes outside ``mask`` read 0. EVEN: no lane is outside, no mask (an
    unpredicated load: no zeroing of its registers first, no predicate per vector). BITS: see
    :func:`_to_f32`."""
    if EVEN:
        v = tl.load(ptr, eviction_policy=EVICT)
    else:
        v = tl.load(ptr, mask=mask, other=0.0, eviction_policy=EVICT)
    return _to_f32(v, BITS)


@triton.jit
def _st(ptr, v, mask, EVEN: tl.constexpr):
    """Store of a tile, masked unless EVEN."""
    if EVEN:
        tl.store(ptr, v)
    else:
        tl.store(ptr, v, mask=mask)


@triton.jit
def _load_z(X, RES, RES_OUT, rows64, cols, mask, stride_x, stride_res, stride_ro,
            HAS_RES: tl.constexpr, STORE_RES: tl.constexpr, INTERPRETER: tl.constexpr,
            EVICT: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr):
    """fp32 ``z = x (+ residual)`` of a tile; the sum is rounded to RES_OUT's dtype (and stored
    when STORE_RES) so that what is normalised equals what the backward will read back. EVICT: the
    loads' L2 eviction policy, given at every call ("": the default; the blocked path keeps pass
    1's lines for pass 2's re-read, or evicts them first where pass 2 reads residual_out instead:
    _reload_z). No default value: triton 3.6 does not wrap a constexpr
    parameter's default, and the string then fails to compile. EVEN: every lane of the tile is
    inside the tensor (launch_fwd: _even), so no access is masked; BITS: see _to_f32."""
    z = _ld(X + rows64[:, None] * stride_x + cols[None, :], mask, EVICT, EVEN, BITS)
    if HAS_RES:
        z += _ld(RES + rows64[:, None] * stride_res + cols[None, :], mask, EVICT, EVEN, BITS)
        zr = _cast(z, RES_OUT.dtype.element_ty, INTERPRETER)
        if STORE_RES:
            _st(RES_OUT + rows64[:, None] * stride_ro + cols[None, :], zr, mask, EVEN)
        z = _to_f32(zr, BITS)
    return z


@triton.jit
def _reload_z(X, RES, RES_OUT, rows64, cols, mask, stride_x, stride_res, stride_ro,
              HAS_RES: tl.constexpr, RELOAD_RES: tl.constexpr, INTERPRETER: tl.constexpr,
              EVICT: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr):
    """fp32 z of a tile that pass 1 of the blocked path has read. RELOAD_RES (a residual, rows of
    more than one chunk: launch_fwd's _reload_res): residual_out as pass 1 stored it (the rounded
    sum _load_z returned there, the same values), one array from L2 where x and the residual were
    two (NOTES P92); the caller puts a barrier between pass 1's stores and this read
    (tl.debug_barrier), so that a thread may read what another stored. Otherwise x (and the
    residual, added and rounded again, not stored)."""
    if RELOAD_RES:
        return _ld(RES_OUT + rows64[:, None] * stride_ro + cols[None, :], mask, EVICT, EVEN, BITS)
    return _load_z(X, RES, RES_OUT, rows64, cols, mask, stride_x, stride_res, stride_ro, HAS_RES,
                   False, INTERPRETER, EVICT, EVEN, BITS)


@triton.jit
def _add2(a0, a1, b0, b1):
    return a0 + b0, a1 + b1


@triton.jit
def _row_sums(a, b, IS_RMS_NORM: tl.constexpr, SEPARATE: tl.constexpr):
    """Row sums of two [BLOCK_M, BLOCK_N] tiles; ``b``'s only for LayerNorm (RMSNorm: zeros).
    LayerNorm's two sums go through one two-operand reduction: one exchange across the warps
    (shared memory and barrier) where two ``tl.sum`` took two (NOTES P32). SEPARATE: two
    ``tl.sum`` (the interpreter runs a reduction with a combine function element by element, 20x
    slower; tests/test_launch.py runs this path there on a small tile)."""
    if IS_RMS_NORM:
        return tl.sum(a, axis=1), tl.zeros([a.shape[0]], dtype=tl.float32)
    if SEPARATE:
        return tl.sum(a, axis=1), tl.sum(b, axis=1)
    return tl.reduce((a, b), 1, _add2)


@triton.jit
def _ln_one_pass(mean, e2):
    """LayerNorm's (var, ok) per row from mean = E[z] and e2 = E[z^2]: var = e2 - mean^2 is used
    only where ``ok`` (mean^2 <= 3/4 e2, i.e. mean^2 <= 3 var: var >= e2 / 4, so the subtraction
    costs at most 2 bits against the rounding of the sums); elsewhere (a large mean, NaN) the
    caller replaces it by the centred mean square. The CUDA kernels' ln_one_pass_var (NOTES P80)."""
    c = mean * mean
    return e2 - c, c <= 0.75 * e2


@triton.jit
def _centred_sq_sum(z, mean, mask, EVEN: tl.constexpr):
    """sum over a tile's columns of (z - mean)^2, 0 outside ``mask`` (no select when EVEN): the
    centred pass LayerNorm's statistics fall back to where _ln_one_pass says no."""
    zc = z - mean[:, None]
    if not EVEN:
        zc = tl.where(mask, zc, 0.0)
    return tl.sum(zc * zc, axis=1)


@triton.jit
def _xhat(z, mean, rstd, mask, EVEN: tl.constexpr):
    """(z - mean) * rstd of a backward tile, 0 outside ``mask`` (no select when EVEN)."""
    xhat = (z - mean[:, None]) * rstd[:, None]
    if not EVEN:
        xhat = tl.where(mask, xhat, 0.0)
    return xhat


@triton.jit
def _dz(dyg, xhat, rstd, c2, c1, IS_RMS_NORM: tl.constexpr):
    """rstd * (dyg - xhat * c2 - c1) of a tile as two multiply-adds per value,
    (dyg * rstd - c1 * rstd) + xhat * -(c2 * rstd), with the products of the row constants
    formed once per row: ``(dyg - xhat * c2 - c1) * rstd`` compiled to a subtraction and a
    negation more per value (NOTES P38). ``dyg * rstd + (xhat * a - c1 * rstd)`` spilled 4 bytes
    in LayerNorm's 2-row 8K tile, this order does not; both lost 1.5-2 points on that tile at 32
    warps, which now runs 16 (NOTES P39)."""
    a = -(c2 * rstd)
    if IS_RMS_NORM:
        return dyg * rstd[:, None] + xhat * a[:, None]
    return (dyg * rstd[:, None] - (c1 * rstd)[:, None]) + xhat * a[:, None]


@triton.jit
def _store_dx(dz, DRES_IN, DX, DRES, rows64, cols, mask, stride_dri, stride_dx, stride_dres,
              HAS_DRES_IN: tl.constexpr, HAS_DRES: tl.constexpr, INTERPRETER: tl.constexpr,
              EVEN: tl.constexpr):
    """The backward's output tile: dz plus the residual's gradient (HAS_DRES_IN), stored as dx
    and, in the residual's dtype, as dres (HAS_DRES); masked unless EVEN."""
    if HAS_DRES_IN:
        dz += _ld(DRES_IN + rows64[:, None] * stride_dri + cols[None, :], mask, "", EVEN, True)
    _st(DX + rows64[:, None] * stride_dx + cols[None, :], _cast(dz, DX.dtype.element_ty, INTERPRETER),
        mask, EVEN)
    if HAS_DRES:
        _st(DRES + rows64[:, None] * stride_dres + cols[None, :],
            _cast(dz, DRES.dtype.element_ty, INTERPRETER), mask, EVEN)


@triton.jit
def _bwd_load(DY, X, rows64, cols, mask, stride_dy, stride_x, mean, rstd, g, EVICT: tl.constexpr,
              EVEN: tl.constexpr):
    """A tile of the backward: ``(dy, xhat, dy * g)`` at ``cols`` of the row tile."""
    dy = _ld(DY + rows64[:, None] * stride_dy + cols[None, :], mask, EVICT, EVEN, True)
    z = _ld(X + rows64[:, None] * stride_x + cols[None, :], mask, EVICT, EVEN, True)
    return dy, _xhat(z, mean, rstd, mask, EVEN), dy * g[None, :]


@triton.jit
def _bwd_sums(DY, X, rows64, cols, mask, stride_dy, stride_x, mean, rstd, g, EVICT: tl.constexpr,
              EVEN: tl.constexpr, IS_RMS_NORM: tl.constexpr, INTERPRETER: tl.constexpr):
    """A tile's shares of the row constants, ``(sum dy*g*xhat, sum dy*g)`` per row (the blocked
    path's pass 1, which keeps no tile)."""
    dy, xhat, dyg = _bwd_load(DY, X, rows64, cols, mask, stride_dy, stride_x, mean, rstd, g, EVICT, EVEN)
    return _row_sums(dyg * xhat, dyg, IS_RMS_NORM, INTERPRETER)


@triton.jit
def _bwd_emit(dy, xhat, dyg, rstd, c2, c1, dw, db, DRES_IN, DX, DRES, rows64, cols, mask, stride_dri,
              stride_dx, stride_dres, IS_RMS_NORM: tl.constexpr, HAS_DRES_IN: tl.constexpr,
              HAS_DRES: tl.constexpr, HAS_DB: tl.constexpr, INTERPRETER: tl.constexpr, EVEN: tl.constexpr):
    """Store a register tile's dx (and dres) from the row constants; return ``(dw, db)`` with the
    tile's column sums added."""
    _store_dx(_dz(dyg, xhat, rstd, c2, c1, IS_RMS_NORM), DRES_IN, DX, DRES, rows64, cols, mask,
              stride_dri, stride_dx, stride_dres, HAS_DRES_IN, HAS_DRES, INTERPRETER, EVEN)
    dw += tl.sum(dy * xhat, axis=0)
    if HAS_DB:
        db += tl.sum(dy, axis=0)
    return dw, db


@triton.jit
def _load_stats(MU, RSTD, rows, rmask, IS_RMS_NORM: tl.constexpr):
    """Stored (mean, rstd) of a row tile; mean is 0 for RMSNorm."""
    rstd = tl.load(RSTD + rows, mask=rmask, other=0.0)
    mean = tl.zeros_like(rstd)
    if not IS_RMS_NORM:
        mean = tl.load(MU + rows, mask=rmask, other=0.0)
    return mean, rstd


@triton.jit
def _load_gamma(W, cols, N, ZERO_CENTERED: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr):
    """fp32 ``g`` (``1 + w`` when zero-centred) for columns ``cols`` (0 past N)."""
    g = _ld(W + cols, cols < N, "", EVEN, BITS)
    if ZERO_CENTERED:
        g += 1.0
    return g


@triton.jit
def _load_gamma_beta(W, B, cols, N, HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr,
                     EVEN: tl.constexpr, BITS: tl.constexpr):
    """fp32 ``g`` (:func:`_load_gamma`) and ``b`` (0 without bias) for columns ``cols``."""
    cmask = cols < N
    g = _load_gamma(W, cols, N, ZERO_CENTERED, EVEN, BITS)
    if HAS_BIAS:
        b = _ld(B + cols, cmask, "", EVEN, BITS)
    else:
        b = tl.zeros_like(g)
    return g, b


@triton.jit
def _emit(z, mean, rstd, g, b, Y, Y_T, rows, rows64, cols, mask, stride_y, M, N, scale, fp8_max,
          IS_RMS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, ZERO_CENTERED: tl.constexpr, IS_FP8: tl.constexpr,
          STORE_OUT: tl.constexpr, STORE_T: tl.constexpr, INTERPRETER: tl.constexpr,
          MANT: tl.constexpr, MIN_EXP: tl.constexpr, AMAX_V: tl.constexpr, EVEN: tl.constexpr):
    """Normalise a tile, write it (high precision or FP8, optionally transposed); return its max
    |y| per AMAX_V neighbouring columns (FP8 only; utils._abs_max_part). Lanes outside ``mask``
    hold y = 0 (z, g and b load as 0) except for LayerNorm with a zero-centred gamma (g = 1 there,
    y = -mean * rstd), which masks them."""
    if IS_RMS_NORM:
        xhat = z * rstd[:, None]
    else:
        # (z - mean) * rstd: the CUDA kernels' FMA form (ln_fma_row, NOTES P87) lost 4-23 points
        # here on the blocked tiles (the test per chunk of pass 2) and gained under 1 on the
        # register tiles
        xhat = (z - mean[:, None]) * rstd[:, None]
    y = xhat * g
    if HAS_BIAS:
        y += b
    amax = 0.0
    if IS_FP8:
        amax = _abs_max_part(y, mask, (not IS_RMS_NORM) and ZERO_CENTERED and not EVEN, INTERPRETER,
                             AMAX_V)
        if STORE_OUT:
            q = _fp8_saturate_cast(y * scale, fp8_max, Y.dtype.element_ty, INTERPRETER, MANT, MIN_EXP)
            _st(Y + rows64[:, None] * stride_y + cols[None, :], q, mask, EVEN)
            if STORE_T:
                # [BLOCK_N, BLOCK_M] tile of the [N, M] output: BLOCK_M contiguous bytes per column.
                # The mask is built, not transposed. This path runs only in _norm_fwd_kernel_t
                # (N not specialised; see there).
                mask_t = (cols[:, None] < N) & (rows[None, :] < M)
                tl.store(Y_T + tl.cast(cols, tl.int64)[:, None] * M + rows[None, :], tl.trans(q),
                         mask=mask_t)
    elif STORE_OUT:
        _st(Y + rows64[:, None] * stride_y + cols[None, :], _cast(y, Y.dtype.element_ty, INTERPRETER),
            mask, EVEN)
    return amax


@triton.jit
def _transpose_band(Y, Y_T, band, M, N, stride_y, BAND: tl.constexpr, TBN: tl.constexpr):
    """Write rows ``band * BAND ..`` of the FP8 output ``Y`` (just stored by this program, so read
    back from L2) transposed into ``Y_T`` ([N, M]), ``TBN`` columns at a time: BAND contiguous
    bytes per column, the tile turned by ``tl.trans`` through shared memory. The bytes move as
    uint8 (no conversion)."""
    rows = band * BAND + tl.arange(0, BAND)
    rmask = rows < M
    src = Y.to(tl.pointer_type(tl.uint8)) + tl.cast(rows, tl.int64)[:, None] * stride_y
    dst = Y_T.to(tl.pointer_type(tl.uint8)) + rows[None, :]
    for c0 in range(0, N, TBN):
        cols = c0 + tl.arange(0, TBN)
        t = tl.load(src + cols[None, :], mask=rmask[:, None] & (cols[None, :] < N), other=0,
                    eviction_policy="evict_first")
        tl.store(dst + tl.cast(cols, tl.int64)[:, None] * M, tl.trans(t),
                 mask=(cols[:, None] < N) & rmask[None, :])


@triton.jit
def _pass2_chunk(c0, X, RES, RES_OUT, W, B, Y, Y_T, stride_x, stride_res, stride_y, stride_ro, M, N,
                 scale, fp8_max, cols, amax, mean, rstd, rows, rows64, rmask,
                 IS_RMS_NORM: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr,
                 ZERO_CENTERED: tl.constexpr, IS_FP8: tl.constexpr, STORE_T: tl.constexpr,
                 STORE_OUT: tl.constexpr, INTERPRETER: tl.constexpr, MANT: tl.constexpr,
                 MIN_EXP: tl.constexpr, BLOCK_M: tl.constexpr, AMAX_V: tl.constexpr,
                 EVEN: tl.constexpr, BITS: tl.constexpr, RELOAD_RES: tl.constexpr):
    """One column chunk of the blocked forward's pass 2 (_fwd_tile): columns ``c0 + cols`` of the
    row tile re-read (x, or residual_out: _reload_z), normalised with the row statistics and
    written; returns ``amax`` max-updated with the chunk's partial (FP8)."""
    cc = c0 + cols
    mask = rmask[:, None] & (cc[None, :] < N)
    z = _reload_z(X, RES, RES_OUT, rows64, cc, mask, stride_x, stride_res, stride_ro,
                  HAS_RES, RELOAD_RES, INTERPRETER, "evict_first", EVEN, BITS)
    # gamma and beta as [BLOCK_M, BLOCK_N] tiles (each row of the tile the same
    # columns), so that they take the layout of x's tile: loaded as a 1-D chunk, they
    # got a layout of 16-byte vectors of their own dtype, while an FP8 output gives the
    # x tile 16 elements per thread (the store's 16-byte vectors), and every chunk went
    # through a layout conversion in shared memory (4 x STS/LDS and 8 barriers per
    # chunk at 16K; SASS of triton 3.6 for sm_90; NOTES P21). Triton broadcasts the
    # row index away (one load per column). Only for FP8 outputs: a 16-bit output
    # has no conversion to remove, and its 2-row tiles measured up to 4 points slower
    # this way (one run, kernel time: LayerNorm 16K 84.8 -> 80.4 %, RMSNorm 64K
    # 81.8 -> 77.7 %; h200_ab_s10_bf16_blocked.log). Nor with the in-kernel
    # transposed store: with gamma in x's layout, triton 3.6 compiled that store into
    # wrong bytes (the last rows of each tile; L1 on the H200, every shape), as it
    # did once for N specialised (_norm_fwd_kernel_t below).
    if STORE_T or not IS_FP8:
        gc, bc = _load_gamma_beta(W, B, cc, N, HAS_BIAS, ZERO_CENTERED, EVEN, BITS)
        gc = gc[None, :]
        bc = bc[None, :]
    else:
        cc2 = cc[None, :] + tl.zeros([BLOCK_M, 1], dtype=tl.int32)
        gc, bc = _load_gamma_beta(W, B, cc2, N, HAS_BIAS, ZERO_CENTERED, EVEN, BITS)
    a = _emit(z, mean, rstd, gc, bc, Y, Y_T, rows, rows64, cc, mask, stride_y, M, N, scale,
              fp8_max, IS_RMS_NORM, HAS_BIAS, ZERO_CENTERED, IS_FP8, STORE_OUT, STORE_T,
              INTERPRETER, MANT, MIN_EXP, AMAX_V, EVEN)
    if IS_FP8:
        amax = tl.maximum(amax, a, propagate_nan=tl.PropagateNan.ALL)
    return amax


@triton.jit
def _ld_tile(X, rb, M, N, cols, stride_x, BLOCK_M: tl.constexpr, EVEN: tl.constexpr):
    """x of row tile ``rb`` as stored (no conversion), 0 outside the tensor: the register path's
    prefetch (PREFETCH), which also reads the tile past the last (every lane masked: no traffic).
    With EVEN the columns need no mask, the rows do."""
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    ptrs = X + tl.cast(rows, tl.int64)[:, None] * stride_x + cols[None, :]
    if EVEN:
        mask = (rows < M)[:, None]
    else:
        mask = (rows < M)[:, None] & (cols[None, :] < N)
    return tl.load(ptrs, mask=mask, other=0.0)


@triton.jit
def _fwd_tile(rb, X, RES, RES_OUT, W, B, Y, Y_T, MU, RSTD, stride_x, stride_res, stride_y, stride_ro, M, N,
              eps, inv_n, scale, fp8_max, g, b, cols, amax, IS_RMS_NORM: tl.constexpr,
              HAS_BIAS: tl.constexpr, HAS_RES: tl.constexpr, ZERO_CENTERED: tl.constexpr,
              IS_FP8: tl.constexpr, STORE_T: tl.constexpr, STORE_OUT: tl.constexpr,
              LOAD_STATS: tl.constexpr, INTERPRETER: tl.constexpr, MANT: tl.constexpr,
              MIN_EXP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCKED: tl.constexpr, AMAX_V: tl.constexpr, EVEN: tl.constexpr, BITS: tl.constexpr,
              RELOAD_RES: tl.constexpr, X_EVICT: tl.constexpr, REV: tl.constexpr, x_pre,
              PREFETCH: tl.constexpr):
    """Row tile ``rb`` of _norm_fwd_kernel: its statistics, its output, and ``amax`` max-updated
    with the tile's partial (FP8). ``g`` / ``b``: the hoisted gamma / beta (register path), whose x
    loads take the eviction policy X_EVICT ("evict_first" under bands: the L2 is kept for them).
    PREFETCH (register path, no residual): ``x_pre`` is the tile's x as loaded (:func:`_ld_tile`),
    not read here."""
    rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
    rows64 = tl.cast(rows, tl.int64)
    rmask = rows < M
    if not BLOCKED:
        mask = rmask[:, None] & (cols[None, :] < N)
        if PREFETCH:
            z = _to_f32(x_pre, BITS)
        else:
            z = _load_z(X, RES, RES_OUT, rows64, cols, mask, stride_x, stride_res, stride_ro,
                        HAS_RES, True, INTERPRETER, X_EVICT, EVEN, BITS)
        if LOAD_STATS:
            mean, rstd = _load_stats(MU, RSTD, rows, rmask, IS_RMS_NORM)
        else:
            if IS_RMS_NORM:
                mean = tl.zeros([BLOCK_M], dtype=tl.float32)
                var = tl.sum(z * z, axis=1) * inv_n
            else:
                # The select keeps mean a rounded fp32 value: a bare product would be fused
                # into z - mean as an FMA, and y would then differ in the last bit from the
                # current-scaling apply pass, which reloads the stored mean.
                # One two-operand reduction of (z, z^2) (masked lanes hold 0); var = E[z^2] -
                # mean^2 where that loses at most 2 bits (_ln_one_pass), else, for a tile
                # with such a row, the centred sum over the registers (NOTES P83).
                s1, s2 = _row_sums(z, z * z, False, INTERPRETER)
                mean = tl.where(rmask, s1 * inv_n, 0.0)
                var, ok = _ln_one_pass(mean, s2 * inv_n)
                if tl.min(ok.to(tl.int32), axis=0) == 0:
                    var = tl.where(ok, var, _centred_sq_sum(z, mean, mask, EVEN) * inv_n)
                tl.store(MU + rows, mean, mask=rmask)
            rstd = tl.math.rsqrt(var + eps)
            tl.store(RSTD + rows, rstd, mask=rmask)
        a = _emit(z, mean, rstd, g, b, Y, Y_T, rows, rows64, cols, mask, stride_y, M, N, scale, fp8_max,
                  IS_RMS_NORM, HAS_BIAS, ZERO_CENTERED, IS_FP8, STORE_OUT, STORE_T, INTERPRETER, MANT,
                  MIN_EXP, AMAX_V, EVEN)
        if IS_FP8:
            amax = tl.maximum(amax, a, propagate_nan=tl.PropagateNan.ALL)
    else:
        if LOAD_STATS:
            mean, rstd = _load_stats(MU, RSTD, rows, rmask, IS_RMS_NORM)
        else:
            # Pass 1: statistics over column chunks. LayerNorm sums z and z^2 in one
            # two-operand reduction per chunk, adds the chunk's shares of E[z] and E[z^2], and
            # takes var = E[z^2] - mean^2 where that loses at most 2 bits (_ln_one_pass); a
            # tile with a row past that line (a large mean against the spread, or NaN) walks
            # the row again for the centred sum.
            mean = tl.zeros([BLOCK_M], dtype=tl.float32)
            acc = tl.zeros([BLOCK_M], dtype=tl.float32)  # sum z^2 (RMSNorm), E[z^2] (LayerNorm)
            for c0 in range(0, N, BLOCK_N):
                cc = c0 + cols
                mask = rmask[:, None] & (cc[None, :] < N)
                if RELOAD_RES:  # x and the residual are read once (pass 2: residual_out)
                    z = _load_z(X, RES, RES_OUT, rows64, cc, mask, stride_x, stride_res,
                                stride_ro, HAS_RES, True, INTERPRETER, "evict_first", EVEN, BITS)
                else:  # read again in pass 2: kept in L2
                    z = _load_z(X, RES, RES_OUT, rows64, cc, mask, stride_x, stride_res,
                                stride_ro, HAS_RES, True, INTERPRETER, "evict_last", EVEN, BITS)
                if IS_RMS_NORM:
                    acc += tl.sum(z * z, axis=1)
                else:
                    a1, a2 = _row_sums(z, z * z, False, INTERPRETER)
                    mean += a1 * inv_n
                    acc += a2 * inv_n
            if RELOAD_RES:  # residual_out stored by every thread before any reads it back
                tl.debug_barrier()
            if IS_RMS_NORM:
                var = acc * inv_n
            else:
                var, ok = _ln_one_pass(mean, acc)
                if tl.min(ok.to(tl.int32), axis=0) == 0:
                    m2c = tl.zeros([BLOCK_M], dtype=tl.float32)
                    for c0 in range(0, N, BLOCK_N):
                        cc = c0 + cols
                        mask = rmask[:, None] & (cc[None, :] < N)
                        z = _reload_z(X, RES, RES_OUT, rows64, cc, mask, stride_x, stride_res,
                                      stride_ro, HAS_RES, RELOAD_RES, INTERPRETER, "evict_last",
                                      EVEN, BITS)
                        m2c += _centred_sq_sum(z, mean, mask, EVEN)
                    var = tl.where(ok, var, m2c * inv_n)
            rstd = tl.math.rsqrt(var + eps)
            tl.store(RSTD + rows, rstd, mask=rmask)
            if not IS_RMS_NORM:
                tl.store(MU + rows, mean, mask=rmask)
        # Pass 2: normalise and write, chunk by chunk (x or residual_out re-read, from L2); with
        # REV from the last chunk to the first, so that the chunks pass 1 read last, the likeliest
        # to be still in L2 (and the last one in L1), are re-read first (_pass2_reverse: FP8
        # outputs on rows of more than two chunks). The column order keeps its loop as it was (the
        # induction variable is the column): a loop over a chunk index compiled up to 12 points
        # slower (NOTES P112).
        if REV:
            last = (tl.cdiv(N, BLOCK_N) - 1) * BLOCK_N
            for back in range(0, N, BLOCK_N):
                c0 = last - back
                amax = _pass2_chunk(c0, X, RES, RES_OUT, W, B, Y, Y_T, stride_x, stride_res, stride_y, stride_ro, M,
                                    N, scale, fp8_max, cols, amax, mean, rstd, rows, rows64, rmask,
                                    IS_RMS_NORM, HAS_BIAS, HAS_RES, ZERO_CENTERED, IS_FP8, STORE_T,
                                    STORE_OUT, INTERPRETER, MANT, MIN_EXP, BLOCK_M, AMAX_V, EVEN, BITS,
                                    RELOAD_RES)
        else:
            for c0 in range(0, N, BLOCK_N):
                amax = _pass2_chunk(c0, X, RES, RES_OUT, W, B, Y, Y_T, stride_x, stride_res, stride_y, stride_ro, M,
                                    N, scale, fp8_max, cols, amax, mean, rstd, rows, rows64, rmask,
                                    IS_RMS_NORM, HAS_BIAS, HAS_RES, ZERO_CENTERED, IS_FP8, STORE_T,
                                    STORE_OUT, INTERPRETER, MANT, MIN_EXP, BLOCK_M, AMAX_V, EVEN, BITS,
                                    RELOAD_RES)
    return amax


@triton.jit
def _norm_fwd_kernel(
    X,  # [M, N] input (PASS_APPLY: z, i.e. residual_out or x)
    RES,  # [M, N] residual or dummy
    W,  # [N] weight
    B,  # [N] bias or dummy
    Y,  # [M, N] output (high precision or FP8)
    RES_OUT,  # [M, N] x + residual, or dummy
    MU,  # [M] fp32 mean (LayerNorm) or dummy
    RSTD,  # [M] fp32 1/sigma
    SCALE,  # [1] fp32 FP8 scale (read; written by PASS_APPLY) or dummy
    AMAX,  # [1] fp32 amax, max-updated, or dummy
    SCALE_INV,  # [1] fp32 1/scale, written, or dummy
    Y_T,  # [N, M] transposed FP8 output or dummy
    stride_x, stride_res, stride_y, stride_ro,  # row strides in elements
    M, N,  # rows, columns
    eps,  # variance epsilon
    fp8_max,  # largest finite FP8 value
    amax_epsilon,  # current scaling: amax floor
    IS_RMS_NORM: tl.constexpr,
    HAS_BIAS: tl.constexpr,
    HAS_RES: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    IS_FP8: tl.constexpr,
    STORE_T: tl.constexpr,  # write Y_T inside this kernel
    PASS: tl.constexpr,  # PASS_FULL / PASS_AMAX / PASS_APPLY (see module)
    INTERPRETER: tl.constexpr,  # interpreter-only rounding workarounds (utils._cast)
    MANT: tl.constexpr,
    MIN_EXP: tl.constexpr,
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCKED: tl.constexpr,  # N > BLOCK_N: two passes over column chunks
    AMAX_V: tl.constexpr,  # FP8: columns per thread-local amax partial (launch_fwd: _amax_v)
    EVEN: tl.constexpr,  # one row per tile and N a multiple of BLOCK_N: no masked access (_even)
    BITS: tl.constexpr,  # bf16 -> fp32 by bit shifts (_to_f32); with EVEN, launch_fwd's _lean
    RELOAD_RES: tl.constexpr,  # BLOCKED: pass 2 reads residual_out (_reload_z; _reload_res)
    BAND: tl.constexpr,  # STORE_T by bands of BAND rows (_transpose_band); 0: from each tile (_emit)
    TBN: tl.constexpr,  # BAND: columns per transposed chunk
    REV: tl.constexpr,  # BLOCKED: pass 2 from the last chunk to the first (PASS2_REVERSE)
    PREFETCH: tl.constexpr,  # register path, no residual, no bands: the next tile's x loaded first
):
    tl.static_assert(not STORE_T or IS_FP8)
    tl.static_assert(not PREFETCH or (not BLOCKED and not HAS_RES and BAND == 0))
    tl.static_assert(BAND == 0 or (STORE_T and BAND % BLOCK_M == 0))
    tl.static_assert(PASS == 0 or IS_FP8)
    STORE_OUT: tl.constexpr = PASS != 1
    LOAD_STATS: tl.constexpr = PASS == 2
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    scale = 1.0
    if IS_FP8:
        if LOAD_STATS:
            scale = _scale_from_amax(tl.load(AMAX), fp8_max, amax_epsilon)
        else:
            scale = tl.load(SCALE)
    inv_n = 1.0 / N  # loop invariants: 1/N, the scale (above) and, when the row fits, gamma/beta
    g = inv_n  # placeholders on the blocked path, which loads gamma and beta per chunk
    b = inv_n
    if not BLOCKED:
        g, b = _load_gamma_beta(W, B, cols, N, HAS_BIAS, ZERO_CENTERED, EVEN, BITS)
        g = g[None, :]
        b = b[None, :]
    # Running max |y| per AMAX_V neighbouring columns of the tile (utils._abs_max_part:
    # NaN-propagating), reduced across the program once, after the row loop.
    amax = tl.zeros([BLOCK_M, BLOCK_N // AMAX_V], dtype=tl.float32)
    if BAND == 0:
        # PREFETCH: each iteration loads the next tile's x before this tile's reductions, so
        # that a program keeps two tiles' loads in flight (NOTES P175); the loop carries the raw
        # tile. Otherwise x_cur is a placeholder _fwd_tile does not read.
        x_next = g
        if PREFETCH:
            x_next = _ld_tile(X, pid, M, N, cols, stride_x, BLOCK_M, EVEN)
        for rb in tl.range(pid, tl.cdiv(M, BLOCK_M), nprog):
            x_cur = x_next
            if PREFETCH:
                x_next = _ld_tile(X, rb + nprog, M, N, cols, stride_x, BLOCK_M, EVEN)
            amax = _fwd_tile(
                rb, X, RES, RES_OUT, W, B, Y, Y_T, MU, RSTD, stride_x, stride_res, stride_y, stride_ro, M, N, eps, inv_n, scale, fp8_max, g, b, cols, amax,
                             IS_RMS_NORM, HAS_BIAS, HAS_RES, ZERO_CENTERED, IS_FP8, STORE_T, STORE_OUT, LOAD_STATS,
                             INTERPRETER, MANT, MIN_EXP, BLOCK_M, BLOCK_N, BLOCKED, AMAX_V, EVEN, BITS, RELOAD_RES,
                             "", REV, x_cur, PREFETCH)
    else:
        # The transposed copy by bands (_transpose_band): this program's BAND rows, written
        # rowwise, then read back from L2 and written transposed.
        tiles = tl.cdiv(M, BLOCK_M)
        for band in tl.range(pid, tl.cdiv(M, BAND), nprog):
            first = band * (BAND // BLOCK_M)
            for rb in range(first, tl.minimum(first + BAND // BLOCK_M, tiles)):
                amax = _fwd_tile(rb, X, RES, RES_OUT, W, B, Y, Y_T, MU, RSTD, stride_x, stride_res, stride_y, stride_ro, M, N, eps, inv_n, scale, fp8_max, g, b, cols, amax,
                             IS_RMS_NORM, HAS_BIAS, HAS_RES, ZERO_CENTERED, IS_FP8, False, STORE_OUT, LOAD_STATS,
                             INTERPRETER, MANT, MIN_EXP, BLOCK_M, BLOCK_N, BLOCKED, AMAX_V, EVEN, BITS, RELOAD_RES,
                             "evict_first", REV, g, False)
            tl.debug_barrier()  # every thread's rowwise stores of the band before any reads them
            _transpose_band(Y, Y_T, band, M, N, stride_y, BAND, TBN)
    if IS_FP8:
        if PASS != 2:
            _atomic_amax(AMAX, _abs_max_all(amax, INTERPRETER))
        if pid == 0:
            tl.store(SCALE_INV, _div_rn(1.0, scale))
            if LOAD_STATS:
                tl.store(SCALE, scale)


@triton.jit
def _norm_bwd_kernel(
    DY,  # [M, N] output gradient
    X,  # [M, N] normalised input z (residual_out when a residual was added)
    MU,  # [M] fp32 mean or dummy
    RSTD,  # [M] fp32 1/sigma
    W,  # [N] weight
    DRES_IN,  # [M, N] gradient of residual_out, or dummy
    DX,  # [M, N] input gradient
    DRES,  # [M, N] the same gradient in the residual's dtype, or dummy
    DW_PART,  # [P, N] fp32 per-program partial dW
    DB_PART,  # [P, N] fp32 per-program partial dB, or dummy
    stride_dy, stride_x, stride_dri, stride_dx, stride_dres,  # row strides in elements
    M, N,
    IS_RMS_NORM: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    HAS_DRES_IN: tl.constexpr,
    HAS_DRES: tl.constexpr,
    HAS_DB: tl.constexpr,
    INTERPRETER: tl.constexpr,  # interpreter-only rounding workarounds (utils._cast)
    BLOCK_M: tl.constexpr,
    BLOCK_N: tl.constexpr,
    BLOCKED: tl.constexpr,
    ONE_CHUNK: tl.constexpr,  # BLOCKED with N <= BLOCK_N (launch_bwd)
    EVEN: tl.constexpr,  # one row per tile and N a multiple of BLOCK_N: no masked access (_even)
    TAIL_N: tl.constexpr,  # columns BLOCK_N.. in a tile of TAIL_N beside the head (0: none; _tail_n)
    EVEN_T: tl.constexpr,  # the tail tile without masks (one row per tile, N = BLOCK_N + TAIL_N)
    ROW_PHASES: tl.constexpr,  # multi-row tiles: whole tiles unmasked, then the last (BWD_ROW_PHASES)
):
    """dz = rstd * (dy*g - c2*xhat - c1) with per-row constants c2 = mean(dy*g*xhat) and
    c1 = mean(dy*g) (LayerNorm only), computed once per row; dW/dB partials per program.

    The register tile (not BLOCKED) holds a row of up to BLOCK_N columns, the blocked path walks it
    in chunks of BLOCK_N; with TAIL_N either holds a head of BLOCK_N columns (the register tile, or
    the blocked path's one chunk) and a tail tile of TAIL_N (both powers of two): a width between
    the powers of two then fills its lanes (5120 = 4096 + 1024 where one 8192 tile left 3/8 of
    them masked)."""
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    part_row = tl.cast(pid, tl.int64) * N
    inv_n = 1.0 / N
    # ONE_CHUNK (blocked, N <= BLOCK_N): gamma and the dW/dB accumulators stay in registers
    # across the row tiles, as on the register path: no partial read-modify-write per row tile.
    # LayerNorm's dB accumulator takes the 16 registers that a hoisted fp32 gamma holds: over
    # 16-bit operands a one-row ONE_CHUNK tile re-reads gamma per pass (L1) instead, which the
    # 32-warp 16K tile needs to fit 64 registers (ptxas, bf16: 48 bytes of spill stores -> none;
    # +2.8 points fwd+bwd, NOTES P36). The 2-row 8K tile fits either way and lost 1 point to the
    # re-read; with an fp32 operand it spills either way, and the re-read spilled more.
    RELOAD_G: tl.constexpr = (ONE_CHUNK and HAS_DB and BLOCK_M == 1
                              and W.dtype.element_ty != tl.float32
                              and X.dtype.element_ty != tl.float32
                              and DY.dtype.element_ty != tl.float32)
    HOLD_G: tl.constexpr = ONE_CHUNK and not RELOAD_G  # the blocked passes use the hoisted g
    if not BLOCKED or ONE_CHUNK:
        cmask = cols < N
        g = _load_gamma(W, cols, N, ZERO_CENTERED, EVEN, True)
        dw = tl.zeros([BLOCK_N], dtype=tl.float32)
        db = tl.zeros([BLOCK_N], dtype=tl.float32)
    if TAIL_N > 0:
        tcols = BLOCK_N + tl.arange(0, TAIL_N)
        tmask = tcols < N
        if not RELOAD_G:
            g_t = _load_gamma(W, tcols, N, ZERO_CENTERED, EVEN_T, True)
        dw_t = tl.zeros([TAIL_N], dtype=tl.float32)
        db_t = tl.zeros([TAIL_N], dtype=tl.float32)
    # ROW_PHASES (tiles of several rows): the whole row tiles first, their rows unmasked, then the
    # last, part-empty tile on the program whose turn it is. With every tile masked by rows < M,
    # Triton proved the rows of a thread's pair alike only where it had specialised M as a multiple
    # of 16, and compiled one row predicate there and one per row elsewhere: RMSNorm's 2 x 8192
    # backward took 108.6 us at M = 8192 and 136.5 at M = 8191 (NOTES Q92b).
    SPLIT_ROWS: tl.constexpr = ROW_PHASES and BLOCK_M > 1
    n_tiles = tl.cdiv(M, BLOCK_M)
    n_full = M // BLOCK_M
    for phase in tl.static_range(2 if SPLIT_ROWS else 1):
        if SPLIT_ROWS and phase == 0:
            lo = pid
            hi = n_full
        elif SPLIT_ROWS:
            lo = tl.where(pid == n_full % nprog, n_full, n_tiles)
            hi = n_tiles
        else:
            lo = pid
            hi = n_tiles
        for rb in tl.range(lo, hi, nprog):
            rows = rb * BLOCK_M + tl.arange(0, BLOCK_M)
            rows64 = tl.cast(rows, tl.int64)
            if SPLIT_ROWS and phase == 0:
                rmask = tl.full([BLOCK_M], 1, tl.int1)
            else:
                rmask = rows < M
            mean, rstd = _load_stats(MU, RSTD, rows, rmask, IS_RMS_NORM)
            if not BLOCKED:
                mask = rmask[:, None] & cmask[None, :]
                dy, xhat, dyg = _bwd_load(DY, X, rows64, cols, mask, stride_dy, stride_x, mean, rstd, g, "", EVEN)
                s2, s1 = _row_sums(dyg * xhat, dyg, IS_RMS_NORM, INTERPRETER)
                if TAIL_N > 0:
                    mask_t = rmask[:, None] & tmask[None, :]
                    dy_t, xhat_t, dyg_t = _bwd_load(DY, X, rows64, tcols, mask_t, stride_dy, stride_x, mean,
                                                    rstd, g_t, "", EVEN_T)
                    t2, t1 = _row_sums(dyg_t * xhat_t, dyg_t, IS_RMS_NORM, INTERPRETER)
                    s2 += t2
                    s1 += t1
                c2 = s2 * inv_n
                c1 = s1 * inv_n
                dw, db = _bwd_emit(dy, xhat, dyg, rstd, c2, c1, dw, db, DRES_IN, DX, DRES, rows64, cols, mask,
                                   stride_dri, stride_dx, stride_dres, IS_RMS_NORM, HAS_DRES_IN, HAS_DRES,
                                   HAS_DB, INTERPRETER, EVEN)
                if TAIL_N > 0:
                    dw_t, db_t = _bwd_emit(dy_t, xhat_t, dyg_t, rstd, c2, c1, dw_t, db_t, DRES_IN, DX, DRES,
                                           rows64, tcols, mask_t, stride_dri, stride_dx, stride_dres,
                                           IS_RMS_NORM, HAS_DRES_IN, HAS_DRES, HAS_DB, INTERPRETER, EVEN_T)
            else:
                # Pass 1: the per-row constants over column chunks (with a tail: one chunk, then the
                # tail tile).
                head_end = N
                if TAIL_N > 0:
                    head_end = BLOCK_N
                    mask_t = rmask[:, None] & tmask[None, :]
                s2 = tl.zeros([BLOCK_M], dtype=tl.float32)
                s1 = tl.zeros([BLOCK_M], dtype=tl.float32)
                for c0 in range(0, head_end, BLOCK_N):
                    cc = c0 + cols
                    mask = rmask[:, None] & (cc[None, :] < N)
                    # evict_last: keep the lines in L2 for pass 2's re-read (evict_first there).
                    gc = g if HOLD_G else _load_gamma(W, cc, N, ZERO_CENTERED, EVEN, True)
                    t2, t1 = _bwd_sums(DY, X, rows64, cc, mask, stride_dy, stride_x, mean, rstd, gc,
                                       "evict_last", EVEN, IS_RMS_NORM, INTERPRETER)
                    s2 += t2
                    if not IS_RMS_NORM:
                        s1 += t1
                if TAIL_N > 0:
                    gt = g_t if HOLD_G else _load_gamma(W, tcols, N, ZERO_CENTERED, EVEN_T, True)
                    t2, t1 = _bwd_sums(DY, X, rows64, tcols, mask_t, stride_dy, stride_x, mean, rstd, gt,
                                       "evict_last", EVEN_T, IS_RMS_NORM, INTERPRETER)
                    s2 += t2
                    if not IS_RMS_NORM:
                        s1 += t1
                c2 = s2 * inv_n
                c1 = s1 * inv_n
                # Pass 2: dz per chunk; this program's partials accumulate in its own row of DW_PART
                # (the first row tile of the program writes, later ones add).
                not_first = tl.full([BLOCK_N], rb, tl.int32) != pid
                for c0 in range(0, head_end, BLOCK_N):
                    cc = c0 + cols
                    ccm = cc < N
                    mask = rmask[:, None] & ccm[None, :]
                    gc = g if HOLD_G else _load_gamma(W, cc, N, ZERO_CENTERED, EVEN, True)
                    dy, xhat, dyg = _bwd_load(DY, X, rows64, cc, mask, stride_dy, stride_x, mean, rstd, gc,
                                              "evict_first", EVEN)
                    if ONE_CHUNK:
                        dw, db = _bwd_emit(dy, xhat, dyg, rstd, c2, c1, dw, db, DRES_IN, DX, DRES, rows64, cc, mask,
                                           stride_dri, stride_dx, stride_dres, IS_RMS_NORM, HAS_DRES_IN, HAS_DRES,
                                           HAS_DB, INTERPRETER, EVEN)
                    else:
                        _store_dx(_dz(dyg, xhat, rstd, c2, c1, IS_RMS_NORM), DRES_IN, DX, DRES, rows64, cc, mask,
                                  stride_dri, stride_dx, stride_dres, HAS_DRES_IN, HAS_DRES, INTERPRETER, EVEN)
                        pw = tl.load(DW_PART + part_row + cc, mask=ccm & not_first, other=0.0)
                        tl.store(DW_PART + part_row + cc, pw + tl.sum(dy * xhat, axis=0), mask=ccm)
                        if HAS_DB:
                            pb = tl.load(DB_PART + part_row + cc, mask=ccm & not_first, other=0.0)
                            tl.store(DB_PART + part_row + cc, pb + tl.sum(dy, axis=0), mask=ccm)
                if TAIL_N > 0:
                    gt = g_t if HOLD_G else _load_gamma(W, tcols, N, ZERO_CENTERED, EVEN_T, True)
                    dy_t, xhat_t, dyg_t = _bwd_load(DY, X, rows64, tcols, mask_t, stride_dy, stride_x, mean, rstd,
                                                    gt, "evict_first", EVEN_T)
                    dw_t, db_t = _bwd_emit(dy_t, xhat_t, dyg_t, rstd, c2, c1, dw_t, db_t, DRES_IN, DX, DRES, rows64, tcols,
                                           mask_t, stride_dri, stride_dx, stride_dres, IS_RMS_NORM, HAS_DRES_IN,
                                           HAS_DRES, HAS_DB, INTERPRETER, EVEN_T)
                if not ONE_CHUNK:
                    # Each element of the partial row is read back by the thread that wrote it (same
                    # layout), but make the ordering explicit before the next row tile reads it.
                    tl.debug_barrier()
    if not BLOCKED or ONE_CHUNK:
        _st(DW_PART + part_row + cols, dw, cmask, EVEN)
        if HAS_DB:
            _st(DB_PART + part_row + cols, db, cmask, EVEN)
    if TAIL_N > 0:
        _st(DW_PART + part_row + tcols, dw_t, tmask, EVEN_T)
        if HAS_DB:
            _st(DB_PART + part_row + tcols, db_t, tmask, EVEN_T)



@triton.jit
def _xchg_word(v):
    """An exchange word of the split backward: fp32 ``v``'s bits in the low half, 1 ("written")
    in the high half. One 64-bit store is single-copy atomic, so a reader that sees the flag sees
    the value with it: no fence, no counter, no second round trip (NCCL's LL protocol)."""
    return (v.to(tl.int32, bitcast=True).to(tl.int64) & 0xFFFFFFFF) | (1 << 32)


@triton.jit
def _split_phase_a(dy_raw, z_raw, mean, rstd, row64, valid, XCHG, cols, cmask, g, gi, G: tl.constexpr,
                   IS_RMS_NORM: tl.constexpr, INTERPRETER: tl.constexpr, EVEN: tl.constexpr):
    """Phase A of one row of the split backward: the partial sums of this program's slice (dy
    and z loaded in their own dtypes, [1, SLICE]), written as exchange words (_xchg_word) unless
    the row is past the group's last (``valid`` false: a pipeline fill / drain step)."""
    dy = _to_f32(dy_raw, True)
    xhat = _xhat(_to_f32(z_raw, True), mean, rstd, cmask[None, :], EVEN)
    dyg = dy * g[None, :]
    s2, s1 = _row_sums(dyg * xhat, dyg, IS_RMS_NORM, INTERPRETER)
    K: tl.constexpr = 1 if IS_RMS_NORM else 2
    base = XCHG + row64 * (K * G) + gi
    tl.store(base, _xchg_word(s2), mask=valid)
    if not IS_RMS_NORM:
        tl.store(base + G, _xchg_word(s1), mask=valid)


@triton.jit
def _split_phase_b(dy_raw, z_raw, mean, rstd, row64, valid, g, dw, db, XCHG, DRES_IN, DX, DRES, cols,
                   cmask, inv_n, stride_dri, stride_dx, stride_dres, G: tl.constexpr, KG_P2: tl.constexpr,
                   IS_RMS_NORM: tl.constexpr, HAS_DRES_IN: tl.constexpr, HAS_DRES: tl.constexpr,
                   HAS_DB: tl.constexpr, INTERPRETER: tl.constexpr, EVEN: tl.constexpr):
    """Phase B of one row of the split backward (nothing where ``valid`` is false): wait for the
    row's G (RMSNorm) or 2G (LayerNorm: c2's, then c1's) exchange words, add the partial sums in
    slot order (the same tree in every program of the group: the same bits), then dx of this
    program's slice (xhat recomputed from the loaded z: fewer registers held across the
    pipeline than the fp32 tiles) and its dW / dB accumulation."""
    K: tl.constexpr = 1 if IS_RMS_NORM else 2
    slot = tl.arange(0, KG_P2)
    smask = (slot < K * G)[None, :] & valid[:, None]
    wptr = XCHG + row64[:, None] * (K * G) + slot[None, :]
    # slots past K * G and rows past the last read as written zeros
    w = tl.load(wptr, mask=smask, other=1 << 32, volatile=True)
    while tl.sum(((w >> 32) == 0).to(tl.int32)) > 0:  # a program of the group has not written
        w = tl.load(wptr, mask=smask, other=1 << 32, volatile=True)
    part = (w & 0xFFFFFFFF).to(tl.int32).to(tl.float32, bitcast=True)
    if IS_RMS_NORM:
        c2 = tl.sum(part, axis=1) * inv_n
        c1 = c2
    else:
        first = (slot < G)[None, :]
        c2 = tl.sum(tl.where(first, part, 0.0), axis=1) * inv_n
        c1 = tl.sum(tl.where(first, 0.0, part), axis=1) * inv_n
    mask = cmask[None, :] & valid[:, None]
    dy = _to_f32(dy_raw, True)
    xhat = _xhat(_to_f32(z_raw, True), mean, rstd, cmask[None, :], EVEN)
    dz = _dz(dy * g[None, :], xhat, rstd, c2, c1, IS_RMS_NORM)
    _store_dx(dz, DRES_IN, DX, DRES, row64, cols, mask, stride_dri, stride_dx, stride_dres,
              HAS_DRES_IN, HAS_DRES, INTERPRETER, False)
    dw += tl.sum(dy * xhat, axis=0)
    if HAS_DB:
        db += tl.sum(dy, axis=0)
    return dw, db


@triton.jit
def _split_gamma(g_held, W, cols, N, HOLD_G: tl.constexpr, ZERO_CENTERED: tl.constexpr, EVEN: tl.constexpr):
    """The split backward's gamma slice for one phase: the held one, or loaded again (from L1, the
    same slice every row), so that it is not live across the whole loop."""
    if HOLD_G:
        return g_held
    return _load_gamma(W, cols, N, ZERO_CENTERED, EVEN, True)


@triton.jit
def _split_load(DY, X, MU, RSTD, row, M, cols, cmask, stride_dy, stride_x, IS_RMS_NORM: tl.constexpr):
    """Row ``row``'s slice of dy and z in their own dtypes (predicated off past M), its stored
    statistics, its 64-bit index and whether it exists ([1] tensors)."""
    row64 = tl.cast(row + tl.arange(0, 1), tl.int64)
    valid = row64 < M
    mask = cmask[None, :] & valid[:, None]
    dy = tl.load(DY + row64[:, None] * stride_dy + cols[None, :], mask=mask, other=0.0,
                 eviction_policy="evict_first")
    z = tl.load(X + row64[:, None] * stride_x + cols[None, :], mask=mask, other=0.0,
                eviction_policy="evict_first")
    mean, rstd = _load_stats(MU, RSTD, row64, valid, IS_RMS_NORM)
    return dy, z, mean, rstd, row64, valid


@triton.jit
def _norm_bwd_split_kernel(
    DY,  # [M, N] output gradient
    X,  # [M, N] normalised input z
    MU,  # [M] fp32 mean or dummy
    RSTD,  # [M] fp32 1/sigma
    W,  # [N] weight
    DRES_IN,  # [M, N] gradient of residual_out, or dummy
    DX,  # [M, N] input gradient
    DRES,  # [M, N] the same gradient in the residual's dtype, or dummy
    DW_PART,  # [R, N] fp32 partial dW per row group
    DB_PART,  # [R, N] fp32 partial dB per row group, or dummy
    XCHG,  # [M, K * G] int64 exchange words, zeroed before the launch
    stride_dy, stride_x, stride_dri, stride_dx, stride_dres,  # row strides in elements
    M, N,
    IS_RMS_NORM: tl.constexpr,
    ZERO_CENTERED: tl.constexpr,
    HAS_DRES_IN: tl.constexpr,
    HAS_DRES: tl.constexpr,
    HAS_DB: tl.constexpr,
    INTERPRETER: tl.constexpr,
    G: tl.constexpr,  # programs per row (column slices)
    KG_P2: tl.constexpr,  # next power of two of the exchange words per row (G, LayerNorm 2G)
    SLICE: tl.constexpr,  # columns per program (G * SLICE >= N)
    LAG: tl.constexpr,  # rows between a row's phase A and its phase B: 1 or 2 (SPLIT_LAG)
    HOLD_G: tl.constexpr,  # gamma held in registers (else loaded per phase: SPLIT_HOLD_G)
    EVEN: tl.constexpr,  # N == G * SLICE: no column mask
):
    """The backward of wide rows with each row split over G programs (a row group), each owning
    a column slice of SLICE columns for all of the group's rows: its gamma and its dW / dB
    accumulators stay in registers for the whole kernel (the blocked kernel read-modify-writes a
    per-program partial row of N floats per row tile, through DRAM from 32K: NOTES Q3, P66). A
    row's constants c2 / c1 are sums over the whole row: each program writes its slice's partial
    sums as one 64-bit exchange word per sum (_xchg_word) and reads the group's words back
    (_split_phase_b). Iteration i (rows past the group's last are predicated off):

        LAG 1:  loads of row i;  phase B of row i-1 (its wait overlaps the loads);  phase A of row i
        LAG 2:  loads of row i;  phase A of row i-1;  phase B of row i-2

    At LAG 1 a program has one row slice in flight, issued at the top of an iteration and
    consumed at its end behind the previous row's wait; at LAG 2 the slice loaded in iteration i
    is consumed in iteration i + 1 (NOTES P72). The two rows before the pipeline fills start as
    row M (past the last: nothing happens), loaded separately: the same value as both initial
    rows compiled (triton 3.6) into a kernel that wrote no dx (NOTES P71).

    The program of slice ``gi`` of group ``grp`` is ``grp * G + gi``; group grp owns rows grp,
    grp + R, ... (R = programs / G <= M). The G programs of a group wait for one another, so they
    must be resident at once: launch_bwd launches at most one program per SM (which always fits)
    and never more programs than SMs. The interpreter runs programs one after another: G = 1
    there (launch_bwd)."""
    pid = tl.program_id(0)
    R = tl.num_programs(0) // G
    grp = pid // G
    gi = pid % G
    cols = gi * SLICE + tl.arange(0, SLICE)
    cmask = cols < N
    inv_n = 1.0 / N
    g_held = cmask  # a placeholder when gamma is loaded per phase (_split_gamma)
    if HOLD_G:
        g_held = _load_gamma(W, cols, N, ZERO_CENTERED, EVEN, True)
    dw = tl.zeros([SLICE], dtype=tl.float32)
    db = tl.zeros([SLICE], dtype=tl.float32)
    count = tl.cdiv(M - grp, R)
    # the row of phase B (b) and, at LAG 2, of phase A (a): row M (past the last, nothing to do)
    # before the pipeline fills
    dy_b, z_b, mean_b, rstd_b, row_b, valid_b = _split_load(DY, X, MU, RSTD, M, M, cols, cmask, stride_dy,
                                                            stride_x, IS_RMS_NORM)
    dy_a, z_a, mean_a, rstd_a, row_a, valid_a = _split_load(DY, X, MU, RSTD, M, M, cols, cmask, stride_dy,
                                                            stride_x, IS_RMS_NORM)
    for i in range(0, count + LAG):
        dy_n, z_n, mean_n, rstd_n, row_n, valid_n = _split_load(DY, X, MU, RSTD, grp + i * R, M, cols,
                                                                cmask, stride_dy, stride_x, IS_RMS_NORM)
        if LAG == 1:
            dw, db = _split_phase_b(dy_b, z_b, mean_b, rstd_b, row_b, valid_b,
                                    _split_gamma(g_held, W, cols, N, HOLD_G, ZERO_CENTERED, EVEN), dw, db, XCHG,
                                    DRES_IN, DX, DRES, cols, cmask, inv_n, stride_dri, stride_dx, stride_dres, G,
                                    KG_P2, IS_RMS_NORM, HAS_DRES_IN, HAS_DRES, HAS_DB, INTERPRETER, EVEN)
            _split_phase_a(dy_n, z_n, mean_n, rstd_n, row_n, valid_n, XCHG, cols, cmask,
                           _split_gamma(g_held, W, cols, N, HOLD_G, ZERO_CENTERED, EVEN), gi, G,
                           IS_RMS_NORM, INTERPRETER, EVEN)
            dy_b, z_b, mean_b, rstd_b, row_b, valid_b = dy_n, z_n, mean_n, rstd_n, row_n, valid_n
        else:
            _split_phase_a(dy_a, z_a, mean_a, rstd_a, row_a, valid_a, XCHG, cols, cmask,
                           _split_gamma(g_held, W, cols, N, HOLD_G, ZERO_CENTERED, EVEN), gi, G,
                           IS_RMS_NORM, INTERPRETER, EVEN)
            dw, db = _split_phase_b(dy_b, z_b, mean_b, rstd_b, row_b, valid_b,
                                    _split_gamma(g_held, W, cols, N, HOLD_G, ZERO_CENTERED, EVEN), dw, db, XCHG,
                                    DRES_IN, DX,
                                    DRES, cols, cmask, inv_n, stride_dri, stride_dx, stride_dres, G, KG_P2,
                                    IS_RMS_NORM, HAS_DRES_IN, HAS_DRES, HAS_DB, INTERPRETER, EVEN)
            dy_b, z_b, mean_b, rstd_b, row_b, valid_b = dy_a, z_a, mean_a, rstd_a, row_a, valid_a
            dy_a, z_a, mean_a, rstd_a, row_a, valid_a = dy_n, z_n, mean_n, rstd_n, row_n, valid_n
    prow = tl.cast(grp, tl.int64) * N
    _st(DW_PART + prow + cols, dw, cmask, EVEN)
    if HAS_DB:
        _st(DB_PART + prow + cols, db, cmask, EVEN)


# The forward compiled with N not specialised, for the in-kernel transposed FP8 store (STORE_T).
# With N specialised as a multiple of 16 (Triton does that for every such N), triton 3.6 compiled
# that store into wrong bytes for every N % 16 == 0, in this kernel only; bounding the store by an
# unspecialised copy of N did not help, compiling the kernel without N's specialisation did
# (ci/diag_transpose.py, benchmarks/results/h200_diag_transpose.log). The price is unvectorised
# masked loads on this path, which is not the default (ENGINE_NORM_EXTERNAL_TRANSPOSE=1).
_norm_fwd_kernel_t = triton.jit(_norm_fwd_kernel.fn, do_not_specialize=["N"])

#: Rows per band of the in-kernel transposed FP8 output (_transpose_band): 32 one-byte rows make
#: whole 32-byte sectors of every column's run in the [N, M] copy. 0: the tile's own transposed
#: stores (_emit, _norm_fwd_kernel_t), the path before bands. Scripts that change it empty
#: FWD_PLANS (engine.backend.reset_for_tests).
BAND_ROWS = 32
#: Columns per chunk of a band's transposition (a [BAND_ROWS, BAND_COLS] byte tile). Measured on
#: an H100 (NOTES P106, kernel time, % of copy, RMSNorm e4m3 + T 1K / 2K / 4K / 8K, two runs):
#: 128 columns 76.6 / 71.8 / 64.5 / 48.1, 256 76.2 / 73.8 / 68.3 / 57.8, 512 65 / 63.5 / 71.5 / 64,
#: 1024 81.5 / 79.8 / 73.8 / 67.4.
BAND_COLS = 1024

#: Whether the register forward (tiles of whole rows, no residual, no bands) loads the next
#: tile's x before this tile's reductions (_prefetch; NOTES P175): None, where the config says so
#: (NormConfig.prefetch: norms_common's _FWD_PREFETCH_OVERRIDES); True / False for every config
#: (experiments). Scripts that change it empty FWD_PLANS.
FWD_PREFETCH = None

#: Whether the blocked forward's pass 2 may walk the column chunks from the last to the first
#: (REV: _pass2_reverse says where), re-reading first what pass 1 read last. Scripts that change
#: it empty FWD_PLANS.
PASS2_REVERSE = True


def _pass2_reverse(cfg: nc.NormConfig, n: int, fp8: bool) -> bool:
    """Whether the blocked forward's pass 2 runs from the last chunk to the first (REV): for an FP8
    output on rows of more than two chunks (PASS2_REVERSE on). Measured on an H100 (NOTES P112,
    kernel time, % of copy, two alternations, column order -> reverse): e4m3 128K (four chunks
    of 32K) RMSNorm 70.0-70.5 -> 73.4-74.1, LayerNorm 66.3-66.8 -> 69.2; but the 16-bit outputs
    lost there (RMSNorm fwd 128K 78.5-79.0 -> 72.8, LayerNorm 80.0 -> 74.5-74.8, the residual
    forms 1.5-2.5), and rows of two chunks did not gain (64K: e4m3 within 0.5, bf16 -1 to -4)."""
    return bool(PASS2_REVERSE) and fp8 and cfg.blocked and n > 2 * cfg.block_n

#: The widest rows whose FP8 transposed copy the norm kernel writes (by bands) when
#: ENGINE_NORM_EXTERNAL_TRANSPOSE is unset (engine._norm_ops.external_transpose); with
#: ``out_t_auto`` only in the measured form, delayed scaling without a residual (band_by_default).
#: NOTES P106 (kernel time, % of copy, e4m3 + T, bands against the tiled transpose after the
#: norm): H100 RMSNorm 1K / 2K / 4K 81.5 / 79.8 / 73.8 against 73.2 / 72.4 / 70.2, 8K 67.4 against
#: 72.3; H200 1K / 2K 67.9 / 66.0-66.5 against 69.0 / 66.6-66.8, 4K 59.2 against 69.4-69.8. So
#: each card its own (NOTES P109): up to 4K on a lean card (utils.lean_dram: the H100, +3.6 at 4K),
#: up to 2K (BAND_MAX_N_WIDE) on the others (+8 on the H100 at 2K, -1 on the H200; 4K -10 there).
#: LayerNorm lost at every width on both (H100 57-68 against 70-73).
IN_KERNEL_TRANSPOSE_MAX_N = {"rmsnorm": 4096, "layernorm": 0}
#: The widest rows of bands by default on a card that is not lean (the H200).
BAND_MAX_N_WIDE = 2048
#: With ENGINE_NORM_EXTERNAL_TRANSPOSE unset, copies of at most this many rows (and
#: engine._norm_ops.SMALL_COPY_VALUES) come from the tiled transpose after the norm, not the
#: bands: up to 8192 rows, where the CUDA backend stops at 4096, because the bands still lose at
#: 8192 x 1024 (13.3-13.6 against 11.6 us on the H100, 12.3 against 11.2 on the H200) and win
#: from 16384 rows (benchmarks/NOTES.md Q34).
SMALL_COPY_ROWS = 8192


def narrow_copy(m: int) -> bool:
    """Whether the transposed copy of ``m`` rows has runs aligned to 2, 4 or 8 bytes only (M even,
    M % 16 != 0): the norm kernel's bands would store them byte by byte, the tiled transpose stores
    them in the runs' width (its T_ALIGN), so such a copy always comes from the tiled transpose
    after the norm (NOTES P134 / P135 / P137)."""
    return m % 16 != 0 and m % 2 == 0


def band_by_default(n: int, is_rms_norm: bool, has_residual: bool, current_scaling: bool,
                    device: torch.device) -> bool:
    """With ``out_t_auto``, whether the transposed copy comes from the norm kernel's bands (else
    the tiled transpose after the norm): rows up to IN_KERNEL_TRANSPOSE_MAX_N (on a card that is
    not lean, :func:`~engine.triton_kernels.utils.lean_dram`, up to BAND_MAX_N_WIDE) in the form
    measured (delayed scaling, no residual). :func:`norm_fwd` takes the tiled transpose before
    asking this wherever :func:`narrow_copy` holds."""
    widest = IN_KERNEL_TRANSPOSE_MAX_N["rmsnorm" if is_rms_norm else "layernorm"]
    if not lean_dram(device):
        widest = min(widest, BAND_MAX_N_WIDE)
    return bool(BAND_ROWS) and n <= widest and not has_residual and not current_scaling

#: Launch paths of the kernels (engine.triton_kernels.launch); scripts may swap in variants.
_FWD = Launcher(_norm_fwd_kernel)
_FWD_T = Launcher(_norm_fwd_kernel_t)
_BWD = Launcher(_norm_bwd_kernel)
_BWD_SPLIT = Launcher(_norm_bwd_split_kernel)


def _amax_v(cfg: nc.NormConfig, store_t: bool) -> int:
    """Columns per thread-local amax partial of the FP8 forward: the contiguous values a thread
    holds when Triton lays the tile out for the FP8 store's 16-byte vectors (16), fewer where the
    tile has fewer values per thread. A wrong guess costs shuffles, never a wrong amax. With the
    in-kernel transposed store, the whole row (one partial per row: the tile's max reduced
    across warps per tile, as before NOTES P22; see the gamma load in _norm_fwd_kernel)."""
    if store_t:
        return cfg.block_n
    per_thread = cfg.block_m * cfg.block_n // (32 * cfg.num_warps)
    return max(1, min(16, per_thread, cfg.block_n))


def _even(cfg: nc.NormConfig, n: int, store_t: bool) -> bool:
    """Every tile lies inside the tensor: one row per tile (the row loop never passes M) and N a
    multiple of the column tile, so the forward and the backward run without masks (power-of-two
    widths on the one-row configs). Not with the in-kernel transposed store, whose kernel is
    compiled with N unspecialised (_norm_fwd_kernel_t)."""
    return cfg.block_m == 1 and n % cfg.block_n == 0 and not store_t


def _reload_res(cfg: nc.NormConfig, n: int, has_res: bool) -> bool:
    """Whether the blocked forward's pass 2 reads residual_out (RELOAD_RES) rather than x and the
    residual again: with a residual, on rows of more than one chunk. Measured on the H200 (NOTES
    P92, kernel time, % of copy, x + r re-read -> residual_out): Triton + residual RMSNorm 64K /
    128K 69.5 / 69.4 -> 86.6 / 82.5, LayerNorm 16K-128K 83.2 / 79.8 / 69.9 / 69.0 -> 86.1 / 85.5 /
    83.6 / 83.8 (the prediction's reason, not measured with ncu: x, the residual and residual_out
    in the L2 at once push pass 2's re-read past it); LayerNorm 8K, one chunk, 88.8 -> 87.1, and
    with the re-read kept for one-chunk rows 89.2 -> 88.7 (within the spread of its alternations,
    88.4-89.7)."""
    return has_res and cfg.blocked and n > cfg.block_n


def _prefetch(cfg: nc.NormConfig, has_res: bool, band: int) -> bool:
    """Whether the register forward loads the next tile's x before this tile's reductions
    (PREFETCH): where the config says so (``NormConfig.prefetch``; FWD_PREFETCH True / False
    overrides it for every config), on tiles of whole rows (not blocked), without a residual or
    bands."""
    want = cfg.prefetch if FWD_PREFETCH is None else FWD_PREFETCH
    return bool(want) and not cfg.blocked and not has_res and not band


def _lean(is_rms_norm: bool, residual: bool) -> bool:
    """The forward's unmasked tiles (_even) and bf16 bit-shift conversions (_to_f32), for the
    LayerNorm forward without a residual only. They cut the instructions per value by 22 % (SASS,
    LayerNorm e4m3 16K), and the LayerNorm forward is issue-bound (ncu: 24 per value, issue slots
    69-77 % busy): e4m3 4K / 16K / 32K-128K +7 / +10 / +4 to +5 points (1K and 8K within 1), bf16
    8K-32K +1 to +3 (kernel time, H200, NOTES P27). RMSNorm's forward is latency-bound: with
    fewer registers ptxas issued pass 2's loads in two batches and it lost up to 18 points (e4m3
    32K), as did the residual forms (up to 11)."""
    return not is_rms_norm and not residual


def _fwd_plan(n, x_dtype, out_dtype, has_bias, has_res, store_t, current_scaling, device, sm_margin,
              is_rms_norm, zero_centered_gamma, config):
    """What a forward launch needs beyond the tensors and the row count: ``(config, programs cap,
    constexprs per pass, fp8, fp8_max, tile_t, band)``; one pass, or two for FP8 current scaling
    (PASS_AMAX with the residual, then PASS_APPLY on its output). ``tile_t``: the transposed copy
    from each tile's own stores (``_norm_fwd_kernel_t``); ``band``: rows per band of the copy by
    bands (0: none). The launcher is not part of it (scripts swap ``_FWD`` / ``_FWD_T``)."""
    fp8 = is_fp8(out_dtype)
    if fp8:
        check_fp8_output(out_dtype, device)
    fp8_max, mant, min_exp = fp8_consts(out_dtype)
    # the band path runs the rowwise FP8 tiles (BAND_ROWS = 0: the tile's own transposed stores,
    # the transposed config); a band is at least one tile (both powers of two: a whole number)
    if config is None and store_t and BAND_ROWS and not has_res:
        config = nc.band_fwd_config(n, x_dtype, is_rms_norm)
    cfg = config or nc.fwd_config(n, x_dtype, store_t and not BAND_ROWS, fp8, is_rms_norm, has_res,
                                  lean_dram(device))
    if cfg.tail or (not cfg.blocked and n > cfg.block_n):
        raise ValueError(f"norm forward config {cfg}: a register tile of {cfg.block_n} columns "
                         f"cannot hold rows of {n} (blocked=True walks them in chunks; tail is "
                         f"the backward's)")
    band = max(BAND_ROWS, cfg.block_m) if store_t and BAND_ROWS else 0
    tile_t = store_t and not band  # _emit's transposed stores (_norm_fwd_kernel_t)
    lean = _lean(is_rms_norm, has_res)

    def constexprs(pass_, res):
        band_ = band if pass_ != PASS_AMAX else 0
        return _FWD.constexprs(
            IS_RMS_NORM=is_rms_norm, HAS_BIAS=has_bias, HAS_RES=res, ZERO_CENTERED=zero_centered_gamma,
            IS_FP8=fp8, STORE_T=store_t and (pass_ != PASS_AMAX or tile_t), PASS=pass_,
            INTERPRETER=interpreter_rounding(), MANT=mant,
            MIN_EXP=min_exp, BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCKED=cfg.blocked,
            AMAX_V=_amax_v(cfg, tile_t) if fp8 else 1, EVEN=lean and _even(cfg, n, tile_t), BITS=lean,
            RELOAD_RES=_reload_res(cfg, n, res), BAND=band_, TBN=BAND_COLS,
            REV=_pass2_reverse(cfg, n, fp8), PREFETCH=_prefetch(cfg, res, band_))

    passes = ((constexprs(PASS_AMAX, has_res), constexprs(PASS_APPLY, False)) if fp8 and current_scaling
              else (constexprs(PASS_FULL, has_res),))
    cap = persistent_grid(1 << 62, device, sm_margin, cfg.programs_per_sm)
    return cfg, cap, passes, fp8, float(fp8_max), tile_t, band


#: Forward plans (:func:`_fwd_plan`) by everything they depend on, which is no tensor and not the
#: row count: as many as the distinct widths, dtypes and options a process runs.
#: ``engine.backend.reset_for_tests`` empties it (the interpreter switch is in the constexprs).
FWD_PLANS: dict = {}
backend.register_derived_cache(FWD_PLANS)


def launch_fwd(x, weight, bias, residual, eps, out, residual_out, mu, rsigma, scale, amax,
               scale_inv, out_t, *, is_rms_norm, zero_centered_gamma, current_scaling, amax_epsilon,
               sm_margin, config: Optional[nc.NormConfig] = None) -> None:
    """``norm_fwd`` with an explicit ``config`` (None: the heuristic). Used by tuning scripts.

    This runs on every call of a layer, so it is short: what depends only on the width, dtypes
    and options (config, programs per SM, constexprs) comes from a cached plan.
    """
    m, n = x.shape
    store_t = out_t is not None
    key = (n, x.dtype, out.dtype, bias is not None, residual is not None, store_t, current_scaling,
           x.device, sm_margin, is_rms_norm, zero_centered_gamma)
    plan = FWD_PLANS.get(key) if config is None else None
    if plan is None:
        plan = _fwd_plan(n, x.dtype, out.dtype, bias is not None, residual is not None, store_t,
                         current_scaling, x.device, sm_margin, is_rms_norm, zero_centered_gamma, config)
        if config is None:
            FWD_PLANS[key] = plan
    cfg, cap, passes, fp8, fp8_max, tile_t, band = plan
    launcher = _FWD_T if tile_t else _FWD
    if m == 0:
        if fp8:
            if current_scaling:
                amax.zero_()
                scale.copy_(compute_scale(amax, fp8_max, amax_epsilon))
            scale_inv.copy_(1.0 / scale)
        return
    if residual is not None and residual_out is None:  # as the CUDA backend's check
        raise ValueError("norm forward: residual given without residual_out")
    grid = min(-(-m // (band or cfg.block_m)), cap)
    dummy = rsigma
    rest = (weight, bias if bias is not None else weight, out)
    stats_q = (mu if mu is not None else dummy, rsigma) + (
        (scale, amax, scale_inv) if fp8 else (dummy, dummy, dummy)) + (out_t if store_t else out,)
    tail = (m, n, float(eps), fp8_max, float(amax_epsilon))
    if len(passes) == 2:
        amax.zero_()
    # Without a residual its slots take x (never read: HAS_RES is off) and stride 0; with one, the
    # norm's input z is residual_out (the kernel stores x + residual there).
    r, z = (x, x) if residual is None else (residual, residual_out)
    tensors = (x, r) + rest + (z,) + stats_q
    scalars = (x.stride(0), 0 if residual is None else r.stride(0), out.stride(0),
               0 if residual is None else z.stride(0)) + tail
    two = len(passes) == 2
    if two:  # PASS_APPLY reads z (x + residual where there is one) as its x
        tensors2, scalars2 = (z, z) + rest + (z,) + stats_q, (z.stride(0), 0, out.stride(0), 0) + tail
    if sm_margin:  # the launches' lists only here: the common call pays nothing for them
        launches = [(tensors, scalars, cfg.num_warps, cfg.num_stages, passes[0])]
        if two:
            launches.append((tensors2, scalars2, cfg.num_warps, cfg.num_stages, passes[1]))
        grid = margin_grid(grid, sm_margin, x.device, launcher, launches)
    launcher.launch(grid, tensors, scalars, cfg.num_warps, cfg.num_stages, passes[0])
    if two:
        launcher.launch(grid, tensors2, scalars2, cfg.num_warps, cfg.num_stages, passes[1])


def norm_fwd(x, weight, bias, residual, eps, out, residual_out, mu, rsigma, scale, amax, scale_inv,
             out_t, *, is_rms_norm, zero_centered_gamma, current_scaling, amax_epsilon, sm_margin,
             out_t_auto=False, out_t_after=False):
    """Norm forward; the contract of :func:`engine.reference.norm_fwd`. With ``out_t_auto`` the
    transposed copy comes from the norm kernel's bands where they measured faster
    (:func:`band_by_default`), else from the tiled transpose after the norm; with ``out_t_after``
    from the tiled transpose after the norm; with neither from the norm kernel, except where its
    runs are 2-, 4- or 8-byte aligned (:func:`narrow_copy`: the tiled transpose after the norm)."""
    check_out_t_modes(out_t_auto, out_t_after)
    external = out_t is not None and (out_t_after or narrow_copy(x.shape[0]) or (
        out_t_auto and not band_by_default(x.shape[1], is_rms_norm, residual is not None,
                                           current_scaling, x.device)))
    launch_fwd(x, weight, bias, residual, eps, out, residual_out, mu, rsigma, scale, amax, scale_inv,
               None if external else out_t, is_rms_norm=is_rms_norm,
               zero_centered_gamma=zero_centered_gamma, current_scaling=current_scaling,
               amax_epsilon=amax_epsilon, sm_margin=sm_margin)
    if external:
        from engine.triton_kernels.transpose import fp8_transpose

        fp8_transpose(out, out_t, sm_margin)


def _tail_n(cfg: nc.NormConfig, n: int) -> int:
    """The backward's tail tile (:attr:`NormConfig.tail`): the next power of two of the columns
    past ``block_n``; 0 without one. Raises where the config cannot hold the row: a tail that
    would be empty or narrower than the rest (not block_n < N <= 2 block_n), a tail on the split
    kernel, or a register tile narrower than the row without one."""
    if not cfg.tail:
        if not cfg.blocked and not cfg.split and n > cfg.block_n:
            raise ValueError(f"norm backward config {cfg}: a register tile of {cfg.block_n} columns "
                             f"cannot hold rows of {n} (tail=True: up to {2 * cfg.block_n})")
        return 0
    if cfg.split or not cfg.block_n < n <= 2 * cfg.block_n:
        raise ValueError(f"norm backward config {cfg}: a tail holds the columns past block_n of a "
                         f"register tile or one blocked chunk, block_n < N <= {2 * cfg.block_n}, "
                         f"not N = {n}")
    return triton.next_power_of_2(n - cfg.block_n)


def _bwd_plan(n, x_dtype, has_dres_in, has_dres, has_db, device, sm_margin, is_rms_norm,
              zero_centered_gamma, config):
    """What a backward launch needs beyond the tensors and the row count: ``(config, programs
    cap, constexprs)``."""
    cfg = config or nc.bwd_config(n, x_dtype, is_rms_norm)
    tail = _tail_n(cfg, n)
    if cfg.split:
        return _split_plan(cfg, n, has_dres_in, has_dres, has_db, device, sm_margin, is_rms_norm,
                           zero_centered_gamma, config is None)
    constexprs = _BWD.constexprs(
        IS_RMS_NORM=is_rms_norm, ZERO_CENTERED=zero_centered_gamma, HAS_DRES_IN=has_dres_in,
        HAS_DRES=has_dres, HAS_DB=has_db, INTERPRETER=interpreter_rounding(),
        BLOCK_M=cfg.block_m, BLOCK_N=cfg.block_n, BLOCKED=cfg.blocked,
        ONE_CHUNK=cfg.blocked and (n <= cfg.block_n or bool(tail)),
        EVEN=cfg.block_m == 1 if tail else _even(cfg, n, False),
        TAIL_N=tail, EVEN_T=bool(tail) and cfg.block_m == 1 and n == cfg.block_n + tail,
        ROW_PHASES=BWD_ROW_PHASES and cfg.row_phases)
    return cfg, persistent_grid(1 << 62, device, sm_margin, cfg.programs_per_sm), constexprs


#: Whether the backward's tiles of several rows run the whole tiles with their rows unmasked, then
#: the last, part-empty one (ROW_PHASES in _norm_bwd_kernel): with every tile masked, Triton
#: compiled one row predicate per pair of rows only where it had specialised M as a multiple of
#: 16, and RMSNorm's f+b at 4K / 8K read 5 / 13 points lower at M % 16 != 0 (NOTES Q92, Q92b).
#: An entry may opt out (NormConfig.row_phases: RMSNorm's 4 x 1024 tile at 4 stages lost 14
#: points with them, NOTES P191b). Module attribute for A/B runs (profile_kernels.py
#: --triton-bwd-row-phases).
BWD_ROW_PHASES = True

#: The split backward's lag: 2, phase A of row i-1 while row i loads, then phase B of row i-2
#: (H200, 8192 x 8 warps, the backward alone: RMSNorm 32K / 128K 55.3 / 43.4 -> 72.5 / 71.4 %,
#: LayerNorm 55.4 / 42.2 -> 56.4 / 51.2 against 1; NOTES P72), and its programs per SM (1: a
#: group's programs are resident together whatever the kernel's registers; 2 measured slower).
#: Module attributes for experiments (tests run both lags).
SPLIT_LAG = 2
SPLIT_PROGRAMS_PER_SM = 1
#: Whether the split backward holds its gamma slice in registers for the whole kernel (True) or
#: loads it again before each phase (False: from L1, live within a phase only); None: per norm,
#: RMSNorm holds it, LayerNorm (which holds dB too and spilled at 255 registers) loads it. H200,
#: the backward alone, 8192 x 8 warps, held -> loaded: LayerNorm 32K / 128K 55.5 / 50.4 -> 69.7 /
#: 63.5 %, RMSNorm 72.2 / 70.0 -> 71.5 / 69.5 (NOTES P74).
SPLIT_HOLD_G = None


def split_groups_run(device: torch.device) -> bool:
    """Whether the split backward's programs run at once on ``device`` (G > 1 possible): on a GPU;
    not in the interpreter. ci/triton_compile_check.py says True to compile the GPU's variants."""
    return device.type == "cuda"


def _split_plan(cfg, n, has_dres_in, has_dres, has_db, device, sm_margin, is_rms_norm, zero_centered_gamma,
                heuristic):
    """:func:`_bwd_plan` of the split backward: ``(config, row groups cap, constexprs)``. The G
    programs of a row group wait for one another, so at most one program per SM (a program of
    at most 1024 threads always fits one) and G <= SMs; the heuristic's config falls back to the
    blocked one where G would not fit, and an explicit one raises. The interpreter runs programs
    one after another: G = 1 there (the heuristic's slice widens to the row; an explicit G > 1
    raises)."""
    sms = persistent_grid(1 << 62, device, sm_margin, SPLIT_PROGRAMS_PER_SM)
    slice_n = cfg.block_n
    concurrent = split_groups_run(device)
    if not concurrent and heuristic:
        slice_n = triton.next_power_of_2(n)
    g = -(-n // slice_n)
    if (not concurrent and g > 1) or g > sms:
        if heuristic:
            return _bwd_plan(n, None, has_dres_in, has_dres, has_db, device, sm_margin, is_rms_norm,
                             zero_centered_gamma, nc.BWD_BLOCKED)
        raise ValueError(f"split backward: {g} programs per row do not fit "
                         f"{'the interpreter (one at a time)' if device.type != 'cuda' else f'{sms} SMs'}")
    cfg = nc.NormConfig(1, slice_n, False, cfg.num_warps, 1, cfg.num_stages, split=True)
    constexprs = _BWD_SPLIT.constexprs(
        IS_RMS_NORM=is_rms_norm, ZERO_CENTERED=zero_centered_gamma, HAS_DRES_IN=has_dres_in,
        HAS_DRES=has_dres, HAS_DB=has_db, INTERPRETER=interpreter_rounding(), G=g,
        KG_P2=triton.next_power_of_2(g * (1 if is_rms_norm else 2)), SLICE=slice_n, LAG=SPLIT_LAG,
        HOLD_G=is_rms_norm if SPLIT_HOLD_G is None else SPLIT_HOLD_G,
        EVEN=g * slice_n == n)
    return cfg, max(1, sms // g), constexprs


def _launch_bwd_split(cfg, groups_cap, constexprs, dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight,
                      dbias, sm_margin) -> None:
    """Launch ``_norm_bwd_split_kernel`` (:func:`_split_plan`), then reduce its partials."""
    m, n = x.shape
    g = -(-n // cfg.block_n)
    groups = min(m, groups_cap)
    k = 1 if mu is None else 2
    xchg = torch.zeros((m, k * g), dtype=torch.int64, device=x.device)
    parts = torch.empty(2 if dbias is not None else 1, groups, n, dtype=torch.float32, device=x.device)
    dw_part = parts[0]
    db_part = parts[1] if dbias is not None else dw_part
    _BWD_SPLIT.launch(groups * g, (
        dy, x, mu if mu is not None else rsigma, rsigma, weight,
        dresidual if dresidual is not None else dy, dx, dres if dres is not None else dx,
        dw_part, db_part, xchg,
    ), (
        dy.stride(0), x.stride(0), dresidual.stride(0) if dresidual is not None else 0, dx.stride(0),
        dres.stride(0) if dres is not None else 0, m, n,
    ), cfg.num_warps, cfg.num_stages, constexprs)
    nc.reduce_partials(parts, dweight, dbias, sm_margin)


#: Backward plans (:func:`_bwd_plan`), as :data:`FWD_PLANS`.
BWD_PLANS: dict = {}
backend.register_derived_cache(BWD_PLANS)


def launch_bwd(dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias, *, is_rms_norm,
               zero_centered_gamma, sm_margin, config: Optional[nc.NormConfig] = None) -> None:
    """``norm_bwd`` with an explicit ``config`` (None: the heuristic); a cached plan as in
    :func:`launch_fwd`."""
    m, n = x.shape
    if m == 0:
        dweight.zero_()
        if dbias is not None:
            dbias.zero_()
        return
    key = (n, x.dtype, dresidual is not None, dres is not None, dbias is not None, x.device, sm_margin,
           is_rms_norm, zero_centered_gamma)
    plan = BWD_PLANS.get(key) if config is None else None
    if plan is None:
        plan = _bwd_plan(n, x.dtype, dresidual is not None, dres is not None, dbias is not None, x.device,
                         sm_margin, is_rms_norm, zero_centered_gamma, config)
        if config is None:
            BWD_PLANS[key] = plan
    cfg, cap, constexprs = plan
    if cfg.split:
        _launch_bwd_split(cfg, cap, constexprs, dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight,
                          dbias, sm_margin)
        return
    p = min(-(-m // cfg.block_m), cap)
    scalars = (dy.stride(0), x.stride(0), dresidual.stride(0) if dresidual is not None else 0, dx.stride(0),
               dres.stride(0) if dres is not None else 0, m, n)
    while True:
        # dW and, with a bias, dB partials in one allocation, reduced in one launch (reduce_partials)
        parts = torch.empty(2 if dbias is not None else 1, p, n, dtype=torch.float32, device=x.device)
        dw_part = parts[0]
        db_part = parts[1] if dbias is not None else dw_part
        tensors = (dy, x, mu if mu is not None else rsigma, rsigma, weight,
                   dresidual if dresidual is not None else dy, dx, dres if dres is not None else dx,
                   dw_part, db_part)
        # under an sm_margin, the partials again for a grid cut to the resident programs (the cut
        # grid's allocation may place db_part at another alignment: a kernel of its own, checked)
        capped = p if not sm_margin else margin_grid(
            p, sm_margin, x.device, _BWD, [(tensors, scalars, cfg.num_warps, cfg.num_stages, constexprs)])
        if capped == p:
            break
        p = capped
    _BWD.launch(p, tensors, scalars, cfg.num_warps, cfg.num_stages, constexprs)
    nc.reduce_partials(parts, dweight, dbias, sm_margin)


def norm_bwd(dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias, *, is_rms_norm,
             zero_centered_gamma, sm_margin):
    """Norm backward; the contract of :func:`engine.reference.norm_bwd`."""
    launch_bwd(dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias, is_rms_norm=is_rms_norm,
               zero_centered_gamma=zero_centered_gamma, sm_margin=sm_margin)
