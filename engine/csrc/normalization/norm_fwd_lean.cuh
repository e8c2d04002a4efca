/*
 * The lean register forward (benchmarks/NOTES.md Q43, Q44, P150): the rows that the register path
 * lays out without a masked slot, computed in the register kernel's order, so every bit (y,
 * rsigma, mu) is the register path's at 8 vectors per thread.
 *
 * Taken (fwd_lean_applies in norm_fwd_launch.cuh) for a 16-bit x without a residual, mode kFull,
 * a non-FP8 output, 8 vectors of x per thread (fwd_vectors), and rows of 4096-16384 columns
 * (and 32768 on one card per norm: fwd_lean_cols, P154): a row over tpr = cols / 64 threads
 * (64-256), 256 / tpr rows per CTA, every slot in the row; rows of 32768 as one CTA of 512
 * threads or over a cluster of two 256-thread CTAs (fwd_lean_cluster, P155; the kernel itself
 * takes any power-of-two row of 2048-32768 columns in one CTA). Measured on the H200
 * against the register kernel (NOTES P150, kernel time, means of two alternations): RMSNorm 8K /
 * 16K 87.8 -> 89.6, 86.4 -> 88.4 % of copy, LayerNorm 84.6 -> 86.2, 82.9 -> 84.7; at 2K it lost
 * 2.5 points for both norms, so 2K keeps the register kernel (at 4K RMSNorm lost 1 then, before
 * P153; since P153 4K gains on both cards: fwd_lean_cols). What differs
 * from norm_fwd_reg_kernel's general loop, which runs the other rows:
 *   - 2 CTAs of 256 threads per SM (up to 128 registers, where the register kernel's builds are
 *     compiled for 3 at 80);
 *   - no per-CTA prologue: gamma (and beta) read per row and slot as 16-byte vectors through L1,
 *     the register kernel's global-memory path, not filled into shared memory by every CTA;
 *   - the next row block's x loaded into registers before this one's reduction;
 *   - no per-slot tests (no masked slot, no mode, no cluster, no FP8 or tile branches);
 *   - each slot's gamma (and beta) loaded one slot ahead of its use, before the previous slot's
 *     store (P153, H200, kernel time, two alternations: RMSNorm 8K / 16K 89.1 -> 91.0-91.1,
 *     88.8 -> 90.1-90.2, LayerNorm 86.6-86.9 -> 88.2-89.0, 85.4-86.0 -> 87.2-87.8).
 * A stand-alone kernel of this shape (ci/fwd_lab.cu) read 96-98 % of copy on the H100 at 4K-16K
 * where the register kernel read 92-95, and on the H200 2-5 points over it at 4K-8K (Q43, Q44;
 * the per-CTA fill cost LayerNorm 8K 8 points there); engine's form gains less (above). The grid
 * is fwd_grid_per_sm's (16 CTAs per SM by default for these outputs): the row loop strides by it.
 *
 * Numerics: those of norm_fwd.cuh (z = x; RMSNorm rsigma = rsqrtf(sum z^2 / N + eps): row_rsigma;
 * LayerNorm's one-pass sums scaled by 1 / N per thread, ln_one_pass_var, else the centred pass;
 * ln_fma_row; norm_y), each thread's values summed in the register kernel's slot order and the row
 * group reduced by the same RowGroupSum, so the sums, and every output, are its bits. The sums'
 * loops restate norm_fwd_reg_kernel's (without its masks) on purpose: a helper shared with it
 * would change the register kernel's 80-register builds, which move with any added state (NOTES
 * P54 / P55) and need their own GPU A/B.
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_LEAN_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_LEAN_CUH_

#include "normalization/norm_fwd.cuh"

namespace engine {
namespace norm {

constexpr int kLeanNV = kFwdNV;   /* 16-byte vectors of x per thread */
constexpr int kLeanThreads = 256; /* threads per CTA: 256 / tpr row groups of tpr threads */
/* The build for rows of 32768 columns (P154): one row of 512 threads per CTA, one CTA per SM at
 * the same 128-register cap (the same 16 warps per SM as 2 x 256). */
constexpr int kLeanWideThreads = kMaxRowThreads;

/* Whether rows of `cols` 16-bit values go to the lean kernel (`knob`: engine_set_norm_fwd_lean's
 * value, 0, 2 or 3; `lean_card`: LaunchCtx::lean_dram, the H100): 4096, 8192 and 16384 columns (a
 * power of two, so that its row groups fill the CTA; 2048 measured slower: above), and 32768 for
 * RMSNorm on a card that is not lean (the H200) and for LayerNorm on a lean one (the H100), or
 * both under knob 2. P154 (kernel time, knob 2 against the default, two alternations each):
 *   H200: RMSNorm fwd 4K 90.8-91.0 -> 91.6-91.7, LayerNorm 86.5-86.7 -> 88.6-89.3; RMSNorm 32K
 *     81.2-81.5 (the streamed kernel) -> 83.2-83.8, its fwd + bwd 81.6-81.7 -> 85.3-85.6;
 *     LayerNorm 32K 80.3-81.0 (the clusters) -> 74.6-75.9, lost;
 *   H100: RMSNorm fwd 4K 94.6-94.7 -> 95.7-95.8, LayerNorm 93.5 -> 94.3-94.7; LayerNorm 32K
 *     85.1-85.2 (the stream) -> 86.9-87.3, its fwd + bwd 82.8-82.9 -> 86.0-86.2; RMSNorm 32K
 *     88.3-88.4 (the stream) -> 87.2-88.1, not taken. */
inline bool fwd_lean_cols(int cols, int knob, bool rms, bool lean_card) {
  if (cols == 4096 || cols == 8192 || cols == 16384) return true;
  return cols == 32768 && (knob >= 2 || rms != lean_card);
}

/* CTAs per row of the lean kernel (fwd_lean_cols's rows): rows of 32768 over a cluster of two
 * 256-thread CTAs for RMSNorm on a card that is not lean (the H200) and for both norms under
 * knob 3, where max_cluster allows a cluster; 1 otherwise (a 32K row is then one 512-thread CTA).
 * P155 (H200, kernel time, knob 3 against the default, two alternations): RMSNorm fwd 32K
 * 83.5-83.7 (one 512-thread CTA) -> 85.3-85.7, its fwd + bwd 85.2-85.4 -> 86.3-86.6; LayerNorm
 * fwd 32K 80.2-80.7 (the register kernel's clusters) -> 78.2-78.3, not taken. Rows of 64K and
 * 128K over clusters of 4 and 8 lost to the stream (RMSNorm 84.4 -> 78.5-81.5, LayerNorm 78-81 ->
 * 66-72): not offered. */
inline int fwd_lean_cluster(int cols, int knob, bool rms, bool lean_card, int max_cluster) {
  if (cols != 32768 || max_cluster < 2) return 1;
  return knob == 3 || (knob == 0 && rms && !lean_card) ? 2 : 1;
}

/* kCl: whether a row spans a thread-block cluster (P155): a.cluster CTAs of kThreads threads
 * (fwd_lean_cluster: 2 at rows of 32K; the size is read at run time), CTA k holding lanes
 * k * tpr .. (k + 1) * tpr - 1 of the row, the row's sums reduced in the CTA and then over the
 * cluster by cluster_sum in rank order: the register kernel's cluster path, norm_fwd.cuh, and
 * its bits. kCl = false is the one-CTA build. */
template <typename X, typename O, typename W, bool kRms, bool kBias, int kThreads, bool kCl = false>
__global__ void __launch_bounds__(kThreads, kMaxRowThreads / kThreads) norm_fwd_lean_kernel(const FwdArgs a) {
  constexpr int NV = kLeanNV;
  constexpr int VEC = 16 / sizeof(X);
  constexpr int ZW = PackedWords<X, VEC>::kWords;
  static_assert(sizeof(X) == 2 && VEC == 8, "a 16-bit x");
  static_assert(!kCl || kThreads <= kClusterRowThreads, "clusters of CTAs of up to 256 threads");
  __shared__ float red_buf[2 * 32 * (kRms ? 1 : 2)];
  __shared__ ClusterXchgSmem cl_smem; /* unused (and dropped) without kCl */

  const int tpr = a.tpr;
  const int group = threadIdx.x / tpr;
  const int lr = threadIdx.x - group * tpr;
  const int ncl = kCl ? a.cluster : 1;                     /* CTAs per row */
  const int glane = kCl ? cluster_rank() * tpr + lr : lr; /* lane in the row */
  const int gstride = ncl * tpr;                          /* threads per row */
  const int G = a.rows_per_iter;
  const int64_t nblk = (a.rows + G - 1) / G;
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
  RowGroupSum<1> red(red_buf, tpr, group);
  RowGroupSum<2> red2(red_buf, tpr, group);
  ClusterXchg xchg(cl_smem, ncl);

  /* the thread's slots: vectors glane + i * gstride of its row (row_slots with every slot valid) */
  auto load_row = [&](int64_t blk, uint32_t(&zw)[NV][ZW]) {
    const int64_t row = blk * G + group;
    if (row < a.rows) {
      const X* xrow = static_cast<const X*>(a.x) + row * a.x_stride + glane * VEC;
#pragma unroll
      for (int i = 0; i < NV; ++i) load_words<VEC * sizeof(X)>(xrow + i * gstride * VEC, zw[i]);
    }
  };
  uint32_t cur[NV][ZW], nxt[NV][ZW];
  const int64_t bstride = gridDim.x / ncl; /* rows (blocks) in flight: one per cluster */
  int64_t blk = blockIdx.x / ncl;
  if (blk < nblk) load_row(blk, cur);
  for (; blk < nblk; blk += bstride) {
    const int64_t next = blk + bstride;
    if (next < nblk) load_row(next, nxt);
    const int64_t row = blk * G + group;
    if (row < a.rows) { /* uniform over the row group, whose barriers are its own */
      auto zv = [&](int i, int j) -> float { return unpack_at<X, VEC>(cur[i], j); };
      float mean = 0.0f;
      float rs;
      if constexpr (kRms) {
        float q[1] = {0.0f};
#pragma unroll
        for (int i = 0; i < NV; ++i) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) q[0] = fmaf(zv(i, j), zv(i, j), q[0]);
        }
        red(q);
        cluster_sum<1>(q, xchg);
        rs = row_rsigma(q[0] * a.inv_n + a.eps);
      } else {
        float sq[2] = {0.0f, 0.0f};
#pragma unroll
        for (int i = 0; i < NV; ++i) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float z = zv(i, j);
            sq[0] += z;
            sq[1] = fmaf(z, z, sq[1]);
          }
        }
        sq[0] *= a.inv_n;
        sq[1] *= a.inv_n;
        red2(sq);
        cluster_sum<2>(sq, xchg);
        mean = sq[0];
        float var;
        if (!ln_one_pass_var(mean, sq[1], var)) { /* uniform over the row group */
          float q[2] = {0.0f, 0.0f};
#pragma unroll
          for (int i = 0; i < NV; ++i) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              const float d = zv(i, j) - mean;
              q[0] = fmaf(d, d, q[0]);
            }
          }
          red2(q);
          float c[1] = {q[0]};
          cluster_sum<1>(c, xchg);
          var = c[0] * a.inv_n;
        }
        rs = row_rsigma(var + a.eps);
      }
      /* gamma (and beta) of slot i as raw words, loaded one slot ahead of their use (P153): the
       * compiler keeps a load after every store that precedes it in the source (the pointers may
       * alias), so a load written at its use waited for the previous slot's store, one L1 round
       * trip per slot (SASS: LDG gamma, STG y, LDG gamma, ...). Converted to float at the use: the
       * same values as load_gamma_beta_t's (every 16-bit value and fp32 is exact in fp32). */
      constexpr int GW = PackedWords<W, VEC>::kWords;
      const W* const wv = static_cast<const W*>(a.weight) + glane * VEC;
      const W* const bv = kBias ? static_cast<const W*>(a.bias) + glane * VEC : nullptr;
      uint32_t gw[2][GW], bw[2][GW];
      auto load_gb = [&](int i, uint32_t(&gi)[GW], uint32_t(&bi)[GW]) {
        load_words<VEC * sizeof(W)>(wv + i * gstride * VEC, gi);
        if constexpr (kBias) load_words<VEC * sizeof(W)>(bv + i * gstride * VEC, bi);
      };
      load_gb(0, gw[0], bw[0]);
      /* rsigma (and mu): LayerNorm's after the row's epilogue (stored before it, they cost the
       * lean FP8 kernel's lab twin 1.7-3.5 points: NOTES Q76, Q76b); RMSNorm's before it, where
       * its build keeps its registers (after it, ptxas spilled 76 bytes at the 128 cap) */
      const float mu = mean;
      auto store_stats = [&] {
        if (glane == 0) {
          a.rsigma[row] = rs;
          if constexpr (!kRms) a.mu[row] = mu;
        }
      };
      if constexpr (kRms) store_stats();
      O* const orow = static_cast<O*>(a.out) + row * a.out_stride + glane * VEC;
      const bool fma_row = !kRms && ln_fma_row(rs, mean); /* mean = c on an FMA row */
      auto epilogue = [&](auto fma_tag) {
        constexpr bool kFma = decltype(fma_tag)::value;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (i + 1 < NV) load_gb(i + 1, gw[(i + 1) & 1], bw[(i + 1) & 1]);
          float y[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float g = unpack_at<W, VEC>(gw[i & 1], j) + g_add;
            const float b = kBias ? unpack_at<W, VEC>(bw[i & 1], j) : 0.0f;
            y[j] = norm_y<kFma>(zv(i, j), kRms ? 0.0f : mean, rs, g, b, kBias);
          }
          store_vec<O, VEC>(orow + i * gstride * VEC, y);
        }
      };
      if constexpr (kRms) {
        epilogue(std::false_type{});
      } else {
        with_ln_form(fma_row, epilogue);
      }
      if constexpr (!kRms) store_stats();
    }
    if (next < nblk) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
#pragma unroll
        for (int k = 0; k < ZW; ++k) cur[i][k] = nxt[i][k];
      }
    }
  }
  xchg.finish(); /* no CTA leaves while its cluster peer may still send to it */
}

/* One launch: the build for the weight type and norm kind, on fwd_grid_per_sm's CTAs per SM
 * (256-thread CTAs); a row of 512 threads runs its own build on the resident grid (one CTA per
 * SM looping over rows, so that the next row's prefetch has a row to hide behind: 16 CTAs per SM
 * would give each CTA about one row at 64M values). */
template <typename X, typename O, typename W, bool kRms, bool kBias>
engine_status launch_fwd_lean_t(FwdArgs a, const LaunchCtx& ctx, int per_sm) {
  auto* k = &norm_fwd_lean_kernel<X, O, W, kRms, kBias, kLeanThreads>;
  auto* kw = &norm_fwd_lean_kernel<X, O, W, kRms, kBias, kLeanWideThreads>;
  if (a.cluster > 1) { /* P155: a row over a cluster of 256-thread CTAs, resident grid */
    auto* kc = &norm_fwd_lean_kernel<X, O, W, kRms, kBias, kLeanThreads, true>;
    const int64_t work = a.rows;
    int64_t grid = 0;
    return launch_row_kernel(kc, kc, a, a.tpr, 0, work, ctx, 0, work, &grid, "norm_fwd_lean_kernel", 0);
  }
  const int block = a.tpr * a.rows_per_iter;
  const int64_t work = ceil_div(a.rows, (int64_t)a.rows_per_iter);
  int64_t grid = 0;
  return launch_row_kernel(k, kw, a, block, 0, work, ctx, 0, work, &grid, "norm_fwd_lean_kernel",
                           block > kLeanThreads ? 0 : per_sm);
}

template <typename X, typename O>
engine_status launch_fwd_lean(FwdArgs a, const LaunchCtx& ctx, int per_sm) {
  a.tpr = a.cols / (kLeanNV * 8); /* a power of two, 32..512 (fwd_lean_cols) */
  const int cluster =
      fwd_lean_cluster(a.cols, ctx.fwd_lean, a.is_rms != 0, ctx.lean_dram != 0, ctx.max_cluster);
  a.tpr /= cluster;
  /* Row groups must fill the CTA exactly: a partial group would wait at its named barrier for
   * threads that do not exist (the first form hung so at 6144 columns: NOTES P150). */
  if (a.cols % (kLeanNV * 8) != 0 || a.tpr < 32 || a.tpr > kLeanWideThreads || (a.tpr & (a.tpr - 1)) != 0) {
    return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm_fwd_lean: %d columns do not fill its row groups",
                     a.cols);
  }
  a.rows_per_iter = a.tpr > kLeanThreads || cluster > 1 ? 1 : kLeanThreads / a.tpr;
  a.cluster = cluster;
  a.tile_rows = 0;
  a.gb_off = -1;
  const bool bias = a.bias != nullptr;
  if (a.w_dtype == ENGINE_DTYPE_FLOAT32) {
    if (a.is_rms) {
      return bias ? launch_fwd_lean_t<X, O, float, true, true>(a, ctx, per_sm)
                  : launch_fwd_lean_t<X, O, float, true, false>(a, ctx, per_sm);
    }
    return bias ? launch_fwd_lean_t<X, O, float, false, true>(a, ctx, per_sm)
                : launch_fwd_lean_t<X, O, float, false, false>(a, ctx, per_sm);
  }
  if (a.is_rms) {
    return bias ? launch_fwd_lean_t<X, O, X, true, true>(a, ctx, per_sm)
                : launch_fwd_lean_t<X, O, X, true, false>(a, ctx, per_sm);
  }
  return bias ? launch_fwd_lean_t<X, O, X, false, true>(a, ctx, per_sm)
              : launch_fwd_lean_t<X, O, X, false, false>(a, ctx, per_sm);
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_LEAN_CUH_
