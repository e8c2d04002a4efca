"""Launch configuration of the norm kernels and the deterministic reduction of dW/dB partials.

Configs are frozen dataclasses from a heuristic on (N, dtype) -- never on M, so a compiled kernel
serves every batch size. The heuristic is a table measured on an H200 with benchmarks/tune.py
(``ENGINE_TRITON_AUTOTUNE`` is reserved: configs are heuristic today).
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl

from engine.triton_kernels.launch import Launcher
from engine.triton_kernels.utils import _cast, interpreter_rounding, margin_grid, sm_count

#: Widest row (in elements) the forward may hold in registers (a register-path tile's cap).
MAX_FUSED_N = 32768
#: Widest row the backward may hold in registers (it keeps dy, x and the dW/dB partials live).
MAX_FUSED_N_BWD = 16384
#: Column chunk of the blocked path where no measured entry says otherwise.
BLOCKED_CHUNK_N = 8192
#: Tile of the in-kernel FP8 transpose: BLOCK_M rows (a transposed store writes this many contiguous
#: bytes per column) by BLOCK_N column chunks, and its warps. Measured on an H200 (tune.py
#: fwd-fp8T, h200_tune_rms_fp8.log): 16 x 128 with 8 warps was 1.8-4.3x faster than 64 x 64 with 4.
TRANSPOSE_BLOCK_M = 16
TRANSPOSE_BLOCK_N = 128
TRANSPOSE_WARPS = 8


@dataclass(frozen=True)
class NormConfig:
    """How one norm kernel is launched.

    block_m: rows per tile; block_n: columns per tile (>= N unless ``blocked`` or ``tail``);
    blocked: two passes over column chunks per row tile; num_warps; programs_per_sm: persistent
    programs per multiprocessor; num_stages: software-pipelining depth Triton may apply to the
    persistent row loop. split (backward only): each row split over the programs of a row group,
    ``block_n`` columns each (``_norm_bwd_split_kernel``; ``block_m`` 1, not blocked, one program
    per SM). prefetch (forward, register tiles without a residual or bands; norms._prefetch): each
    iteration of the row loop loads the next tile's x before this tile's reductions. tail
    (backward only; block_n < N <= 2 block_n): the columns past ``block_n`` in one more tile of the
    next power of two of the rest (norms._tail_n), beside the register tile or the blocked path's
    one chunk: a width between the powers of two fills its lanes (5120 = 4096 + 1024).
    row_phases (backward, tiles of several rows): the whole row tiles with their rows unmasked,
    then the last (norms.BWD_ROW_PHASES); False where an entry measured slower so.
    """

    block_m: int
    block_n: int
    blocked: bool
    num_warps: int
    programs_per_sm: int
    num_stages: int = 3
    split: bool = False
    prefetch: bool = False
    tail: bool = False
    row_phases: bool = True


# Measured on an H200 (benchmarks/tune.py, bf16, M*N = 64M; benchmarks/results/ and NOTES.md):
# the fastest (block_m, num_warps, programs_per_sm) per power-of-two row width. The forward wants
# tiles of 8K-32K elements at ~32 elements per thread and 8 programs per SM (more loads in flight
# across programs); the backward wants few programs (its dW/dB partials cost 2 * P * N * 4 bytes)
# and small tiles. num_stages made no difference (< 0.5 %) and stays at Triton's default.
#
# Programs per SM were then swept up to 32 (h200_tune_*_pps.log): at 1K, 4K and 8K 16-32 programs
# per SM won by 4-6 % (about one or two row tiles per program at M*N = 64M: the persistent loop
# and its hoisting stay, and cost nothing when the loop runs once).
# 2K: one row per 2-warp program (tune.py's 1- and 2-warp candidates, session 6: 88.1 % against
# 82.5 % for 16 x 2048 at 32 warps; h200_tune_rmsnorm_small_warps.log).
_FWD_TABLE = {1024: (8, 8, 32), 2048: (1, 2, 32), 4096: (4, 16, 16), 8192: (2, 8, 32)}
# From 16K the blocked path wins, with one or two chunks of 16K (session 9, tune.py with chunks
# of 16K and blocked candidates from 4K: h200_tune_rms_fwd_s9.log). Its first pass only sums, so
# the row is not live in registers through the row reduction and the output; the second pass
# re-reads it from L2. torch.compile's kernels have this shape at 8K-32K (ci/inductor_code.py,
# h200_inductor_configs.log). Against the register tiles before: 16K 1.08x, 32K 1.15x, 64K 1.14x.
_FWD_BLOCKED_TABLE = {
    16384: NormConfig(1, 16384, True, 8, 32),
    32768: NormConfig(1, 16384, True, 16, 8, 1),
    65536: NormConfig(2, 16384, True, 32, 4, 4),
    # RMSNorm rows of 128K: one row per program and one program per SM in chunks of 32K, 1.19x
    # over two rows per tile in chunks of 8K at 2 programs per SM (session 11, tune.py with 32K
    # chunks: h200_tune_rmsnorm_s11.log). ~130 rows in flight keep pass 2's re-read in L2, where
    # ~260 (two programs per SM) put it past the L2 (ncu: 230 MB read for 134 MB of x, NOTES
    # P26); 32 values per thread per chunk keep the loads in flight.
    131072: NormConfig(1, 32768, True, 32, 1, 4),
}
_FWD_BLOCKED = NormConfig(1, BLOCKED_CHUNK_N, True, 32, 8)  # wider than the table
_BWD_TABLE = {1024: (2, 4, 4), 2048: (2, 8, 2), 4096: (4, 16, 1), 8192: (2, 16, 1)}
# 16K: blocked, one chunk. From 32K the split kernel (below) replaced the blocked tiles measured
# here before (two rows in chunks of 16K at 32K, four rows in chunks of 8K at 64K-128K: sessions 9
# and 11, NOTES; h200_tune_rmsnorm_bwd_s9.log, h200_tune_rmsnorm_bwd_s11*.log).
_BWD_BLOCKED_TABLE = {
    # 16K: one row per tile in one chunk, whose dW accumulator and gamma stay in registers across
    # row tiles (ONE_CHUNK, session 12: h200_tune_rmsnorm_bwd_s12.log, 75.6 % against 43.0 % for
    # the 2-row tile that ONE_CHUNK made spill; NOTES P33)
    16384: NormConfig(1, 16384, True, 32, 1, 3),
}
BWD_BLOCKED = NormConfig(2, BLOCKED_CHUNK_N, True, 32, 1)  # wider than the table (and the split's G)
#: The split backward (rows over the programs of a row group, dW / dB in registers): slices of
#: 8192 columns at 8 warps (tune.py --kinds split at lag 2 on the H200, the backward alone:
#: RMSNorm 73 / 72 / 71 % at 32K / 64K / 128K; h200_tune_split_s23_lag2_*.log, NOTES P72;
#: LayerNorm with gamma loaded per phase, P74), from 32K for RMSNorm and from 16K for LayerNorm
#: (ci/split_exp.py, the backward alone against the one-chunk blocked kernel: LayerNorm 16K 61.5
#: -> 69.3 %, RMSNorm 16K 79.1 -> 71.8; at 4K-8K the other kernels win or tie, LayerNorm 8K 70.8
#: against 69.8: h200_split_exp_s23_{16k,narrow}.log).
SPLIT_BWD_FROM = 32768
LN_SPLIT_BWD_FROM = 16384
_SPLIT = NormConfig(1, 8192, False, 8, 1, split=True)

# Where another op wants another config (tune.py on the H200: h200_tune_rms_fp8.log,
# h200_tune_ln.log; entries only where the gain over the RMSNorm bf16 table was over 5 %).
# FP8 rowwise outputs (their store takes 16 values per thread, 8 for a 16-bit output).
_FWD_FP8_OVERRIDES = {
    1024: NormConfig(1, 1024, False, 1, 16),  # 1.24x, a warp per row (h200_tune_rmsnorm_small_w*)
    # session 54 (NOTES Q67, ci/cfg_exp.py, kernel time, two alternations, h200_cfg_exp_s54_q67.log):
    # two rows per 2-warp program, 32 programs per SM, 83.1 / 83.3 -> 88.0 / 88.8 % of copy, the
    # same bytes at 2048 columns as the base table's one row per program (tune.py's grid had no
    # 2-row tile at 2 warps: 64 values per thread); profile_kernels A/B 83.4-83.9 -> 88.9-89.4
    2048: NormConfig(2, 2048, False, 2, 32),
    # session 10, after the FP8 kernel lost its per-chunk gamma conversion and its per-tile amax
    # reduction (NOTES P21-P22; h200_tune_rmsnorm_fp8_s10.log): 4K one row per 2-warp program in
    # two chunks 1.06x, 128K one row in chunks of 16K 1.21x
    4096: NormConfig(1, 2048, True, 2, 16, 4),
    8192: NormConfig(2, 8192, False, 8, 2),  # 1.19x (h200_tune_rms_fp8_s3.log)
    # 16K / 32K re-tuned after P80 (Q9, h200_tune_rms_fp8_s25.log: 1.03x / 1.04x timed), taken
    # after an A/B in kernel time (NOTES Q12)
    16384: NormConfig(2, 16384, False, 32, 1, 3),
    32768: NormConfig(1, 16384, True, 16, 2, 4),
    65536: NormConfig(1, 16384, True, 16, 2, 1),  # 1.12x (h200_tune_rmsnorm_fp8_s9.log)
    131072: NormConfig(1, 32768, True, 32, 1, 2),  # 1.11x, as the bf16 entry (session 11)
}
#: Forward entries with the next tile's x prefetched (NormConfig.prefetch, norms._prefetch), by
#: (RMSNorm, FP8 output), where there is no residual (the residual forms keep their entries: the
#: prefetch is not built for them): after a lean card's own entries (none at these widths; the
#: H100 takes these unmeasured there), ahead of every other table. Session 55 (NOTES P175,
#: ci/cfg_exp.py, kernel time, % of copy, two alternations, h200_cfg_exp_s55_p175.log): a program
#: keeps the next tile's loads in flight through this tile's reductions; against the launcher's
#: entries: RMSNorm e4m3 16K one row over 16 warps, one program per SM, 80.3-80.7 -> 90.5-91.2;
#: LayerNorm e4m3 2K two rows over 4 warps, 8 per SM, 80.9-81.1 -> 89.7-90.4; 4K two rows over 8
#: warps, 4 per SM, 82.0-82.8 -> 88.0; LayerNorm bf16 16K one row over 16 warps, 90.2-90.3 ->
#: 93.8-94.3 (91.4-91.7 in profile_kernels' A/B, h200_ab_s55_p175b.log). Call 4's candidates
#: (h200_cfg_exp_s55_p175b.log): LayerNorm e4m3 8K two rows over 16 warps, one program per SM,
#: 81.5-82.3 -> 87.0-88.0; 16K one row over 16 warps at 2 stages 78.7-79.5 -> 83.2-83.4. Where
#: the prefetched tile does not fit the registers it loses (RMSNorm e4m3 32K at 32 warps 73.7 ->
#: 59.8; LayerNorm e4m3 32K 37.6 -> 24.4; LayerNorm e4m3 8K 76.3 -> 71.0 on one row over 8 warps).
#: Session 56 (NOTES Q71, h200_cfg_exp_s56_q71.log, same method): RMSNorm e4m3 1K one row per
#: warp, 16 per SM, 88.7-89.4 -> 94.1-94.8; 4K one row over 4 warps, 8 per SM (the blocked
#: 1x2048B w2 p16 before), 89.0-89.2 -> 94.4-94.8; LayerNorm e4m3 1K two rows over 2 warps, 16
#: per SM, 85.9-86.0 -> 90.7-91.1; profile_kernels' A/B (NOTES Q71b, h200_ab_s56_q71b.log, two
#: alternations): +5.0 / +1.9 / +5.1. RMSNorm e4m3 2K and 8K lost with their entries prefetched
#: (-4, -11: past the registers of their programs per SM).
_FWD_PREFETCH_OVERRIDES = {
    (True, True): {1024: NormConfig(1, 1024, False, 1, 16, prefetch=True),
                   4096: NormConfig(1, 4096, False, 4, 8, prefetch=True),
                   16384: NormConfig(1, 16384, False, 16, 1, prefetch=True)},
    (False, True): {1024: NormConfig(2, 1024, False, 2, 16, prefetch=True),
                    2048: NormConfig(2, 2048, False, 4, 8, prefetch=True),
                    4096: NormConfig(2, 4096, False, 8, 4, prefetch=True),
                    8192: NormConfig(2, 8192, False, 16, 1, prefetch=True),
                    16384: NormConfig(1, 16384, False, 16, 1, 2, prefetch=True)},
    (False, False): {16384: NormConfig(1, 16384, False, 16, 1, prefetch=True)},
    (True, False): {},
}
# LayerNorm (bias, mean): smaller tiles per warp; from 8K the two-pass blocked path wins.
_LN_FWD_OVERRIDES = {
    # 1K: two warps per 4-row tile (each row's two sums stay inside a warp: shuffles, no bar.sync),
    # 1.28x (h200_tune_ln_1k.log; tune.py had never tried 1- or 2-warp programs before)
    1024: NormConfig(4, 1024, False, 2, 32),
    2048: NormConfig(4, 2048, False, 4, 32),  # 1.27x; 32 programs/SM 1.06x more
    # session 25 (P84, h200_ab_s25_p84.log, kernel time, two alternations): 4K one row blocked
    # over 2 warps 90.5 -> 93.6 % (its residual form lost: _RES_FWD_OVERRIDES), 32K 83.8 -> 87.0,
    # 128K 71.2 -> 73.9, from Q9's sweep (h200_tune_ln_s25.log)
    4096: NormConfig(1, 4096, True, 2, 32, 4),
    16384: NormConfig(2, 8192, True, 8, 8, 2),  # 1.28x
    # session 9 (h200_tune_ln_fwd_s9.log, blocked candidates from 4K and chunks of 16K), against
    # what each width got before: 8K 1.11x, 32K 1.17x, 64K 1.24x, 128K 1.18x
    8192: NormConfig(2, 8192, True, 8, 4, 2),
    32768: NormConfig(1, 16384, True, 8, 4, 3),
    # session 25 after the one-pass statistics (NOTES P80, Q9; h200_tune_ln_s25.log): 1.13x, the
    # session 9 entry (1, 16384, True, 16, 32, 2) lost 4 points with the new pass 1
    65536: NormConfig(2, 16384, True, 32, 2, 4),
    # session 11 (h200_tune_layernorm_s11.log): 1.15x, as RMSNorm (_FWD_BLOCKED_TABLE)
    131072: NormConfig(1, 32768, True, 16, 8, 1),
}
# The fused residual add (16-bit or fp32 output) where its entry differs from the plain forward's,
# by norm (True: RMSNorm): register tiles where the blocked path measured slower. RMSNorm 16K
# (timed table at 4748fbf: residual RMSNorm fwd 16K / 32K 93 / 84 % -> 88 / 80 % with the blocked
# entries above, when pass 2 re-read x and the residual; h200_ab_triton_res_blocked.log); at 32K,
# since pass 2 reads residual_out (NOTES P92), the blocked entry wins instead (kernel time, two
# calls of two alternations: 87.0 / 87.5 -> 88.6 / 89.0 %; h200_ab_s28_p92*.log), at 16K not
# (95.7 -> 95.8, 95.9 -> 93.8). LayerNorm 4K, the tile P84 replaced for the plain forward (the
# residual form lost 91.8 -> 88.2 % with the blocked one, h200_ab_s25_p84.log).
# Re-tuned after P92 (tune.py --ops fwd-res, h200_tune_res_*_s28.log; entries over 5 % better
# than the heuristic's, timed): RMSNorm 32K / 64K 1.08x / 1.05x, LayerNorm 16K / 32K 1.10x /
# 1.11x, blocked tiles of one or two rows in chunks of 16K-32K at 16-32 warps: one chunk over the
# row at RMSNorm 32K and LayerNorm 16K / 32K (pass 2 then re-reads x and the residual:
# norms._reload_res), two at RMSNorm 64K (pass 2 reads residual_out); an A/B in kernel time, two
# alternations (NOTES P93,
# h200_ab_s28_p93.log): RMSNorm 32K / 64K 89.3 / 87.0 -> 95.7 / 90.0 %, LayerNorm 16K / 32K 86.7 /
# 85.9 -> 93.8 / 93.8. LayerNorm 8K kept the plain forward's entry until session 50: 32 warps at 32
# programs per SM gained on an H100 (NOTES P94: 90.8 -> 98.8 % of its copy) and lost on the H200
# (P97, two alternations in one call, h200_ab_s29_p97.log), so it is the lean card's entry
# (_RES_FWD_OVERRIDES_LEAN; utils.lean_dram, NOTES P109); the H200's own sweep (Q58) found one
# row per program at 16 warps (below).
# RMSNorm 128K and LayerNorm 64K: one row per program in chunks of 32K at 32 programs per SM
# (NOTES P111: tune.py --ops fwd-res on an H100, h100_tune_res_wide_{rms,ln}_s33.log, timed, % of
# its copy: 82.1 -> 87.4, 86.1 -> 93.1; kernel time 83.8-84.2 -> 89.2, 87.3-87.6 -> 94.9-95.1), a
# lean card's entries until the H200 measured them too (P113: kernel time, two alternations,
# h200_ab_s34_class.log: 81.3-82.3 -> 84.6-85.7, 83.8-84.2 -> 87.1-87.5), so both cards' now.
_RES_FWD_OVERRIDES = {
    True: {16384: NormConfig(2, 16384, False, 32, 8),
           32768: NormConfig(1, 32768, True, 16, 8, 1), 65536: NormConfig(1, 32768, True, 16, 8, 2),
           131072: NormConfig(1, 32768, True, 16, 32, 2)},
    False: {4096: NormConfig(4, 4096, False, 8, 8),
            # session 50 (Q58, tune.py --ops fwd-res on the H200, h200_tune_res_ln_s50.log, timed,
            # each candidate checked against the reference): one row in one chunk over 16 warps at
            # 32 programs per SM, 96.2 % of copy against the plain forward's entry's 87.0 (1.11x);
            # kernel time, three alternations, 88.8-89.8 -> 98.8-99.2 (NOTES Q58b,
            # h200_ab_s51_q58.log)
            8192: NormConfig(1, 8192, True, 16, 32, 1),
            16384: NormConfig(2, 16384, True, 32, 8, 2), 32768: NormConfig(1, 32768, True, 32, 8, 2),
            65536: NormConfig(1, 32768, True, 16, 32, 3)},
}
#: Residual-form entries of a lean card (utils.lean_dram: the H100) ahead of _RES_FWD_OVERRIDES:
#: P94's LayerNorm 8K (a loss on the H200: P97).
_RES_FWD_OVERRIDES_LEAN = {
    True: {},
    False: {8192: NormConfig(2, 8192, True, 32, 32, 2)},
}
#: A lean card's forward entries without a residual, by (RMSNorm, FP8 output), ahead of the tables
#: above (NOTES P110: tune.py on an H100, h100_tune_wide_{rms,ln}_s33.log, timed, % of its copy,
#: against the H200 tables' entries): rows of 64K read in two chunks of 32K, not four of 16K.
_FWD_OVERRIDES_LEAN = {
    (True, False): {65536: NormConfig(1, 32768, True, 32, 16, 3)},  # 83.1 -> 89.5
    (True, True): {65536: NormConfig(1, 32768, True, 32, 2, 4)},  # 72.0 -> 78.7
    (False, False): {65536: NormConfig(1, 32768, True, 16, 8, 2)},  # 80.0 -> 85.5
    (False, True): {65536: NormConfig(1, 32768, True, 32, 1, 4)},  # 67.1 -> 74.3
}
# LayerNorm with an FP8 output (h200_tune_ln_fp8.log, entries over 5 % better than what it got
# before, the RMSNorm FP8 entries or the base table): few programs per SM; one row per 1-2 warps
# at 1K-2K (session 6), 8-16 warps from 8K.
_LN_FWD_FP8_OVERRIDES = {
    # 1K: the RMSNorm FP8 entry (a warp per row), 1.47x (h200_tune_layernorm_small_warps.log)
    2048: NormConfig(1, 2048, False, 2, 8),  # 1.25x (the same run)
    # 8K: blocked (one chunk) since the unmasked LayerNorm forward (NOTES P27), 1.11x over the
    # register tile (session 11, h200_tune_layernorm_fp8_s11.log)
    8192: NormConfig(1, 8192, True, 8, 4, 3),
    # session 10 (NOTES P21-P22; h200_tune_layernorm_fp8_s10.log), against session 9's entries:
    # one row per program, blocked, 4K 1.13x, 16K 1.17x, 32K 1.26x, 64K 1.26x, 128K 1.24x
    4096: NormConfig(1, 2048, True, 2, 32, 4),
    16384: NormConfig(1, 8192, True, 8, 8, 3),
    32768: NormConfig(1, 16384, True, 16, 2, 2),
    65536: NormConfig(1, 16384, True, 16, 4, 4),
    # 128K: four chunks of 32K at 32 warps, two programs per SM (NOTES P110, tune.py on an H100:
    # 59.1 -> 63.5 % timed, kernel time 61.1-61.3 -> 66.1-66.5), a lean card's entry until the
    # H200 measured it too (P113, kernel time, two alternations: 58.5-58.7 -> 60.9-61.1)
    131072: NormConfig(1, 32768, True, 32, 2, 3),
}
# RMSNorm backward entries off the base table (session 14, tune.py after the backward's EVEN and
# two-FMA dz: h200_tune_bwd_1k_s14.log): 1K four-row tiles at 4 stages, 1.09x on the backward,
# fwd+bwd kernel time 83.2 / 82.9 -> 88.5 / 88.2 % (h200_ab_s14_rms1k.log); LayerNorm's best
# there was 1.01x over its entry: no change
# Without the row phases (NormConfig.row_phases): with them this tile's f+b read 80.4 against 94.3
# (two reps, h200_knob_s61_1k.log, NOTES P191b), where every other multi-row entry held or gained.
_RMS_BWD_OVERRIDES = {1024: NormConfig(4, 1024, False, 4, 4, 4, row_phases=False)}
_LN_BWD_OVERRIDES = {
    4096: NormConfig(1, 4096, False, 8, 2),  # 1.23x
    # 8K: two rows in one blocked chunk (ONE_CHUNK), 1.08x over the 1 x 8192 register tile that
    # stood here (1.23x over the base table before; h200_tune_layernorm_bwd_4k_8k_s12.log); 16
    # warps and 2 stages since the two-FMA dz (session 14: tune.py 1.06x on the backward,
    # fwd+bwd 76.0 -> 78.8 %, two alternations: h200_ab_s14_ln8k.log)
    8192: NormConfig(2, 8192, True, 16, 1, 2),
    # 16K and wider: the split kernel (LN_SPLIT_BWD_FROM above); the blocked tiles measured here
    # before (sessions 9-12: h200_tune_layernorm_bwd_s9.log, h200_tune_layernorm_bwd_s11*.log,
    # h200_tune_layernorm_bwd_s12.log) are in git history and NOTES
}


def _small_rows(p2: int, table: dict) -> tuple:
    """Rows narrower than the table: keep the widest row's tile size (in elements) and warps."""
    bm, w, p = table[1024]
    return min(64, bm * 1024 // p2), w, p


#: FP8 forward tiles of the transposed copy by bands (norms.BAND_ROWS), by width: 8-16 warps per
#: program. The rowwise entries' 1- and 2-warp programs then turn each band with a few threads
#: (tune.py --ops fwd-fp8T, H100, session 32: 1K 1x1024 w1 59.5 %, 8x1024 w8 p8 74.4 %; 4K the
#: rowwise entry 56.0 %, 4x4096 w16 62.5 %; programs per SM within 1-2 points from 1 to 32).
#: 2K and 8K are interpolated (not tuned); wider rows take the rowwise entries.
_BAND_FWD_FP8 = {
    1024: NormConfig(8, 1024, False, 8, 8),
    2048: NormConfig(4, 2048, False, 8, 8),
    4096: NormConfig(4, 4096, False, 16, 8),
    8192: NormConfig(2, 8192, False, 16, 8),
}


def band_fwd_config(n: int, dtype: torch.dtype, rms: bool = True) -> NormConfig:
    """Config of the FP8 forward whose transposed copy is written by bands: the tiles of
    :data:`_BAND_FWD_FP8`, else the rowwise FP8 config."""
    return _BAND_FWD_FP8.get(triton.next_power_of_2(n)) or fwd_config(n, dtype, False, True, rms)


#: The least share of a blocked forward tile's lanes a row between the powers of two must fill
#: (0: off), for the 16-bit and fp32 outputs. The tables are keyed by next_pow2(N), so a row of
#: 18432 takes 32K's chunks of 16384 and its second chunk is 1/8 full. Where the row fills less
#: than this share of its chunks, the chunk halves and the tile takes twice the rows (the same
#: values per tile, warps and programs), down to MIN_FILL_CHUNK_N. H200, kernel time, % of copy,
#: two alternations (NOTES P189): fwd RMSNorm 18432 / 20480 74.8 / 77.1 -> 83.8 / 82.9,
#: LayerNorm 66.0 / 68.8 -> 79.3 / 82.2; + residual 40960 RMSNorm 85.1 -> 86.7, LayerNorm 80.0 ->
#: 84.9; no power of two moves. The FP8 outputs keep their tables' configs: the same halving lost
#: RMSNorm e4m3 5 points at 18432 / 20480 (LayerNorm +0.5-0.8).
FWD_CHUNK_FILL = 0.75
MIN_FILL_CHUNK_N = 2048


def fill_chunks(cfg: NormConfig, n: int, fill: float) -> NormConfig:
    """``cfg`` with its column chunk halved (and its rows per tile doubled) while a row of ``n``
    fills less than ``fill`` of the lanes of its chunks, down to :data:`MIN_FILL_CHUNK_N`: the
    rule of :data:`FWD_CHUNK_FILL`. Register tiles, split configs and rows of one chunk (one pass
    over x, no re-read: halving it would add one) are returned as they are."""
    if not cfg.blocked or cfg.split or n <= cfg.block_n:
        return cfg
    while cfg.block_n // 2 >= MIN_FILL_CHUNK_N:
        c = cfg.block_n
        if n / (-(-n // c) * c) >= fill:
            break
        cfg = replace(cfg, block_m=2 * cfg.block_m, block_n=c // 2)
    return cfg


#: The FP8 (rowwise) forward at widths between the powers of two, by next_pow2(N), without a
#: residual: one-row tiles in blocked chunks of 8192 at 8 warps, 8 programs per SM, 2 stages,
#: where the 32K entry's 16-warp chunks of 16384 left the last chunk part-empty. ci/cfg_exp.py on
#: the H200, kernel time, % of copy, e4m3 delayed, the 32K entry -> this (NOTES Q91, Q94;
#: h200_cfg_exp_s61_q91.log, h200_cfg_exp_s61_q94.log): RMSNorm 18432 / 20480 / 24576 / 28672
#: 53.6 / 57.0 / 64.5 / 73.2 -> 73.3 / 77.2 / 82.4 / 75.1, LayerNorm 46.4 / 49.5 / 56.0 / 64.3 ->
#: 62.5 / 65.3 / 74.0 / 63.1. At 32K itself the entry's own config wins (Q93). Not measured on an
#: H100; {}: off (profile_kernels.py --triton-fp8-between 0).
FWD_FP8_BETWEEN = {32768: NormConfig(1, 8192, True, 8, 8, 2)}


@functools.lru_cache(maxsize=None)
def fwd_config(n: int, dtype: torch.dtype, transpose: bool, fp8: bool = False,
               rms: bool = True, residual: bool = False, lean: bool = False) -> NormConfig:
    """Forward config for rows of ``n`` elements of ``dtype``: :func:`table_fwd_config`, its
    chunks filled by :data:`FWD_CHUNK_FILL` (:func:`fill_chunks`) for the 16-bit and fp32
    outputs; the FP8 outputs without a residual at widths between the powers of two take
    :data:`FWD_FP8_BETWEEN`'s entry; the transposed tiles keep the tables' configs."""
    cfg = table_fwd_config(n, dtype, transpose, fp8, rms, residual, lean)
    p2 = triton.next_power_of_2(n)
    if fp8 and not transpose and not residual and n != p2 and p2 in FWD_FP8_BETWEEN:
        return FWD_FP8_BETWEEN[p2]
    return cfg if transpose or fp8 or not FWD_CHUNK_FILL else fill_chunks(cfg, n, FWD_CHUNK_FILL)


def table_fwd_config(n: int, dtype: torch.dtype, transpose: bool, fp8: bool = False,
                     rms: bool = True, residual: bool = False, lean: bool = False) -> NormConfig:
    """Forward config for rows of ``n`` elements of ``dtype`` (from the measured tables above).

    ``transpose``: the FP8 transposed copy is written by the norm kernel, so a tile is
    ``TRANSPOSE_BLOCK_M`` rows by column chunks (the row tile's statistics come first).
    ``fp8``: the output is FP8 (rowwise); ``rms``: RMSNorm (False: LayerNorm); ``residual``: a
    residual is added (and residual_out written) in the kernel. ``lean``: the device is a lean
    card (:func:`engine.triton_kernels.utils.lean_dram`), whose own entries come first.
    """
    if transpose:
        bn = min(TRANSPOSE_BLOCK_N, triton.next_power_of_2(n))
        return NormConfig(TRANSPOSE_BLOCK_M, bn, n > bn, TRANSPOSE_WARPS, 4)
    p2 = triton.next_power_of_2(n)
    lean_entry = _FWD_OVERRIDES_LEAN[(rms, fp8)].get(p2) if lean and not residual else None
    if lean_entry is not None:
        return lean_entry
    prefetch_entry = None if residual else _FWD_PREFETCH_OVERRIDES[(rms, fp8)].get(p2)
    if prefetch_entry is not None:
        return prefetch_entry
    if fp8:  # LayerNorm: its own entries first, then the RMSNorm FP8 ones (4K: 2 % off its best)
        override = (None if rms else _LN_FWD_FP8_OVERRIDES.get(p2)) or _FWD_FP8_OVERRIDES.get(p2)
    else:
        override = (((lean and _RES_FWD_OVERRIDES_LEAN[rms].get(p2)) or _RES_FWD_OVERRIDES[rms].get(p2)
                     if residual else None)
                    or (None if rms else _LN_FWD_OVERRIDES.get(p2)))
    if override is not None:
        return override
    if p2 in _FWD_BLOCKED_TABLE:
        return _FWD_BLOCKED_TABLE[p2]
    if p2 > MAX_FUSED_N:
        return _FWD_BLOCKED
    bm, w, p = _FWD_TABLE[p2] if p2 >= 1024 else _small_rows(p2, _FWD_TABLE)
    return NormConfig(bm, p2, False, w, p)


#: The backward at widths between the powers of two, N in (p2 / 2, 3 p2 / 4] (p2 = next_pow2(N)):
#: a head of p2 / 2 columns and a tail tile of the rest (NormConfig.tail), whose lanes N fills
#: (5120 = 4096 + 1024, 6144, 10240, 12288 exactly) where the p2 tile left 1/4-3/8 masked; by
#: (RMSNorm, head). tune.py --kinds tail on the H200, the backward alone (% of copy, the heuristic
#: before -> this entry; h200_tune_tail_s61.log, NOTES P190): RMSNorm 10240 / 12288 49.7 / 53.7 ->
#: 57.5 / 61.9 (register tile); LayerNorm 5120 / 6144 50.8 / 58.0 -> 59.3 / 63.4 (one blocked
#: chunk and the tail), 10240 / 12288 46.7 / 54.9 (the split kernel) -> 52.9 / 56.4. In the f+b
#: rows (kernel time, the table's metric; h200_knob_s61_tail.log, NOTES P190b): RMSNorm 10240 /
#: 12288 +7.5 / +8.0, LayerNorm 5120-12288 +2.2 to +6.1. RMSNorm 5120 / 6144 keep the 2 x 8192
#: tile: the register tail tile (1x4096+t w8 p2 s4, tune's 1.2x) lost 1.4 / 2.9 in kernel time.
#: From 16K the split kernel keeps the rows (the tail tiles lost there in tune: 18432, 24576).
#: False: off (profile_kernels.py --triton-bwd-tail 0).
BWD_TAIL = True
_BWD_TAIL_TABLE = {
    (True, 8192): NormConfig(1, 8192, False, 16, 1, 4, tail=True),
    (False, 4096): NormConfig(1, 4096, True, 8, 2, 4, tail=True),
    (False, 8192): NormConfig(1, 8192, True, 16, 1, 2, tail=True),
}


@functools.lru_cache(maxsize=None)
def bwd_config(n: int, dtype: torch.dtype, rms: bool = True) -> NormConfig:
    """Backward config (from the measured tables above); ``rms``: RMSNorm (False: LayerNorm)."""
    p2 = triton.next_power_of_2(n)
    if BWD_TAIL and 4 * n <= 3 * p2 and (rms, p2 // 2) in _BWD_TAIL_TABLE:
        return _BWD_TAIL_TABLE[(rms, p2 // 2)]
    if p2 >= (SPLIT_BWD_FROM if rms else LN_SPLIT_BWD_FROM):
        return _SPLIT
    if not rms and p2 in _LN_BWD_OVERRIDES:
        return _LN_BWD_OVERRIDES[p2]
    if rms and p2 in _RMS_BWD_OVERRIDES:
        return _RMS_BWD_OVERRIDES[p2]
    if p2 in _BWD_BLOCKED_TABLE:
        return _BWD_BLOCKED_TABLE[p2]
    if p2 > MAX_FUSED_N_BWD:
        return BWD_BLOCKED
    bm, w, p = _BWD_TABLE[p2] if p2 >= 1024 else _small_rows(p2, _BWD_TABLE)
    return NormConfig(bm, p2, False, w, p)


@triton.jit
def _partials_reduce_kernel(
    PART,  # [K, P, N] fp32 partials: K sets (dW, and dB when K = 2), one row per backward program
    OUT,  # [N] result of set 0, in OUT's dtype
    OUT2,  # [N] result of set 1 (K = 2), or OUT
    P,  # number of partial rows per set
    N,  # columns
    BLOCK_P: tl.constexpr,  # partial rows summed per step
    BLOCK_N: tl.constexpr,  # columns per program
    INTERPRETER: tl.constexpr,  # interpreter-only rounding workaround (utils._cast)
):
    """OUT[n] = sum_p PART[0, p, n] (and OUT2 from PART[1]; program_id(1) picks the set), in a
    fixed order: deterministic, no atomics. One launch reduces dW and dB together. The programs
    of a set stride over its column blocks (one block each unless an sm_margin cut the grid:
    reduce_partials); a block's sum does not depend on which program takes it."""
    k = tl.program_id(1)
    base = PART + tl.cast(k, tl.int64) * P * N
    for cb in range(tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.num_programs(0)):
        cols = cb * BLOCK_N + tl.arange(0, BLOCK_N)
        cmask = cols < N
        acc = tl.zeros([BLOCK_P, BLOCK_N], dtype=tl.float32)
        for p0 in range(0, P, BLOCK_P):
            rows = p0 + tl.arange(0, BLOCK_P)
            m = (rows[:, None] < P) & cmask[None, :]
            acc += tl.load(base + tl.cast(rows, tl.int64)[:, None] * N + cols[None, :], mask=m, other=0.0)
        total = tl.sum(acc, axis=0)
        if k == 0:
            tl.store(OUT + cols, _cast(total, OUT.dtype.element_ty, INTERPRETER), mask=cmask)
        else:
            tl.store(OUT2 + cols, _cast(total, OUT2.dtype.element_ty, INTERPRETER), mask=cmask)


#: Columns per program of the partial-sum reduction: the GPU wants many programs, the interpreter
#: pays per program (wide column blocks on CPU tensors). On the GPU, rule 0's fixed block
#: (REDUCE_SPREAD); the other rules size their blocks by :data:`REDUCE_RULES`.
REDUCE_BLOCK_N = {"cuda": 128, "interpreter": 4096}
#: The narrowest column block of the spread reduction: 16 fp32 columns, two 32-byte sectors per
#: partial row.
REDUCE_MIN_BLOCK_N = 16
#: Values per program and step of the reduction (BLOCK_P * BLOCK_N): 4096, 32 per thread at 4 warps.
REDUCE_TILE = 4096
#: The reduction's tile rule (benchmarks/NOTES.md P168, P170): 0 the fixed 128 x 32 tile (before
#: P168); 1 (P168) column blocks narrowed from 128 (down to REDUCE_MIN_BLOCK_N) until the grid
#: covers the SMs, at least 32 rows per step. At N = 1K the backward's 528 partial rows per set
#: were summed by 16 programs (8 column blocks x dW and dB), each walking 17 dependent steps of 32
#: rows; blocks of 16 columns and 256 rows per step give 128 programs of 3 steps. 2 (P170, the
#: default): column blocks from 1024 down until the grid covers twice the SMs, and any number of
#: rows per step (the split backward leaves 8-66 partial rows, which 32-row steps mostly mask:
#: LayerNorm 128K's reduction 7.6 -> 2.2 us). Kernel time of the Triton fwd + bwd rows on the H200
#: (% of copy, two alternations each): rule 0 -> 1, LayerNorm 1K 79.6-79.9 -> 84.0-84.2, RMSNorm
#: 1K 88.2-88.9 -> 93.6-93.8, 2K-8K +0.5-2.5; rule 1 -> 2, LayerNorm 128K 69.7-69.8 -> 71.2-71.3,
#: RMSNorm 128K 74.6-74.7 -> 75.3, LayerNorm 8K +0.6, the rest within 0.4.
REDUCE_SPREAD = 2
#: The spread rules' constants: (widest column block, SMs the grid must cover x, fewest rows per step).
REDUCE_RULES = {1: (128, 1, 32), 2: (1024, 2, 1)}


def reduce_tile(k: int, p: int, n: int, sms: int, spread: int = 2) -> tuple:
    """(BLOCK_N, BLOCK_P) of the GPU reduction of K sets of P partial rows of N columns on ``sms``
    SMs under rule ``spread`` (:data:`REDUCE_SPREAD`, :data:`REDUCE_RULES`): the widest column
    block (from the rule's widest down to REDUCE_MIN_BLOCK_N) whose grid of ceil(N / BLOCK_N) * K
    programs still covers the rule's multiple of the SMs, and BLOCK_P rows per step so that a step
    loads REDUCE_TILE values, no more rows than the next power of two of P and no fewer than the
    rule's fewest; rule 0, the fixed 128 x 32. Each tile sums the partials in its own fixed order:
    the result is deterministic for a given (K, P, N) and SM count."""
    if not spread:
        return REDUCE_BLOCK_N["cuda"], 32
    block_n, cover, min_p = REDUCE_RULES[spread]
    while block_n > REDUCE_MIN_BLOCK_N and -(-n // block_n) * k < cover * sms:
        block_n //= 2
    return block_n, max(min_p, min(REDUCE_TILE // block_n, triton.next_power_of_2(p)))


def _reduce_tile(part: torch.Tensor) -> tuple:
    """(BLOCK_N, BLOCK_P) for ``part`` ([K, P, N]): :func:`reduce_tile` on the GPU, one wide
    column block per set under the interpreter."""
    if not part.is_cuda:
        return REDUCE_BLOCK_N["interpreter"], 32
    return reduce_tile(*part.shape, sm_count(part.device), REDUCE_SPREAD)


def reduce_partials(part: torch.Tensor, out: torch.Tensor, out2=None, sm_margin: int = 0) -> None:
    """``out[:] = part[0].sum(0)`` and, when ``out2`` is given, ``out2[:] = part[1].sum(0)``
    (fp32 accumulation, fixed order), cast to the outputs' dtypes, in one launch. ``part`` is
    ``[K, P, N]`` with K = 2 when ``out2`` is given, else K = 1. Under an ``sm_margin`` (on the
    GPU) the grid holds no more programs than SMs - sm_margin hold at once (utils.margin_grid,
    split between the sets), the programs striding over the column blocks: the same bits."""
    k, p, n = part.shape
    if k != (2 if out2 is not None else 1):
        raise ValueError(f"reduce_partials: {k} partial sets for {1 if out2 is None else 2} outputs")
    block_n, block_p = _reduce_tile(part)
    tensors, scalars = (part, out, out2 if out2 is not None else out), (p, n)
    constexprs = _reduce_constexprs(block_n, block_p, interpreter_rounding())
    blocks = -(-n // block_n)
    if sm_margin:
        blocks = max(1, margin_grid(blocks * k, sm_margin, part.device, _REDUCE,
                                    [(tensors, scalars, 4, 3, constexprs)]) // k)
    _REDUCE.launch((blocks, k), tensors, scalars, 4, 3, constexprs)


@functools.lru_cache(maxsize=None)
def _reduce_constexprs(block_n: int, block_p: int, interpreter: bool) -> tuple:
    """The reduction's constexpr tuple (Launcher.launch), built once per combination."""
    return _REDUCE.constexprs(BLOCK_P=block_p, BLOCK_N=block_n, INTERPRETER=interpreter)


_REDUCE = Launcher(_partials_reduce_kernel)
