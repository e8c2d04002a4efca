/*
 * Norm forward launchers: configuration of the register / cluster / blocked paths from (cols,
 * dtypes, alignment) and the per-dtype dispatch called by norm_fwd_{f32,f16,bf16,fp8_x*}.cu. The
 * kernels are in norm_fwd.cuh.
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_LAUNCH_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_LAUNCH_CUH_

#include <type_traits>

#include "normalization/norm_fwd.cuh"
#include "normalization/norm_fwd_band.cuh"
#include "normalization/norm_fwd_fp8_lean.cuh"
#include "normalization/norm_fwd_lean.cuh"
#include "normalization/norm_fwd_stream.cuh"

namespace engine {
namespace norm {

/* CTAs per SM of the register path's grid without a cluster (under an sm_margin at most the
 * resident ones: grid_per_sm): engine_set_norm_fwd_grid_per_sm's
 * value where it is set; else 16 for a 16-bit or fp32 output without a residual (both norms), and
 * 0 (the resident CTAs, 3-4 per SM: a persistent grid) for the rest. 16 CTAs per SM queue for the
 * block scheduler, which starts each as another ends. Measured on the H200 with bf16 in and out
 * (benchmarks/NOTES.md, P46; kernel time, % of copy, two runs each, resident -> 16 per SM; fp16
 * and fp32 outputs not measured, taken alike): RMSNorm bf16 fwd 1K-16K
 * 90 / 88 / 85 / 84 / 83 -> 92 / 92 / 91 / 88 / 87; but the FP8 outputs lost 1-9 points (RMSNorm
 * e4m3 8K 88 -> 82, LayerNorm e4m3 2K 80 -> 72), the fused residual add 0-6 (RMSNorm 8K 87 -> 81)
 * and LayerNorm all but 2K (4K 85 -> 82; 2K 83 -> 88), so they keep the persistent grid. ncu (Q2):
 * 16 CTAs per SM run each CTA's prologue and epilogue 5x as often, 10-17 % more instructions,
 * which the FP8 kernels (63-69 % issue active) pay for and the bf16 one (43 %) does not. After
 * LayerNorm's one-pass statistics (P80) its 16-bit forward gained at every register width too
 * (P82, two alternations: 1K-8K 89.2 / 84.9 / 84.4 / 81.7 -> 90.0 / 90.3 / 85.4 / 83.7), its FP8
 * outputs and residual rows still lost (e4m3 2K 84.8 -> 75.6, + residual 4K 86.2 -> 82.3).
 * Rows of up to 1K take 32 per SM (H200, two alternations, kernel time; P166: LayerNorm 1K 16 ->
 * 24 -> 32 per SM 89.2-89.4 -> 89.7-89.9 -> 90.4-90.8, 2K lost with either, 90.3 -> 87.2-88.5;
 * P167: RMSNorm 1K 91.5-91.7 -> 93.7-93.8 at 32; rows under 1K, not in the table, taken alike). */
template <typename O>
int fwd_grid_per_sm(const FwdArgs& a, const LaunchCtx& ctx) {
  if (ctx.fwd_grid_per_sm != 0) return ctx.fwd_grid_per_sm;
  if (is_fp8_v<O> || a.residual != nullptr) return 0;
  return a.cols <= 1024 ? 32 : 16;
}

/* Launch the register-path kernel for a configured FwdArgs (tpr, rows_per_iter, tile fields):
 * the fast row loop (FwdPath) for FP8 outputs in mode kFull in blocks of up to 256 threads, with
 * gamma / beta in shared memory where they fit (gb_smem_offset) or from global memory, the general
 * loop otherwise. */
template <typename X, typename R, typename O, typename W, bool kRms, bool kBias, int NV>
engine_status launch_fwd_reg(FwdArgs a, const LaunchCtx& ctx, int block, size_t smem) {
  auto* narrow = &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, 256, kPathGeneral>;
  auto* wide = &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, kMaxRowThreads, kPathGeneral>;
  /* The fast loop reading gamma / beta from global memory holds a slot's loads in registers:
   * 64 bytes of them (fp32 gamma and beta of 8 values, 16-bit x) spilled at the 80-register cap
   * (ptxas), so those builds keep the general loop there; 32 bytes do not spill. */
  constexpr bool kGlobalFast = (16 / sizeof(X)) * sizeof(W) * (kBias ? 2 : 1) <= 32;
  decltype(narrow) fast_smem = nullptr, fast_global = nullptr;
  if constexpr (is_fp8_v<O>) {
    if (a.mode == kFull && block <= kClusterRowThreads && !ctx.fwd_general) {
      fast_smem = a.e5m2 ? &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, 256, kPathE5M2Smem>
                         : &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, 256, kPathE4M3Smem>;
      if constexpr (kGlobalFast) {
        fast_global =
            a.e5m2 ? &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, 256, kPathE5M2Global>
                   : &norm_fwd_reg_kernel<X, R, O, W, kRms, kBias, NV, 256, kPathE4M3Global>;
      }
    }
  }
  /* gamma (+ g_add) and beta as fp32 in shared memory after the transposed tile, where
   * gb_smem_offset allows (no CTA fewer per SM, at most half the SM's shared memory), asked of
   * the kernel that will run with them. */
  const void* fn = reinterpret_cast<const void*>(
      fast_smem != nullptr ? fast_smem : (block <= kClusterRowThreads ? narrow : wide));
  const size_t gb = (size_t)gb_floats(NV, a.tpr, 16 / sizeof(X)) * sizeof(float) * (kBias ? 2 : 1);
  ENGINE_TRY(gb_smem_offset(fn, block, a.cluster, gb, ctx, &smem, &a.gb_off));
  if (fast_smem != nullptr && a.gb_off >= 0) {
    narrow = fast_smem;
  } else if (fast_global != nullptr) {
    narrow = fast_global;
  }
  const int64_t work = ceil_div(a.rows, a.tile_rows > 0 ? a.tile_rows : a.rows_per_iter);
  int64_t grid = 0;
  return launch_row_kernel(narrow, wide, a, block, smem, work, ctx, 0, work, &grid,
                           "norm_fwd_reg_kernel", a.cluster > 1 ? 0 : fwd_grid_per_sm<O>(a, ctx));
}

/* The weight type: float, or x's 16-bit dtype (norm_api's check); with fp32 x, either 16-bit
 * dtype (the kApply pass of current scaling reads an fp32 residual stream as x, with the weights
 * of the 16-bit x it came from). */
template <typename X, typename R, typename O, bool kRms, bool kBias, int NV>
engine_status launch_fwd_reg_w(const FwdArgs& a, const LaunchCtx& ctx, int block, size_t smem) {
  if (a.w_dtype == ENGINE_DTYPE_FLOAT32) {
    return launch_fwd_reg<X, R, O, float, kRms, kBias, NV>(a, ctx, block, smem);
  }
  if constexpr (sizeof(X) == 2) {
    return launch_fwd_reg<X, R, O, X, kRms, kBias, NV>(a, ctx, block, smem);
  } else if constexpr (is_fp8_v<O>) { /* 16-bit weights with fp32 x: only the kApply pass */
    return a.w_dtype == ENGINE_DTYPE_BFLOAT16
               ? launch_fwd_reg<X, R, O, __nv_bfloat16, kRms, kBias, NV>(a, ctx, block, smem)
               : launch_fwd_reg<X, R, O, __half, kRms, kBias, NV>(a, ctx, block, smem);
  } else {
    return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                     "norm forward: %s weights with float32 x", dtype_name(a.w_dtype));
  }
}

/* Compile-time norm kind: (RMSNorm or LayerNorm) x (bias or not). */
template <typename X, typename R, typename O, int NV>
engine_status launch_fwd_reg_k(const FwdArgs& a, const LaunchCtx& ctx, int block, size_t smem) {
  const bool bias = a.bias != nullptr;
  if (a.is_rms) {
    return bias ? launch_fwd_reg_w<X, R, O, true, true, NV>(a, ctx, block, smem)
                : launch_fwd_reg_w<X, R, O, true, false, NV>(a, ctx, block, smem);
  }
  return bias ? launch_fwd_reg_w<X, R, O, false, true, NV>(a, ctx, block, smem)
              : launch_fwd_reg_w<X, R, O, false, false, NV>(a, ctx, block, smem);
}

/* With out_t_auto, the widest row whose transposed copy the register path's tile writes. */
constexpr int kTileAutoMaxCols = 1024;

/* Register path, one row over one CTA: NV vectors of x per thread in row groups
 * (row_group_tpr, row_groups_per_cta); with an FP8 output and out_t, the transposed tile when it
 * fits shared memory (*transposed). */
template <typename X, typename R, typename O, int NV>
engine_status launch_fwd_rows(FwdArgs a, const LaunchCtx& ctx, bool* transposed) {
  constexpr int VEC = 16 / sizeof(X);
  constexpr bool kFp8 = is_fp8_v<O>;
  const int cols = a.cols;
  const int tpr_raw = (cols / VEC + NV - 1) / NV;
  const int tpr = row_group_tpr(tpr_raw);
  const int G = row_groups_per_cta(tpr);
  const int block = tpr * G;
  a.tpr = tpr;
  a.rows_per_iter = G;
  a.tile_rows = 0;
  a.tile_pitch = 0;
  a.t_vec16 = 0;
  size_t smem = 0;
  /* out_t_auto: the tile only where it beat the tiled transpose after the norm (rows of up to
   * kTileAutoMaxCols; H200, NOTES P76 / P77: 1K 75 against 69 %, 2K 61 against 68, 4K-8K 30 against
   * 67, 16-row tiles there) */
  if (kFp8 && a.out_t != nullptr && a.mode != kStats && (a.t_auto == 0 || cols <= kTileAutoMaxCols)) {
    /* Tile of T rows x cols bytes; T = 32 gives whole 32-byte sectors per output column run,
     * 16 halves the tile for wide rows; beyond that the caller transposes `out` afterwards. */
    const int64_t budget = (int64_t)ctx.max_smem_optin - 1024; /* static smem of the kernel */
    const int pitch = (int)round_up(cols, 16) + 16;
    int T = G > 32 ? G : 32;
    /* Prefer two resident CTAs per SM over full-sector runs. */
    if ((int64_t)T * pitch > budget || 2 * ((int64_t)T * pitch + 1024) > ctx.smem_per_sm) {
      T = G > 16 ? G : 16;
    }
    if ((int64_t)T * pitch <= budget) {
      a.tile_rows = T;
      a.tile_pitch = pitch;
      a.t_vec16 = (ptr_aligned(a.out_t, 16) && a.rows % 16 == 0) ? 1 : 0;
      smem = (size_t)T * pitch;
      *transposed = true;
    }
  }
  if (!*transposed) a.out_t = nullptr;
  return launch_fwd_reg_k<X, R, O, NV>(a, ctx, block, smem);
}

/* Rows per SM up to which a row of more than 1K takes 4 vectors per thread (fwd_vectors): bf16,
 * and fp16 (kFewRowsPerSmF16; engine.cuda_backend.FEW_ROWS_PER_SM and FEW_ROWS_PER_SM_FP16 say
 * the same to Python). */
constexpr int kFewRowsPerSm = 8;
constexpr int kFewRowsPerSmF16 = 1;

/* Vectors of x per thread on the register path without a cluster: fwd_reg_nv, or for a 16-bit z
 * the requested count (engine_set_norm_fwd_vectors) where its row group fits 256 threads. The
 * default (want = 0) for a bf16 z: 4 where that makes a row one warp (64 < nvec <= 128, bf16 rows
 * of 520-1024), and for wider rows where the rows are few (at most kFewRowsPerSm per SM the
 * launch may use: `rows`, `sms`); 8 elsewhere. Measured on the H200 (benchmarks/NOTES.md, P6;
 * kernel time, % of copy, 64M values): at 1K, 4 vectors gave RMSNorm 88.9 against 86.6 and
 * LayerNorm 89.0 against 85.0 (FP8 out equal); at 2K-8K, where 4 vectors need a row reduction
 * across warps, they lost 1-9 points against 8 (FP8 and LayerNorm most); 2 vectors (since
 * removed) lost everywhere. With few rows the kernel's time is one CTA's instruction stream, not
 * the bandwidth (ncu, NOTES Q35): 4 vectors halve each warp's values and double the CTAs, and at M
 * = 32-512 took 2K-8K rows 8-27 % faster (32 x 4096 RMSNorm 4.0 -> 3.1 us, LayerNorm 4.7 -> 3.5;
 * NOTES Q36, P146), at M = 1024 2-19 % faster in 7 of 12 cells and up to 2.3 % slower in 3 (Q37,
 * P147); from 2048 rows they win or lose by width (RMSNorm e4m3 8K: 6-14 % slower). A row's
 * statistics then depend on whether its call had few rows (their sums added in another order:
 * equal within rounding, not in bits).
 * An fp16 z takes 4 only in calls of at most kFewRowsPerSmF16 (1) row per SM: at 32 and 128 rows
 * they were 10-28 % faster than 8 at 2K-8K, at 512-2048 rows up to 32 % slower (H200, NOTES Q42;
 * its 4-vector build runs 3 CTAs per SM where bf16's runs 4: fwd_min_blocks). Rows of 520-1024
 * fp16 values keep 8 (P6 measured bf16 only). */
template <typename X, typename R>
int fwd_vectors(int nvec, int want, int64_t rows, int sms) {
  constexpr int NV = fwd_reg_nv<X, R>();
  if (sizeof(R) != 2) return NV;
  if (want <= 0) {
    constexpr bool kBf16 = std::is_same<R, __nv_bfloat16>::value;
    const int64_t per_sm = kBf16 ? kFewRowsPerSm : kFewRowsPerSmF16;
    const bool few = rows <= per_sm * (sms > 1 ? sms : 1);
    want = ((kBf16 && nvec > 64 && (nvec <= 128 || few)) || (!kBf16 && nvec > 128 && few)) ? 4 : NV;
  }
  return ceil_div(nvec, want) <= kClusterRowThreads ? want : NV;
}

/* Whether the register path's rows at 8 vectors per thread go to the lean kernel
 * (norm_fwd_lean.cuh: the same bits, measured faster; NOTES P150, P154): a 16-bit x without a
 * residual (the caller's types), mode kFull, no in-kernel transposed copy, rows of the widths
 * fwd_lean_cols gives, unless engine_set_norm_fwd_lean(1) or the general-loop knob says
 * otherwise. Rows of 32768 (one 512-thread CTA per row, or a cluster of two 256-thread CTAs:
 * fwd_lean_cluster; before the stream and the clusters) only where neither the stream's nor the
 * blocked kernel's knob is set, so that those knobs still reach their kernels. */
inline bool fwd_lean_applies(const FwdArgs& a, const LaunchCtx& ctx) {
  return ctx.fwd_lean != 1 && !ctx.fwd_general && a.residual == nullptr && a.mode == kFull &&
         a.out_t == nullptr && fwd_lean_cols(a.cols, ctx.fwd_lean, a.is_rms != 0, ctx.lean_dram != 0) &&
         (a.cols != 32768 || (ctx.fwd_stream_from == 0 && ctx.fwd_blocked_from == 0));
}

/* One launch of the blocked kernel: VEC elements per access (16 bytes of x, or 1 on the scalar
 * path), NVB accesses per thread and chunk, one weight type and norm kind (kNorm: norm_fwd.cuh,
 * blk_kind / kBlkRuntime); a persistent grid at the build's occupancy. */
template <typename X, typename R, typename O, int VEC, int NVB, typename W, int kNorm>
engine_status launch_fwd_blocked(const FwdArgs& a, const LaunchCtx& ctx, int block, int per_sm_set = 0) {
  auto* kernel = &norm_fwd_blocked_kernel<X, R, O, VEC, NVB, W, kNorm>;
  int per_sm = 1;
  ENGINE_TRY(blocks_per_sm(reinterpret_cast<const void*>(kernel), block, 0, &per_sm));
  /* past residency (not under an sm_margin): the row loop strides by the grid */
  per_sm = grid_per_sm(per_sm, per_sm_set, ctx.sm_margin);
  const int64_t grid = persistent_grid(a.rows, ctx.sm_count, ctx.sm_margin, per_sm);
  kernel<<<(unsigned)grid, block, 0, ctx.stream>>>(a);
  ENGINE_CHECK_LAUNCH(VEC > 1 ? "norm_fwd_blocked_kernel" : "norm_fwd_blocked_kernel(scalar)");
  return ENGINE_SUCCESS;
}

/* The blocked kernel's default shape on the rows with a fused residual add of a 16-bit x to a
 * non-FP8 output (its default rows at 2K-16K; engine_set_norm_fwd_blocked_shape's codes): 2 two
 * vectors per thread on the resident grid to 2K, 3 two vectors on 32 CTAs per SM to 4K (and at
 * RMSNorm 8K), 4 four vectors on 32 CTAs per SM at LayerNorm 8K and at 16K, 1 (four vectors on
 * the resident grid) past 16K. Kernel time on the H200, % of copy, two alternations, 1 -> this
 * shape (NOTES P162, h200_knob_s51_p162.log): RMSNorm 2K / 4K / 8K / 16K 92.6-92.8 / 90.9-91.2 /
 * 90.5-91.1 / 90.4-91.6 -> 94.6-94.7 / 92.8-92.9 / 94.9-95.1 / 95.0-95.3, LayerNorm 90.6-91.0 /
 * 89.4-89.9 / 89.4-89.7 / 88.9-89.5 -> 91.8-92.0 / 92.4-92.8 / 92.7-92.9 / 94.3. (Likely why the
 * grid past residency helps, not measured: a new CTA's loads start as another finishes, where a
 * resident CTA's next row waits on its last row's reductions.) The H100 is not measured. */
constexpr int fwd_blocked_res_shape(int cols, bool rms) {
  return cols <= 2048 ? 2 : cols <= 4096 ? 3 : cols <= 8192 ? (rms ? 3 : 4) : cols <= 16384 ? 4 : 1;
}

/* The vector blocked kernel: 4 vectors of 16 bytes per thread and chunk; CTAs sized to the row
 * (whole warps, one chunk per row) up to 512 threads, so that a row narrower than 512 x 4 vectors
 * (16K of a 16-bit x) leaves no thread idle and more CTAs share an SM (NOTES P91: the knob's rows
 * of 2K-8K, where 512-thread CTAs ran 3/4 of their threads masked). Rows of 16K and more: 512
 * (one CTA of 1024 threads per SM lost 7-17 points at 32K: NOTES P95). */
template <typename X, typename R, typename O, typename W, int kNorm>
engine_status launch_fwd_blocked_vec(const FwdArgs& a, const LaunchCtx& ctx) {
  constexpr int VEC = 16 / sizeof(X);
  constexpr int NVB = 4;
  /* P162: the residual rows of a 16-bit x to a non-FP8 output in the shape fwd_blocked_res_shape
   * picks by width (engine_set_norm_fwd_blocked_shape sets one for A/B runs): 2 vectors per
   * thread (rows of one chunk of up to 512 threads) and / or a grid of 32 CTAs per SM */
  int per_sm_set = 0;
  if constexpr (sizeof(X) == 2 && std::is_same<X, R>::value && !is_fp8_v<O> && kNorm != kBlkRuntime) {
    int shape = a.residual != nullptr ? ctx.fwd_blocked_shape : 1;
    if (shape == 0) shape = fwd_blocked_res_shape(a.cols, (kNorm & 1) != 0);
    per_sm_set = shape == 3 || shape == 4 ? 32 : 0; /* resident under an sm_margin: grid_per_sm */
    if ((shape == 2 || shape == 3) && a.cols <= kMaxRowThreads * VEC * 2) {
      const int block = (int)round_up(ceil_div(a.cols, VEC * 2), 32);
      return launch_fwd_blocked<X, R, O, VEC, 2, W, kNorm>(a, ctx, block, per_sm_set);
    }
  }
  const int want = (int)round_up(ceil_div(a.cols, VEC * NVB), 32);
  const int block = want < kMaxRowThreads ? want : kMaxRowThreads;
  return launch_fwd_blocked<X, R, O, VEC, NVB, W, kNorm>(a, ctx, block, per_sm_set);
}

template <typename X, typename R, typename O, typename W>
engine_status launch_fwd_blocked_k(const FwdArgs& a, const LaunchCtx& ctx) {
  const bool bias = a.bias != nullptr;
  if (a.is_rms) {
    return bias ? launch_fwd_blocked_vec<X, R, O, W, blk_kind(true, true)>(a, ctx)
                : launch_fwd_blocked_vec<X, R, O, W, blk_kind(true, false)>(a, ctx);
  }
  return bias ? launch_fwd_blocked_vec<X, R, O, W, blk_kind(false, true)>(a, ctx)
              : launch_fwd_blocked_vec<X, R, O, W, blk_kind(false, false)>(a, ctx);
}

/* The vector blocked kernel: the norm kind, bias and weight type at compile time where z has x's
 * dtype (the packed builds) and the weights are fp32 or x's dtype; the run-time build otherwise
 * (an fp32 residual stream under 16-bit x; fp32 x with 16-bit weights, current scaling's apply
 * pass). */
template <typename X, typename R, typename O>
engine_status launch_fwd_blocked_w(const FwdArgs& a, const LaunchCtx& ctx) {
  if constexpr (fwd_blocked_packed<X, R, 16 / sizeof(X)>()) {
    if (a.w_dtype == ENGINE_DTYPE_FLOAT32) return launch_fwd_blocked_k<X, R, O, float>(a, ctx);
    if constexpr (sizeof(X) == 2) return launch_fwd_blocked_k<X, R, O, X>(a, ctx);
  }
  return launch_fwd_blocked_vec<X, R, O, float, kBlkRuntime>(a, ctx);
}

/* Whether the forward takes the blocked kernel over the register path or a cluster (where x and z
 * share a dtype and allow 16-byte vectors): from engine_set_norm_fwd_blocked_from's width where
 * it is set, else by the widths where it measured faster on the H200 (benchmarks/NOTES.md, P44,
 * P45, P53 and P91; kernel time, % of copy, register path / clusters -> blocked):
 *   - the fused residual add of a 16-bit x to a 16-bit or fp32 output at 2K-8K (P91, CTAs sized
 *     to the row, means of two alternations): RMSNorm 2K / 4K / 8K 89.5 / 88.7 / 86.5 -> 91.2 /
 *     89.4 / 90.0, LayerNorm 88.5 / 86.2 / 83.5 -> 90.8 / 90.0 / 86.8; and at 16K, the widest
 *     row of one chunk (512 threads), no longer a tie with the streamed kernel since the
 *     one-chunk rows' vector store (P124): P130, kernel time, two alternations, stream ->
 *     blocked, H100 RMSNorm 92.0-92.1 -> 93.6-93.8, LayerNorm 89.8-90.0 -> 92.2-92.3, H200
 *     86.0-86.1 -> 90.4-90.5, 82.1-82.2 -> 88.5-89.2. Rows past 16K and under 32K (two chunks)
 *     keep the stream. Not to an FP8 output: the blocked kernel's general FP8
 *     epilogue lost 14-23 points there to the register kernel's fast FP8 loop (P91: RMSNorm e4m3
 *     89.6 -> 75.8 at 2K), so at 2K-8K an FP8 output with a residual is within one FP8 step of
 *     the cast of the same call's fp32 output (another order of the row's sums), not its exact
 *     cast (tests/test_fp8.py::same_row_sums);
 *   - the fused residual add from 32K (pass 1 writes residual_out, pass 2 re-reads it from L2):
 *     RMSNorm 32K / 64K / 128K 70 / 68 / 65 -> 82 / 75 / 75, LayerNorm 65 / 61 / 57 -> 73 / 69
 *     / 71 with the clusters' old barrier per row; with their st.async exchange (P53) the
 *     clusters read 80 / 74 / 72 and 75 / 67 / 60 (not measured in the same call as the blocked
 *     rows: kept); the streamed kernel takes these rows first (from 16K, P89 / P90) on sm_90;
 *   - an RMSNorm FP8 output without a residual at 4K-16K on a lean card (`lean`: lean_dram, the
 *     H100; P100 / P102, A/B against a1ce5ee and knob runs, two alternations each, kernel time,
 *     e4m3 delayed scaling, register path -> blocked: 4K / 8K / 16K 87.8 / 87.1 / 86.9 -> 90.7 /
 *     90.4 / 87.3; the stream took 16K before, 83.6; current scaling and the transposed copy
 *     within 1; at 32K the stream wins). There an FP8 output is within one FP8 step of the fp32
 *     output's cast (tests/test_fp8.py::cuda_fp8_own_path). On the H200 the blocked kernel lost
 *     10-14 points there (NOTES P116, two alternations, blocked -> register path / stream at 16K:
 *     4K / 8K / 16K 77.1-77.9 / 72.6-73.6 / 68.4-69.1 -> 88.1-88.5 / 86.7-88.1 / 82.1-82.4,
 *     current scaling +2.5-4.3, + T 16K +6.3), so another card keeps the register path and the
 *     stream there. Not LayerNorm's: its register path beat the
 *     blocked kernel at 8K (85.9 against 83.2) and the stream at 16K (84.4 against 76.8; P102);
 *   - never another output without a residual: RMSNorm 32K took the blocked kernel while the
 *     cluster's barrier per row cost it (bf16 out 75 -> 78), and the st.async exchange turned
 *     that round (P53, one call: clusters 81.3 / 82.3 against blocked 77.8 / 76.8); LayerNorm's
 *     per-chunk Chan merge never won (57 M instructions against RMSNorm's 37 M at 32K, ncu); with
 *     CTAs sized to the row the plain forward lost 3-10 points at 2K-8K (P91), and after P95
 *     still 3-20 (P100, H100: bf16 out, RMSNorm 4K 94.6 -> 88.4, 64K 86.5 -> 66.8).
 * Where the streamed forward applies (a 16-bit x without a residual, from 32K, RMSNorm's FP8
 * outputs from 16K, NOTES P59/P67/P68, P101, P102; a residual of x's dtype from 16K, NOTES P89 /
 * P90: fwd_take_stream) it runs instead of the register path and the clusters, unless this says
 * blocked (an RMSNorm FP8 output at 16K unless the stream's knob is set; the blocked knob);
 * fwd_take_stream leaves a residual at 32K-64K to the blocked kernel (NOTES P96 / P97 /
 * P103), and its default for a non-FP8 residual row starts past 16K, where this takes 16K
 * (P130). */
inline bool fwd_take_blocked(int cols, bool has_res, int knob, bool fp8_out, bool x16, bool rms,
                             bool lean) {
  if (knob != 0) return cols >= knob;
  if (!has_res) return lean && rms && x16 && fp8_out && cols >= 4096 && cols <= 16384;
  return cols >= 32768 || (x16 && !fp8_out && cols >= 2048 && cols <= 16384);
}

/*
 * Launch one forward pass with the register path when the operands allow 16-byte vectors and the
 * row fits (and fwd_take_blocked does not say otherwise), the blocked path otherwise. Configuration depends on
 * cols and dtypes only, never on rows (rows only caps the grid).
 */
template <typename X, typename R, typename O>
engine_status launch_fwd(FwdArgs a, const LaunchCtx& ctx, bool* transposed) {
  constexpr int VEC = 16 / sizeof(X);
  *transposed = false;
  const int64_t rows = a.rows;
  const int cols = a.cols;
  const int wsz = dtype_size(a.w_dtype);
  const bool vec = (cols % VEC == 0) && vec_ok(a.x, a.x_stride, rows, sizeof(X), VEC) &&
                   vec_ok(a.residual, a.res_stride, rows, sizeof(R), VEC) &&
                   vec_ok(a.residual_out, a.res_out_stride, rows, sizeof(R), VEC) &&
                   (a.mode == kStats || vec_ok(a.out, a.out_stride, rows, sizeof(O), VEC)) &&
                   vec_ok(a.weight, 0, 1, wsz, VEC) && vec_ok(a.bias, 0, 1, wsz, VEC);
  constexpr int NV = fwd_reg_nv<X, R>();
  const int nvec = cols / VEC;
  const int tpr_raw = (nvec + NV - 1) / NV;
  const int tpr = row_group_tpr(tpr_raw);

  a.cluster = 1;
  a.gb_off = -1; /* launch_fwd_reg decides */
  /* an FP8 output with its transposed copy: the band kernel where it applies (launch_fwd_band),
   * before every other path */
  if constexpr (is_fp8_v<O> && sizeof(X) == 2 && std::is_same<X, R>::value) {
    engine_status st = ENGINE_SUCCESS;
    if (vec && launch_fwd_band<X>(a, ctx, &st)) {
      *transposed = st == ENGINE_SUCCESS;
      return st;
    }
  }
  /* the lean FP8 kernel (fwd_fp8_lean_applies: delayed scaling, no residual, the copy if any
   * after the norm, its widths; NOTES P179, P181), before the stream, the blocked kernel and the
   * register path */
  if constexpr (is_fp8_v<O> && sizeof(X) == 2 && std::is_same<X, R>::value) {
    if (vec && fwd_fp8_lean_applies(a, ctx, kTileAutoMaxCols)) return launch_fwd_fp8_lean<X>(a, ctx);
  }
  const bool wide_blocked =
      vec && fwd_blocked_packed<X, R, VEC>() &&
      fwd_take_blocked(cols, a.residual != nullptr, ctx.fwd_blocked_from, is_fp8_v<O>, sizeof(X) == 2,
                       a.is_rms != 0, ctx.lean_dram != 0);
  /* the lean kernel's rows of 32K (fwd_lean_cols; P154, P155), before the stream and the
   * clusters */
  if constexpr (std::is_same<X, R>::value && !is_fp8_v<O> && sizeof(X) == 2) {
    if (vec && cols == 32768 && fwd_lean_applies(a, ctx)) {
      return launch_fwd_lean<X, O>(a, ctx, fwd_grid_per_sm<O>(a, ctx));
    }
  }
  /* the streamed cluster kernel where it applies (fwd_take_stream), before the blocked kernel that
   * a residual row takes by default, before the one an FP8 row takes by default only under the
   * stream's knob, never before the blocked knob */
  if (vec && (!wide_blocked || (ctx.fwd_blocked_from == 0 &&
                                (a.residual != nullptr || ctx.fwd_stream_from != 0)))) {
    engine_status st = ENGINE_SUCCESS;
    if (launch_fwd_stream<X, R, O>(a, ctx, &st)) return st;
  }
  const int cluster = vec && !wide_blocked ? row_cluster(tpr_raw, ctx.max_cluster) : 0;
  if (cluster > 1) { /* the row over a cluster of CTAs; the caller transposes `out` for out_t */
    a.cluster = cluster;
    a.tpr = cluster_tpr(tpr_raw, cluster);
    a.rows_per_iter = 1;
    a.tile_rows = 0;
    a.tile_pitch = 0;
    a.t_vec16 = 0;
    a.out_t = nullptr;
    return launch_fwd_reg_k<X, R, O, NV>(a, ctx, a.tpr, 0);
  }

  if (vec && !wide_blocked && tpr <= kMaxRowThreads) {
    if constexpr (sizeof(R) == 2) {
      switch (fwd_vectors<X, R>(nvec, ctx.fwd_vectors, rows, ctx.sm_count - ctx.sm_margin)) {
        case 4: return launch_fwd_rows<X, R, O, 4>(a, ctx, transposed);
        default: break;
      }
      if constexpr (std::is_same<X, R>::value && !is_fp8_v<O>) {
        if (fwd_lean_applies(a, ctx)) return launch_fwd_lean<X, O>(a, ctx, fwd_grid_per_sm<O>(a, ctx));
      }
    }
    return launch_fwd_rows<X, R, O, NV>(a, ctx, transposed);
  }

  a.out_t = nullptr;
  a.tile_rows = 0;
  if (vec) return launch_fwd_blocked_w<X, R, O>(a, ctx);
  constexpr int NVB = 8; /* the scalar path: a CTA sized to the row, up to 512 threads */
  const int64_t want = round_up(ceil_div(cols, NVB), 32);
  const int block = (int)(want < 32 ? 32 : (want > kMaxRowThreads ? kMaxRowThreads : want));
  return launch_fwd_blocked<X, R, O, 1, NVB, float, kBlkRuntime>(a, ctx, block);
}

/* Dispatch over the residual dtype for one x and output type: x's own or fp32 (16-bit x). */
template <typename X, typename O>
engine_status dispatch_fwd_r(engine_dtype rt, FwdArgs& a, const LaunchCtx& ctx, bool* transposed) {
  if constexpr (std::is_same<X, float>::value) {
    return launch_fwd<float, float, O>(a, ctx, transposed);
  } else {
    return rt == ENGINE_DTYPE_FLOAT32 ? launch_fwd<X, float, O>(a, ctx, transposed)
                                      : launch_fwd<X, X, O>(a, ctx, transposed);
  }
}

/* Dispatch over (x dtype, residual dtype) for one output type. */
template <typename O>
engine_status dispatch_fwd_xr(engine_dtype xt, engine_dtype rt, FwdArgs& a, const LaunchCtx& ctx,
                              bool* transposed) {
  switch (xt) {
    case ENGINE_DTYPE_FLOAT32:
      return dispatch_fwd_r<float, O>(rt, a, ctx, transposed);
    case ENGINE_DTYPE_FLOAT16:
      return dispatch_fwd_r<__half, O>(rt, a, ctx, transposed);
    case ENGINE_DTYPE_BFLOAT16:
      return dispatch_fwd_r<__nv_bfloat16, O>(rt, a, ctx, transposed);
    default:
      break;
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm forward: unsupported x dtype %s",
                   dtype_name(xt));
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_LAUNCH_CUH_
