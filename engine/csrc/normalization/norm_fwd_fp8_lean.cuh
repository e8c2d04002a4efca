/*
 * The lean FP8 forward (benchmarks/NOTES.md Q75, P179, P181): a 16-bit x without a residual to an
 * FP8 output in delayed scaling (mode kFull), no in-kernel transposed copy, in the shape that let
 * a stand-alone kernel (ci/fp8_lab.cu, Q75) read 87-93 % of copy on the H200 where engine's
 * register and streamed kernels read 74-88 (LayerNorm e4m3 4K-16K, RMSNorm e4m3 4K-32K). The
 * default (fwd_fp8_lean_takes) where it measured faster than those kernels on the H200 (P181b,
 * P186c: LayerNorm e4m3 4K / 6144 / 8K, RMSNorm e4m3 4K / 8K / 12288 / 16K); not LayerNorm 16K
 * (P186c: 74.6 % of copy against 80.2 for the stream). The row guard and LayerNorm's two
 * row-uniform tests go through warp_uniform (P183: LayerNorm e4m3 8K +2.3, 16K +4.1 stand-alone).
 * ci/fp8_lab_engine.cu builds it
 * without the extension; Q76 put each of engine's additions into the lab's kernel to find what
 * its first forms (P179: 79.7 / 69.3 / 61.9 at LayerNorm) lost.
 *
 * What the lab found carries the shape:
 *   - the next row's x loaded before this row's reductions (a register prefetch): 15-30 points
 *     (LayerNorm e4m3 8K 87 -> 64 without it);
 *   - one CTA of 512 threads per SM (up to 128 registers a thread, 16 warps per SM);
 *   - gamma (and beta) loaded once into fp32 registers before the row loop, a thread holding 32
 *     values of a row (4 vectors: LayerNorm e4m3 8K 87 against 81 re-read per row). 8 vectors a
 *     thread (RMSNorm's rows of 32K, gamma re-read per row) were dropped: never faster than the
 *     other kernels (P179c), and at 56-59 % with this prefetch (P181: spills, and the epilogue
 *     waited on gamma's loads).
 * 16-byte FP8 stores (Triton's layout) were not a factor, so the layout is the register kernel's:
 * slot i of lane lr is the 16-byte vector lr + i * tpr of its row, tpr = cols / 32 threads a
 * row (a multiple of 32, at most 512), G = 512 / tpr rows a CTA (its block G * tpr threads, so
 * that every row group is whole: a partial one would wait at its named barrier for threads that
 * do not exist), every slot in the row (no masks: fwd_fp8_lean_takes takes only widths that fill
 * them). x, gamma and beta come through the read-only path (load_words_nc: the FP8 output cannot
 * alias them; it changed nothing measurable, Q75b).
 * The prefetch needs care (Q75c, Q76b): ptxas counts every x load, and gamma's, on one
 * scoreboard, and a wait for any of them is a wait for all. So the next row's loads sit at the
 * loop's top (as early as they can), but the loop never reads a loaded register: the first row
 * comes into `nxt` like every other and each row is copied into `cur` by opaque moves at the end
 * of the row before it (copy_words_opaque), and every held gamma / beta value is used once
 * before the loop. P179c's form (the loads after the sums, under a predicate on them) kept the
 * prefetch working but issued it late: 7 points at LayerNorm e4m3 8K in the lab (Q76). rsigma
 * and mu are stored after the row's epilogue (before it they cost 1.7-3.5 points there: Q76b).
 *
 * Numerics: those of norm_fwd.cuh (z = x; RMSNorm rsigma = rsqrtf(sum z^2 / N + eps): row_rsigma;
 * LayerNorm's one-pass sums scaled by 1 / N per thread, ln_one_pass_var, else the centred pass;
 * ln_fma_row; norm_y; amax of y before the scale; q = cvt.rn.satfinite(y * scale)). gamma + the
 * zero-centred 1 is the same fp32 sum whether held or added at each use. The sums are added in
 * the register kernel's slot order at 4 vectors a thread, reduced by the same RowGroupSum: its
 * bytes are the register kernel's at 4 vectors per thread (tests/test_fp8.py::
 * test_fwd_fp8_lean_kernel).
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_FP8_LEAN_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_FP8_LEAN_CUH_

#include "normalization/norm_fwd.cuh"

namespace engine {
namespace norm {

constexpr int kFp8LeanThreads = 512; /* one CTA per SM */

constexpr int kFp8LeanNV = 4;         /* 16-byte vectors of x per thread */

/* Whether the lean FP8 kernel takes rows of `cols` columns. `knob`: engine_set_norm_fwd_fp8_lean's
 * value: 0 (the default) on a card that is not lean (`lean_card`: LaunchCtx::lean_dram, the H100,
 * where it is not measured) at RMSNorm's 4096, 8192, 12288 and 16384 columns and LayerNorm's 4096,
 * 6144 and 8192, the widths where it measured faster on the H200 (kernel time, % of copy, knob 1
 * against knob 2 in one call, two alternations; P181b, then P186c after P186's rsqrtf): LayerNorm
 * e4m3 4K 82.2 -> 87.4, 6144 69.3 -> 75.8, 8K 77.7 -> 81.4; RMSNorm 4K 88.9 -> 91.6, 8K 87.0 ->
 * 90.2, 12288 79.1 -> 81.0, 16K 83.7 -> 87.3. A width with part of its CTA empty (6144, 12288:
 * 512 / tpr row groups of tpr threads fill 384 of its 512 threads) goes either way: RMSNorm 6144
 * 87.5 -> 81.6 and LayerNorm 12288 75.4 -> 69.8 lost, so the default is per norm and width. 1 never; 2 every width it fits: tpr = cols / 32 a multiple
 * of 32, at most 512 (a multiple of 1024 columns up to 16384). */
inline bool fwd_fp8_lean_takes(int cols, bool rms, int knob, bool lean_card) {
  if (knob == 1) return false;
  const int tpr = cols / (8 * kFp8LeanNV);
  if (cols % (8 * kFp8LeanNV) != 0 || tpr < 32 || tpr > kFp8LeanThreads || tpr % 32 != 0) return false;
  if (knob == 2) return true;
  return !lean_card &&
         (cols == 4096 || cols == 8192 || (rms ? cols == 12288 || cols == 16384 : cols == 6144));
}

template <typename X, typename W, bool kRms, bool kBias, __nv_fp8_interpretation_t kFmt>
__global__ void __launch_bounds__(kFp8LeanThreads, 1) norm_fwd_fp8_lean_kernel(const FwdArgs a) {
  constexpr int NV = kFp8LeanNV;
  constexpr int VEC = 8;
  constexpr int ZW = PackedWords<X, VEC>::kWords;
  static_assert(sizeof(X) == 2 && 16 / sizeof(X) == VEC, "a 16-bit x");
  __shared__ float red_buf[2 * 32 * (kRms ? 1 : 2)];
  __shared__ int amax_buf[32];

  const int tpr = a.tpr;
  const int group = threadIdx.x / tpr;
  const int lr = threadIdx.x - group * tpr;
  const int G = a.rows_per_iter;
  const int64_t nblk = (a.rows + G - 1) / G;
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
  const float scale = fwd_fp8_scale<true>(a); /* mode kFull: *scale; block 0 writes scale_inv */
  float amax = 0.0f;
  RowGroupSum<1> red(red_buf, tpr, group);
  RowGroupSum<2> red2(red_buf, tpr, group);

  /* gamma (and beta) of the thread's slots as floats, held across the row loop (x, gamma and
   * beta through the read-only path: load_words_nc; nothing here writes them, and the FP8 output
   * cannot alias them) */
  constexpr int GW = PackedWords<W, VEC>::kWords;
  const W* const wv = static_cast<const W*>(a.weight) + lr * VEC;
  const W* const bv = kBias ? static_cast<const W*>(a.bias) + lr * VEC : nullptr;
  float gh[NV][VEC];
  [[maybe_unused]] float bh[kBias ? NV : 1][VEC];
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    uint32_t gi[GW], bi[GW];
    load_words_nc<VEC * sizeof(W)>(wv + i * tpr * VEC, gi);
    if constexpr (kBias) load_words_nc<VEC * sizeof(W)>(bv + i * tpr * VEC, bi);
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      gh[i][j] = unpack_at<W, VEC>(gi, j) + g_add;
      if constexpr (kBias) bh[i][j] = unpack_at<W, VEC>(bi, j);
    }
  }
  /* Every held value (and the scale) used once here, in a branch never taken (rows >= 0), so
   * that no loop instruction waits on their loads' scoreboard: under register pressure ptxas
   * otherwise keeps some as the loaded 16-bit words and converts them at each use (Q76b), and
   * LayerNorm without a bias waited for the scale's load at the epilogue's first product. */
  uint32_t acc = __float_as_uint(scale);
#pragma unroll
  for (int i = 0; i < NV; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      acc ^= __float_as_uint(gh[i][j]);
      if constexpr (kBias) acc ^= __float_as_uint(bh[i][j]);
    }
  }
  if (a.rows < 0 && acc == 0x12345u) *a.amax = 0.0f;

  /* a row past the matrix is zeros (its sums are computed and not used: below) */
  auto load_row = [&](int64_t blk, uint32_t(&zw)[NV][ZW]) {
    const int64_t row = blk * G + group;
    if (row < a.rows) {
      const X* xrow = static_cast<const X*>(a.x) + row * a.x_stride + lr * VEC;
#pragma unroll
      for (int i = 0; i < NV; ++i) load_words_nc<VEC * sizeof(X)>(xrow + i * tpr * VEC, zw[i]);
    } else {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
#pragma unroll
        for (int k = 0; k < ZW; ++k) zw[i][k] = 0u;
      }
    }
  };
  uint32_t cur[NV][ZW], nxt[NV][ZW];
  int64_t blk = blockIdx.x;
  if (blk < nblk) { /* the first row as every other: into nxt, copied into cur */
    load_row(blk, nxt);
#pragma unroll
    for (int i = 0; i < NV; ++i) copy_words_opaque(cur[i], nxt[i]);
  }
  for (; blk < nblk; blk += gridDim.x) {
    const int64_t next = blk + gridDim.x;
    if (next < nblk) load_row(next, nxt); /* in flight until the copy at the row's end */
    const int64_t row = blk * G + group;
    const bool ok = row < a.rows; /* uniform over the row group, whose barriers are its own */
    auto zv = [&](int i, int j) -> float { return unpack_at<X, VEC>(cur[i], j); };
    /* This thread's sums of the row (RMSNorm: sq[0] = sum z^2; LayerNorm: sum z, sum z^2), on
     * every path (a row past the matrix sums its zeros): the lab's measured form (Q76b). */
    float sq[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const float z = zv(i, j);
        if constexpr (kRms) {
          sq[0] = fmaf(z, z, sq[0]);
        } else {
          sq[0] += z;
          sq[1] = fmaf(z, z, sq[1]);
        }
      }
    }
    if (warp_uniform(ok)) {
      float mean = 0.0f;
      float rs;
      if constexpr (kRms) {
        float q[1] = {sq[0]};
        red(q);
        rs = row_rsigma(q[0] * a.inv_n + a.eps);
      } else {
        sq[0] *= a.inv_n;
        sq[1] *= a.inv_n;
        red2(sq);
        mean = sq[0];
        float var;
        if (!warp_uniform(ln_one_pass_var(mean, sq[1], var))) { /* uniform over the row group */
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
          var = q[0] * a.inv_n;
        }
        rs = row_rsigma(var + a.eps);
      }
      uint8_t* const orow = static_cast<uint8_t*>(a.out) + row * a.out_stride + lr * VEC;
      const float mu = mean; /* for the store after the epilogue */
      const bool fma_row = !kRms && ln_fma_row(rs, mean); /* mean = c on an FMA row */
      auto epilogue = [&](auto fma_tag) {
        constexpr bool kFma = decltype(fma_tag)::value;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          float y[VEC];
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float b = kBias ? bh[i][j] : 0.0f;
            y[j] = norm_y<kFma>(zv(i, j), kRms ? 0.0f : mean, rs, gh[i][j], b, kBias);
            amax = amax_update(amax, y[j]);
            y[j] *= scale;
          }
          uint32_t w[VEC / 4];
          pack_fp8_fmt<VEC, kFmt>(y, w);
          store_words<VEC>(orow + i * tpr * VEC, w);
        }
      };
      if constexpr (kRms) {
        epilogue(std::false_type{});
      } else {
        with_ln_form(warp_uniform(fma_row), epilogue);
      }
      if (lr == 0) { /* after the epilogue (Q76b) */
        a.rsigma[row] = rs;
        if constexpr (!kRms) a.mu[row] = mu;
      }
    }
    if (next < nblk) {
#pragma unroll
      for (int i = 0; i < NV; ++i) copy_words_opaque(cur[i], nxt[i]);
    }
  }
  block_amax_atomic(amax, a.amax, amax_buf);
}

/* One launch on the resident grid (one CTA per SM, fewer under an sm_margin, capped by the row
 * blocks): the build for the format, weight type and norm kind. */
template <typename X, typename W, bool kRms, bool kBias>
engine_status launch_fwd_fp8_lean_t(const FwdArgs& a, const LaunchCtx& ctx) {
  auto* k = a.e5m2 ? &norm_fwd_fp8_lean_kernel<X, W, kRms, kBias, __NV_E5M2>
                   : &norm_fwd_fp8_lean_kernel<X, W, kRms, kBias, __NV_E4M3>;
  const int block = a.tpr * a.rows_per_iter;
  const int64_t work = ceil_div(a.rows, (int64_t)a.rows_per_iter);
  int64_t grid = 0;
  return launch_row_kernel(k, k, a, block, 0, work, ctx, 0, work, &grid, "norm_fwd_fp8_lean_kernel", 0);
}

/* Whether the lean FP8 kernel takes this launch (the caller's types: an FP8 output of a 16-bit x
 * with x's own z): delayed scaling (kFull) without a residual, no transposed copy asked of the
 * kernel (out_t null, or out_t_auto past the register path's tile, where the copy comes from the
 * tiled transpose after the norm anyway), RMSNorm without a bias or LayerNorm, weights of x's
 * dtype, a width fwd_fp8_lean_takes takes; not under the general-loop, stream or blocked knobs (so
 * that they still reach their kernels). */
inline bool fwd_fp8_lean_applies(const FwdArgs& a, const LaunchCtx& ctx, int tile_auto_max_cols) {
  if (ctx.fwd_general || ctx.fwd_stream_from != 0 || ctx.fwd_blocked_from != 0) return false;
  if (a.residual != nullptr || a.mode != kFull || (a.is_rms && a.bias != nullptr)) return false;
  /* fp32 weights: their builds spilled (ptxas, sm_90: LayerNorm with a bias 160 bytes), and they
   * are rare next to a 16-bit x; the other kernels keep them */
  if (a.w_dtype == ENGINE_DTYPE_FLOAT32) return false;
  if (a.out_t != nullptr && !(a.t_auto != 0 && a.cols > tile_auto_max_cols)) return false;
  return fwd_fp8_lean_takes(a.cols, a.is_rms != 0, ctx.fwd_fp8_lean, ctx.lean_dram != 0);
}

/* The launch fwd_fp8_lean_applies took: weights of x's dtype. */
template <typename X>
engine_status launch_fwd_fp8_lean(FwdArgs a, const LaunchCtx& ctx) {
  a.tpr = a.cols / (8 * kFp8LeanNV);
  a.rows_per_iter = kFp8LeanThreads / a.tpr;
  a.cluster = 1;
  a.tile_rows = 0;
  a.gb_off = -1;
  a.out_t = nullptr;
  if (a.is_rms) return launch_fwd_fp8_lean_t<X, X, true, false>(a, ctx);
  return a.bias != nullptr ? launch_fwd_fp8_lean_t<X, X, false, true>(a, ctx)
                           : launch_fwd_fp8_lean_t<X, X, false, false>(a, ctx);
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_FP8_LEAN_CUH_
