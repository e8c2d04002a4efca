/*
 * Norm forward kernels (RMSNorm and LayerNorm in one code path: RMSNorm is LayerNorm with mean 0
 * and no mean reduction; a template parameter on the register path, a uniform run-time flag on
 * the blocked path). Their launchers are in norm_fwd_launch.cuh.
 *
 * Register path (norm_fwd_reg_kernel), rows of up to kMaxRowThreads * NV 16-byte vectors of x
 * (NV = 8: 32K elements for 16-bit x; NV = 4 when z is fp32: 8K for fp32 x, 16K for 16-bit x
 * with an fp32 residual; see fwd_reg_nv) whose operands allow 16-byte vector access:
 *   - z stays in registers between the statistics and the epilogue, packed as R values (16-bit
 *     values two to a register); with NV = 4 vectors of a 16-bit z (fwd_vectors in
 *     norm_fwd_launch.cuh: bf16 rows of one warp) compiled for 4 CTAs per SM
 *     (fwd_min_blocks); gamma / beta are re-read per row in the epilogue
 *     (L1-resident), not held as floats across the row loop, and blocks of up to 256 threads
 *     are compiled for 3 CTAs per SM: 80 registers instead of 128, 3 CTAs of 256 threads per
 *     SM instead of 2 (no spills; capping at 64 registers spills); rows that need 512 threads
 *     get a 1-CTA build;
 *   - a CTA holds rows_per_iter row groups of tpr threads; thread t of a group owns vectors
 *     t, t + tpr, ..., t + (NV - 1) tpr of the row (coalesced across the group);
 *   - persistent: grid ~ SMs * occupancy, each CTA loops over blocks of rows with a loop count
 *     that is uniform across the CTA (invalid rows are masked, never skipped: the reductions use
 *     a barrier over the row group's warps when a row spans several: row_group_sync);
 *   - 1/N (host) and the FP8 scale are computed once, before the row loop;
 *   - LayerNorm statistics: sum z and sum z^2 in one pass and one reduction of the pair (in a
 *     cluster then cluster_sum), var = E[z^2] - mean^2 where that loses at most 2 bits
 *     (ln_one_pass_var, norm_common.cuh: mean^2 <= 3 var), else a second, centred pass
 *     sum((z - mean)^2) and its reduction: no E[z^2] - E[z]^2 cancellation for large-mean rows;
 *   - FP8 out: per-thread amax (a NaN-propagating float max of |y|, masked lanes contribute 0),
 *     one atomicMax of its bits per CTA; with out_t the CTA owns tiles of
 *     tile_rows rows, stages the FP8 bytes in shared memory and writes the transposed tile with
 *     16-byte stores (common/tile.cuh); with delayed scaling in the 256-thread builds, a row loop
 *     without run-time tests per slot (FwdPath, below).
 * Cluster path (the same kernel, sm_90): a row wider than one 256-thread CTA's registers is split
 * over a thread-block cluster of 2, 4, 8 (or, on request, 16) such CTAs (FwdArgs::cluster;
 * row_cluster() in norm_common.cuh), CTA k owning lanes k * tpr .. (k + 1) * tpr - 1 of the row; the row's
 * statistics are reduced in the CTA, then across the cluster: each CTA's values sent to every CTA
 * by st.async and counted by an mbarrier (cluster_sum over ClusterXchg, reduce.cuh:
 * rank order, so all CTAs hold the same bits). 16-bit rows of up to 128K stay in
 * registers this way (one read of x) instead of taking the blocked path (two), and rows of 16K-32K
 * run as 3 CTAs per SM instead of one 512-thread CTA. No in-kernel transposed copy on this path.
 * Streamed path (norm_fwd_stream.cuh, its own kernel; by default for a 16-bit x without a residual
 * from 32K columns (RMSNorm's FP8 outputs past 16K, below which the blocked kernel takes them
 * from 4K: fwd_take_blocked), with a residual of
 * x's dtype from 16K (fwd_take_stream) on sm_90, modes kFull and kStats): the row over a cluster,
 * the next rows copied ahead into shared memory; this kernel keeps kApply there, the residual rows
 * the stream does not take and the knobs. Non-FP8 rows of exactly 32768 columns go to the lean
 * kernel before both on one card per norm (RMSNorm on the H200, LayerNorm on the H100:
 * fwd_lean_cols in norm_fwd_lean.cuh, NOTES P154).
 * Blocked path (norm_fwd_blocked_kernel), any cols: one CTA per row at a time; pass 1 walks the
 * row in chunks of blockDim * NVB * VEC elements computing the statistics (RMSNorm: sum of squares;
 * LayerNorm: the sums of z and z^2, var = E[z^2] - mean^2 where that loses at most 2 bits, else
 * one more walk over the row for the centred mean square: ln_one_pass_var) and storing
 * residual_out; pass 2 re-reads z (residual_out or x, hot in L2) and writes y. VEC = 1 is the
 * scalar fallback for unaligned operands or cols % VEC != 0.
 *
 * Numerics shared by every path and mode (so kStats and kApply agree bit for bit):
 *   z = round_R(x + residual), rsigma = rsqrtf(var + eps) (row_rsigma, norm_common.cuh),
 *   t = (z - mean) * rsigma, or fma(z, rsigma, -mean * rsigma) where |mean * rsigma| <= 4
 *   (LayerNorm, ln_fma_row; not for the streamed kernel's 16-bit outputs),
 *   y = fma(t, g, b) with a bias, t * g without one,
 *   q = cvt.rn.satfinite(y * scale).
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_CUH_

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/tile.cuh"
#include "common/vec.cuh"
#include "normalization/norm_common.cuh"

namespace engine {
namespace norm {

/* LayerNorm's t = (z - mean) * rsigma as one FMA, t = fma(z, rsigma, c) with c = -mean * rsigma
 * (RN), on the rows where |c| <= kLnFmaMax; the subtraction and the product on the others (and
 * RMSNorm's t = z * rsigma, mean = 0, always). The FMA rounds once where the two operations round
 * twice, and c's rounding adds at most 2^-24 |c| <= 2^-22 to t's absolute error: within 2^-22 of
 * the exact form in units of sigma, under what any fp32 mean carries (its own rounding alone is
 * 2^-24 |mean| / sigma), and no loss on the rare rows of a large mean against the spread (|c| > 4,
 * the mean past 4 sigma), which keep the exact form. One instruction per value fewer in an
 * issue-bound epilogue (NOTES P87). A pure function of (mean, rsigma): current scaling's kApply
 * pass reads them back and takes the same form, so its bits are its kStats pass's. */
constexpr float kLnFmaMax = 4.0f;
/* Whether the row takes the FMA form; if so, mc (the mean on entry) becomes c = -mean * rs. One
 * register serves both forms (the fast FP8 loop at NV = 4 spilled with a second one). */
__device__ __forceinline__ bool ln_fma_row(float rs, float& mc) {
  const float c = -mc * rs;
  /* false for NaN and infinity (eps = 0 on a constant row) */
  const bool fma = fabsf(c) <= kLnFmaMax;
  if (fma) mc = c;
  return fma;
}

/* f(std::true_type{}) for a row of the FMA form (ln_fma_row), else f(std::false_type{}): the
 * kernels' one body per form, picked by one uniform branch per row. */
template <typename F>
__device__ __forceinline__ void with_ln_form(bool fma, F&& f) {
  if (fma) {
    f(std::true_type{});
  } else {
    f(std::false_type{});
  }
}

/* y of one value, mc from ln_fma_row: kFma takes t = fma(z, rs, mc) (mc = c), else
 * t = (z - mc) * rs (mc = the mean; 0 for RMSNorm). */
template <bool kFma>
__device__ __forceinline__ float norm_y(float z, float mc, float rs, float g, float b,
                                        bool has_bias) {
  const float t = kFma ? fmaf(z, rs, mc) : (z - mc) * rs;
  return has_bias ? fmaf(t, g, b) : t * g;
}

/* gamma and beta (0 without a bias) of the VEC columns from col, as floats. */
template <int VEC>
__device__ __forceinline__ void load_gamma_beta(const FwdArgs& a, int64_t col, bool has_bias,
                                                float (&g)[VEC], float (&b)[VEC]) {
  load_vec_dt<VEC>(a.weight, col, a.w_dtype, g);
  if (has_bias) {
    load_vec_dt<VEC>(a.bias, col, a.w_dtype, b);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) b[j] = 0.0f;
  }
}

/* The same with the weight type and the bias known at compile time (register path). */
template <typename W, bool kBias, int VEC>
__device__ __forceinline__ void load_gamma_beta_t(const FwdArgs& a, int64_t col, float (&g)[VEC],
                                                  float (&b)[VEC]) {
  load_vec<W, VEC>(static_cast<const W*>(a.weight) + col, g);
  if constexpr (kBias) {
    load_vec<W, VEC>(static_cast<const W*>(a.bias) + col, b);
  } else {
#pragma unroll
    for (int j = 0; j < VEC; ++j) b[j] = 0.0f;
  }
}

/* FP8 scale for this kernel, and the scale / scale_inv bookkeeping by one thread of the grid. */
template <bool kFp8>
__device__ __forceinline__ float fwd_fp8_scale(const FwdArgs& a) {
  float scale = 1.0f;
  if constexpr (kFp8) {
    if (a.mode == kApply) {
      scale = compute_scale(*a.amax, a.fp8_max, a.amax_eps);
    } else if (a.mode == kFull) {
      scale = *a.scale;
    }
    if (blockIdx.x == 0 && threadIdx.x == 0) {
      if (a.mode == kApply) {
        *a.scale = scale;
        *a.scale_inv = 1.0f / scale;
      } else if (a.mode == kFull) {
        *a.scale_inv = 1.0f / scale;
      }
    }
  }
  return scale;
}

/* Vectors of 16 bytes of x per thread on the register path (ptxas, sm_90): 8 for 16-bit x and z
 * (80 registers in blocks of up to 256 threads); 4 when z is fp32 (fp32 x, or an fp32 residual
 * stream with 16-bit x), where 8 spills with FP8 out. The same for every output dtype: the thread
 * layout fixes the order of the row reductions, so an FP8 output is bit for bit the cast of the
 * fp32 output (and its amax the max of it) wherever both take this path (not at the widths where
 * only FP8 outputs take the streamed kernel: fwd_take_stream). */
template <typename X, typename R>
constexpr int fwd_reg_nv() {
  return sizeof(R) == 4 ? kFwdNV / 2 : kFwdNV;
}

/* CTAs per SM the register kernel is compiled for (__launch_bounds__): 1 for the 512-thread build;
 * 3 (80 registers) at 8 vectors of a 16-bit z or 4 of an fp32 z, where 4 CTAs (64 registers)
 * spill; at 4 vectors of a bf16 z 4 CTAs, of an fp16 z 3 (its LayerNorm kernels spill at 64
 * registers: ptxas -v). */
template <typename R, int NV, int kMaxThreads>
constexpr int fwd_min_blocks() {
  if (kMaxThreads > 256) return 1;
  if (sizeof(R) == 4 || NV >= 8 || std::is_same<R, __half>::value) return 3;
  return 4;
}

/*
 * The register kernel's row loop comes in two kinds of builds (template parameter kPath), chosen
 * per launch by the launcher (launch_fwd_reg in norm_fwd_launch.cuh):
 *   kPathGeneral: every mode (current scaling's kStats / kApply too) and output, gamma / beta
 *     from shared memory or, where the launcher found no room, from global memory; each slot of
 *     each row tests its mode, operands and bounds at run time.
 *   the fast loop, FP8 outputs in mode kFull (delayed scaling) in the 256-thread builds, the
 *     format and where gamma / beta come from fixed at compile time (FwdPath): the epilogue tests
 *     the row once; a slot outside the row computes 0 (z = 0, gamma = beta = 0: zeros in shared
 *     memory or a predicated load, centred on 0) and only its stores are predicated. ncu at 1K
 *     (RMSNorm to e4m3, the general loop): of 18.4 executed instructions per value, 1.6 were
 *     branches, 1.8 compares, 0.9 convergence barriers and 1.1 parameter loads, nearly all from the
 *     per-slot tests; the fast loop executes 15.7 and gained 4-11 points at 1K-8K (RMSNorm and
 *     LayerNorm e4m3; benchmarks/NOTES.md, P15). 16-bit outputs keep the general loop: the fast
 *     one changed nothing measurable there (at 4 bytes per value they are not bound by issue).
 * Separate kernels rather than both loops in one: ptxas spilled the FP8 builds (up to 64 bytes)
 * when one kernel held both at the 80-register cap; alone, neither spills. Both compute the same
 * values in the same order (the same bits: tests compare both paths).
 */
enum FwdPath : int {
  kPathGeneral = 0,
  kPathE4M3Smem = 1, /* fast loop, e4m3, gamma / beta as fp32 in shared memory (FwdArgs::gb_off) */
  kPathE5M2Smem = 2,
  kPathE4M3Global = 3, /* fast loop, e4m3, gamma / beta read per row from global memory (L1) */
  kPathE5M2Global = 4,
};
__host__ __device__ constexpr bool fwd_path_e5m2(int path) {
  return path == kPathE5M2Smem || path == kPathE5M2Global;
}
__host__ __device__ constexpr bool fwd_path_smem(int path) {
  return path == kPathE4M3Smem || path == kPathE5M2Smem;
}

/* kMaxThreads: 256 (blocks of up to 256 threads; at most 85 registers, so that 3 CTAs fit an SM:
 * the FP8 epilogue takes 113 registers otherwise) or kMaxRowThreads (rows wider than 256 threads).
 * W (the weight / bias type), kRms and kBias are template parameters, not run-time flags: this
 * kernel is issue-bound (bf16 and FP8 outputs took the same time per element), and the run-time
 * forms cost a dual-predicated conversion per gamma / beta value, a mean subtraction per value
 * for RMSNorm and an FMUL-or-FFMA pair per value. */
template <typename X, typename R, typename O, typename W, bool kRms, bool kBias, int NV,
          int kMaxThreads, int kPath>
__global__ void __launch_bounds__(kMaxThreads, (fwd_min_blocks<R, NV, kMaxThreads>()))
    norm_fwd_reg_kernel(const FwdArgs a) {
  constexpr int VEC = 16 / sizeof(X);
  constexpr int ZW = PackedWords<R, VEC>::kWords; /* z is kept as R values (exact: R holds x) */
  /* Up to 32 values of a 16-bit z per thread (4 vectors) are unpacked into floats right after
   * the loads; more stay packed, two to a register, and are unpacked at each use. The floats are
   * not held in effect: LLVM's CodeGenPrepare sinks a copy of each unpack into every later block
   * that uses it, so each pass unpacks again (PTX). Held for real (an inline-PTX unpack), they
   * cost a CTA per SM, which lost 2-8 points (benchmarks/NOTES.md, P9). Kept as measured on the
   * GPU (its SASS differs from unpacking at each use). */
  constexpr bool kZf = sizeof(R) == 2 && NV * VEC <= 32;
  constexpr bool kFp8 = is_fp8_v<O>;
  /* RowGroupSum<1> (RMSNorm, 2 x 32 floats) or RowGroupSum<2> (LayerNorm, 2 x 32 x 2) */
  __shared__ float red_buf[2 * 32 * (kRms ? 1 : 2)];
  __shared__ ClusterXchgSmem cl_smem;
  __shared__ int amax_buf[32];
  extern __shared__ __align__(16) uint8_t tile[];

  const int tpr = a.tpr;
  const int group = threadIdx.x / tpr;
  const int lr = threadIdx.x - group * tpr;
  const int nvec = a.cols / VEC;
  const int mode = a.mode;
  const bool has_res = a.residual != nullptr;
  /* A cluster of ncl CTAs shares each row (one row group per CTA then): CTA k of the cluster is
   * lanes k * tpr .. (k + 1) * tpr - 1 of a row of ncl * tpr threads. Only 256-thread builds are
   * launched in clusters; the 512-thread build (at its 128-register cap) compiles none of it. */
  const int ncl = kMaxThreads <= kClusterRowThreads ? a.cluster : 1;
  const int glane = ncl > 1 ? cluster_rank() * tpr + lr : lr;
  const int gstride = ncl * tpr;
  int col[NV];
  bool valid[NV];
  row_slots<NV, VEC>(glane, gstride, nvec, col, valid);

  /* gamma / beta are not held in registers across the row loop: as floats they took 2 * NV * VEC
   * registers (64 at NV = 4), which capped the kernel at 2 CTAs of 256 threads per SM. They are
   * re-read per row in the epilogue, one 16-byte vector per slot, from L1 (N * 2 bytes, shared by
   * every row the SM processes). */
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
  const float scale = fwd_fp8_scale<kFp8>(a);
  const bool e5m2 = a.e5m2 != 0;
  float amax = 0.0f;

  /* gamma + g_add and beta as fp32 in shared memory when the launcher found room (gb_off >= 0):
   * the epilogue then reads 16-byte LDS per 4 values instead of converting gamma (and beta) and
   * adding g_add per value per row, the same floats either way (so the same bits). Filled once
   * (fill_row_slots: a plain loop over the slots; unrolled over them it held the loads of all of
   * them in registers at once); slots outside the row hold zeros. */
  const float* gsm = nullptr;
  const int nb = gb_floats(NV, tpr, VEC); /* beta's offset from gamma's, in floats */
  if (a.gb_off >= 0) {
    float* gw = reinterpret_cast<float*>(tile + a.gb_off);
    fill_row_slots(NV, tpr, glane - lr, gstride, nvec, [&](int k, int v) {
      float g[VEC] = {}, b[VEC] = {};
      if (v >= 0) {
        load_gamma_beta_t<W, kBias, VEC>(a, (int64_t)v * VEC, g, b);
#pragma unroll
        for (int j = 0; j < VEC; ++j) g[j] += g_add;
      }
      float* p = gw + k * VEC;
#pragma unroll
      for (int j = 0; j < VEC; j += 4) {
        *reinterpret_cast<float4*>(p + j) = make_float4(g[j], g[j + 1], g[j + 2], g[j + 3]);
        if constexpr (kBias) {
          *reinterpret_cast<float4*>(p + nb + j) = make_float4(b[j], b[j + 1], b[j + 2], b[j + 3]);
        }
      }
    });
    gsm = gw;
  }

  RowGroupSum<1> red(red_buf, tpr, group);   /* RMSNorm's sum z^2 */
  RowGroupSum<2> red2(red_buf, tpr, group);  /* LayerNorm's (E[z], E[z^2]), then sum (z - mean)^2 */
  ClusterXchg xchg(cl_smem, ncl); /* the row's statistics over a cluster (reduce.cuh) */
  const int G = a.rows_per_iter;
  const int rpb = a.tile_rows > 0 ? a.tile_rows : G; /* a multiple of G */
  const int64_t nblk = (a.rows + rpb - 1) / rpb;

  constexpr bool kFast = kPath != kPathGeneral; /* see FwdPath */
  static_assert(!kFast || (kFp8 && kMaxThreads <= kClusterRowThreads),
                "the fast loop is built for FP8 outputs in 256-thread blocks");
  for (int64_t blk = blockIdx.x / ncl; blk < nblk; blk += a.grid_clusters) {
    const int64_t row0 = blk * rpb;
    for (int sub = group; sub < rpb; sub += G) { /* rpb / G iterations for every group */
      const int64_t row = row0 + sub;
      const bool ok = row < a.rows;
      const int64_t r = ok ? row : 0;
      uint32_t zw[NV][ZW]; /* z of this thread's slots, masked slots hold 0 */
      float mean = 0.0f;
      float rs = 0.0f;
      const X* xrow = static_cast<const X*>(a.x) + r * a.x_stride;
      if (!has_res) { /* z = x: keep the loaded words (R == X here, see dispatch) */
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (ok && valid[i]) {
            if constexpr (std::is_same<X, R>::value) {
              load_words<VEC * sizeof(X)>(xrow + col[i], zw[i]);
            } else {
              float xv[VEC];
              load_vec<X, VEC>(xrow + col[i], xv);
              pack_to<R, VEC>(xv, zw[i]); /* exact: R holds every X value */
            }
          } else {
#pragma unroll
            for (int k = 0; k < ZW; ++k) zw[i][k] = 0u;
          }
        }
      } else { /* never in kApply */
        const R* rrow = static_cast<const R*>(a.residual) + r * a.res_stride;
        R* orow = static_cast<R*>(a.residual_out) + r * a.res_out_stride;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (ok && valid[i]) {
            float xv[VEC], rv[VEC];
            load_vec<X, VEC>(xrow + col[i], xv);
            load_vec<R, VEC>(rrow + col[i], rv);
#pragma unroll
            for (int j = 0; j < VEC; ++j) xv[j] += rv[j];
            pack_to<R, VEC>(xv, zw[i]); /* rounds to R: the stored value is normalised */
            store_words<VEC * sizeof(R)>(orow + col[i], zw[i]);
          } else {
#pragma unroll
            for (int k = 0; k < ZW; ++k) zw[i][k] = 0u;
          }
        }
      }
      [[maybe_unused]] float zf[kZf ? NV : 1][kZf ? VEC : 1];
      if constexpr (kZf) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) zf[i][j] = unpack_at<R, VEC>(zw[i], j);
        }
      }
      /* z's value j of slot i (compile-time i and j after unrolling). */
      auto zv = [&](int i, int j) -> float {
        if constexpr (kZf) {
          return zf[i][j];
        } else {
          return unpack_at<R, VEC>(zw[i], j);
        }
      };
      if (!kFast && mode == kApply) {
        if (ok) {
          rs = a.rsigma[row];
          if constexpr (!kRms) mean = a.mu[row];
        }
      } else {
        if constexpr (!kRms) {
          /* One pass: sum z and z^2 (masked slots: z = 0, nothing added), each thread's sums
           * scaled by 1 / N into its shares of E[z] and E[z^2], then one reduction of the pair
           * over the row group and the cluster (unscaled, a cluster's partial sums of z added at
           * ~2.5e8 for a row of 1e4 + noise over 24K values and put the mean 1e-3 off; shares of
           * ~1e3 do not; scaled after the row group's reduction, ptxas spilled); var =
           * E[z^2] - mean^2 where that loses at most 2 bits, else the centred pass about the mean
           * (ln_one_pass_var, norm_common.cuh; NOTES P80). The sums are the same bits in every
           * thread of the row and every CTA of its cluster, so the fallback's reduction is
           * reached by all of them or none. */
          float sq[2] = {0.0f, 0.0f};
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            if (kFast || valid[i]) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                const float z = zv(i, j);
                sq[0] += z;
                sq[1] = fmaf(z, z, sq[1]);
              }
            }
          }
          sq[0] *= a.inv_n;
          sq[1] *= a.inv_n;
          red2(sq);
          cluster_sum<2>(sq, xchg);
          mean = sq[0];
          float var;
          if (!ln_one_pass_var(mean, sq[1], var)) {
            float q[2] = {0.0f, 0.0f};
#pragma unroll
            for (int i = 0; i < NV; ++i) {
              /* a masked slot (z = 0) adds nothing: centred on 0 (kFast: a select, no branch) */
              const float m = valid[i] ? mean : 0.0f;
              if (kFast || valid[i]) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                  const float d = zv(i, j) - m;
                  q[0] = fmaf(d, d, q[0]);
                }
              }
            }
            red2(q); /* q[1] = 0: red2 reduces pairs */
            float c[1] = {q[0]};
            cluster_sum<1>(c, xchg);
            var = c[0] * a.inv_n;
          }
          rs = row_rsigma(var + a.eps);
        } else {
          float q[1] = {0.0f};
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            if (kFast || valid[i]) {
#pragma unroll
              for (int j = 0; j < VEC; ++j) q[0] = fmaf(zv(i, j), zv(i, j), q[0]);
            }
          }
          red(q);
          cluster_sum<1>(q, xchg);
          rs = row_rsigma(q[0] * a.inv_n + a.eps);
        }
        if (ok && glane == 0) {
          a.rsigma[row] = rs;
          if constexpr (!kRms) a.mu[row] = mean;
        }
      }

      /* Epilogue: kFast tests the row once (no barrier below), the general path each slot. One
       * body per form of t (ln_fma_row: a uniform branch per row, not a select per value). */
      if (kFast && !ok) continue;
      O* const out_row = kFast ? static_cast<O*>(a.out) + r * a.out_stride : nullptr;
      const bool fma_row = !kRms && ln_fma_row(rs, mean); /* mean = c on an FMA row */
      auto epilogue = [&](auto fma_tag) {
        constexpr bool kFma = decltype(fma_tag)::value;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          const bool on = ok && valid[i];
          /* kFast: the row's pointer, held; general: recomputed per slot (no spills at the cap) */
          O* const orow = kFast ? out_row : static_cast<O*>(a.out) + row * a.out_stride;
          if (kFast || on) {
            float y[VEC];
            /* kFast: a masked slot has z = 0, gamma = beta = 0 and is centred on 0: y = 0 */
            const float zm = kRms ? 0.0f : (kFast && !valid[i] ? 0.0f : mean);
            if (fwd_path_smem(kPath) || (!kFast && gsm != nullptr)) {
              const float* p = gsm + (i * tpr + lr) * VEC;
#pragma unroll
              for (int j = 0; j < VEC; j += 4) {
                const float4 g = *reinterpret_cast<const float4*>(p + j);
                float4 b = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
                if constexpr (kBias) b = *reinterpret_cast<const float4*>(p + nb + j);
                y[j] = norm_y<kFma>(zv(i, j), zm, rs, g.x, b.x, kBias);
                y[j + 1] = norm_y<kFma>(zv(i, j + 1), zm, rs, g.y, b.y, kBias);
                y[j + 2] = norm_y<kFma>(zv(i, j + 2), zm, rs, g.z, b.z, kBias);
                y[j + 3] = norm_y<kFma>(zv(i, j + 3), zm, rs, g.w, b.w, kBias);
              }
            } else {
              float g[VEC], b[VEC];
              if (kFast && !valid[i]) { /* outside the row: no load (a predicated one in SASS) */
#pragma unroll
                for (int j = 0; j < VEC; ++j) g[j] = b[j] = 0.0f;
              } else {
                load_gamma_beta_t<W, kBias, VEC>(a, col[i], g, b);
#pragma unroll
                for (int j = 0; j < VEC; ++j) g[j] += g_add;
              }
#pragma unroll
              for (int j = 0; j < VEC; ++j) {
                y[j] = norm_y<kFma>(zv(i, j), zm, rs, g[j], b[j], kBias);
              }
            }
            if constexpr (kFp8) {
              if (kFast || mode != kApply) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) amax = amax_update(amax, y[j]);
              }
              if (kFast || mode != kStats) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) y[j] *= scale;
                uint32_t w[VEC / 4];
                if constexpr (kFast && !fwd_path_e5m2(kPath)) {
                  pack_fp8_fmt<VEC, __NV_E4M3>(y, w);
                } else if constexpr (kFast) {
                  pack_fp8_fmt<VEC, __NV_E5M2>(y, w);
                } else {
                  pack_fp8<VEC>(y, e5m2, w);
                }
                if (on) {
                  store_words<VEC>(reinterpret_cast<uint8_t*>(orow) + col[i], w);
                  if (a.tile_rows > 0) store_words<VEC>(tile + sub * a.tile_pitch + col[i], w);
                }
              }
            } else {
              if (on) store_vec<O, VEC>(orow + col[i], y);
            }
          }
        }
      };
      if constexpr (kRms) {
        epilogue(std::false_type{});
      } else {
        with_ln_form(fma_row, epilogue);
      }
    }
    if constexpr (kFp8) {
      if (a.tile_rows > 0) { /* uniform: all threads take this branch together */
        __syncthreads();
        const int64_t left = a.rows - row0;
        const int nr = left < a.tile_rows ? (int)left : a.tile_rows;
        store_tile_transposed(tile, a.tile_pitch, nr, a.cols, a.out_t, a.rows, row0, 0,
                              a.t_vec16 != 0, threadIdx.x, blockDim.x);
        __syncthreads();
      }
    }
  }
  xchg.finish();
  if constexpr (kFp8) {
    if (mode != kApply) block_amax_atomic(amax, a.amax, amax_buf);
  }
}

/* The blocked kernel's packed builds: the vector path (VEC > 1) where z has x's type, a chunk of
 * z held packed (16 registers for 32 values of a 16-bit z) and the build compiled for 2 CTAs per
 * SM (64 registers); the others (an fp32 residual stream under 16-bit x: z as floats; the scalar
 * path) for 1. One 512-thread CTA per SM kept one row in flight per SM and read 43 % of copy at
 * 16K (NOTES P20); two CTAs per SM are what Triton's blocked tiles of the same shape run at
 * (P44); one CTA of 1024 threads (a row of 32K in one chunk) lost 7-17 points to two of 512
 * (NOTES P95). The launcher sends rows from the register path and clusters only to packed builds. */
template <typename X, typename R, int VEC>
constexpr bool fwd_blocked_packed() {
  return VEC > 1 && std::is_same<X, R>::value;
}

/* The blocked kernel's norm: kBlkRuntime reads the norm kind and the bias from FwdArgs and the
 * weight dtype per access (the scalar path, the fp32-residual builds); otherwise bit 0 is RMSNorm
 * and bit 1 a bias, both and the weight type W fixed at compile time (the packed builds, where
 * the run-time forms cost 1.67x Triton's instructions per value: NOTES P44, P45). */
constexpr int kBlkRuntime = -1;
constexpr int blk_kind(bool rms, bool bias) { return (rms ? 1 : 0) | (bias ? 2 : 0); }

template <typename X, typename R, typename O, int VEC, int NVB, typename W = float,
          int kNorm = kBlkRuntime>
__global__ void __launch_bounds__(kMaxRowThreads, (fwd_blocked_packed<X, R, VEC>() ? 2 : 1))
    norm_fwd_blocked_kernel(const FwdArgs a) {
  constexpr bool kFp8 = is_fp8_v<O>;
  constexpr int OVEC = VEC; /* output elements per access */
  /* z of a chunk's slots: packed words of R in the packed builds (fwd_blocked_packed), floats
   * otherwise; zv(i, j) reads value j of slot i either way. */
  constexpr bool kPacked = fwd_blocked_packed<X, R, VEC>();
  constexpr int ZW = kPacked ? VEC * (int)sizeof(R) / 4 : 1; /* PackedWords<R, VEC>::kWords */
  __shared__ float red_buf[2 * 32];
  __shared__ float red2_buf[2 * 32 * 2];
  __shared__ int amax_buf[32];

  const int nt = blockDim.x;
  const int chunk = nt * NVB * VEC;
  const int cols = a.cols;
  const int mode = a.mode;
  constexpr bool kFixed = kNorm != kBlkRuntime;
  constexpr bool kBias = kFixed && (kNorm & 2) != 0;
  const bool is_rms = kFixed ? (kNorm & 1) != 0 : a.is_rms != 0;
  const bool has_bias = kFixed ? kBias : a.bias != nullptr;
  const bool has_res = a.residual != nullptr;
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
  const float scale = fwd_fp8_scale<kFp8>(a);
  const bool e5m2 = a.e5m2 != 0;
  float amax = 0.0f;
  RowGroupSum<1> red(red_buf, nt, 0);   /* RMSNorm's sum z^2 */
  RowGroupSum<2> red2(red2_buf, nt, 0); /* LayerNorm's (E[z], E[z^2]), then E[(z - mean)^2] */

  uint32_t zw[kPacked ? NVB : 1][ZW] = {};
  float zf[kPacked ? 1 : NVB][kPacked ? 1 : VEC] = {};
  auto zv = [&](int i, int j) -> float {
    if constexpr (kPacked) {
      return unpack_at<R, VEC>(zw[i], j);
    } else {
      return zf[i][j];
    }
  };
  /* z of slot i from a row of T (x, or residual_out in pass 2); 0 where invalid. */
  auto load_z = [&](int i, const auto* row, int col, bool valid) {
    using T = std::remove_cv_t<std::remove_pointer_t<decltype(row)>>;
    if constexpr (kPacked) {
      if (valid) {
        load_words<VEC * sizeof(T)>(row + col, zw[i]);
      } else {
#pragma unroll
        for (int k = 0; k < ZW; ++k) zw[i][k] = 0u;
      }
    } else {
      if (valid) {
        load_vec<T, VEC>(row + col, zf[i]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) zf[i][j] = 0.0f;
      }
    }
  };

  /* A row of one chunk keeps its z in registers from pass 1 to pass 2 (and the centred pass):
   * no re-read (NOTES P95). kApply has no pass 1 and reads x. */
  const bool keep_z = cols <= chunk && mode != kApply;
  /* pass 1 loads a chunk's residual before its stores in CTAs of 256 threads or more (below;
   * NOTES P96, P98, P99) */
  const bool batch_res = nt >= 256;
  /* The slots of the chunk at c0 of a row as pass 2 reads them (L2-resident after pass 1):
   * residual_out where pass 1 wrote it, else x; for a row of one chunk (keep_z) their columns
   * only, z being held since pass 1. */
  auto load_chunk = [&](int64_t row, int c0, bool (&valid)[NVB], int (&col)[NVB]) {
    if (keep_z) {
#pragma unroll
      for (int i = 0; i < NVB; ++i) {
        col[i] = c0 + (threadIdx.x + i * nt) * VEC;
        valid[i] = col[i] < cols;
      }
      return;
    }
    const bool z_from_res = has_res && mode != kApply;
    const X* zx = static_cast<const X*>(a.x) + row * a.x_stride;
    const R* zr = z_from_res ? static_cast<const R*>(a.residual_out) + row * a.res_out_stride
                             : nullptr;
#pragma unroll
    for (int i = 0; i < NVB; ++i) {
      col[i] = c0 + (threadIdx.x + i * nt) * VEC;
      valid[i] = col[i] < cols;
      if (z_from_res) {
        load_z(i, zr, col[i], valid[i]);
      } else {
        load_z(i, zx, col[i], valid[i]);
      }
    }
  };

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    float mean = 0.0f;
    float rs;
    if (mode != kApply) {
      const X* xrow = static_cast<const X*>(a.x) + row * a.x_stride;
      const R* rrow = has_res ? static_cast<const R*>(a.residual) + row * a.res_stride : nullptr;
      R* orow = has_res ? static_cast<R*>(a.residual_out) + row * a.res_out_stride : nullptr;
      float ss = 0.0f; /* running sum of z^2 */
      float sz = 0.0f; /* LayerNorm: running sum of z */
      for (int c0 = 0; c0 < cols; c0 += chunk) {
        bool valid[NVB];
        int col[NVB];
#pragma unroll
        for (int i = 0; i < NVB; ++i) {
          col[i] = c0 + (threadIdx.x + i * nt) * VEC;
          valid[i] = col[i] < cols; /* VEC divides cols on the vector path */
          load_z(i, xrow, col[i], valid[i]);
        }
        if (has_res) {
          /* z = round_R(x + residual), stored as residual_out. In CTAs of 256 threads or more
           * (16-bit rows of 8K and wider) every slot's residual is loaded before the chunk's
           * first store: the compiler keeps a load after an earlier store it cannot prove apart
           * from it, and that store waits for its own slot's load, which made one DRAM round trip
           * per slot (NOTES P95, P96 / P97: 32K +2 to +5 points, P98: 8K +2 to +3). Smaller
           * CTAs (2K-4K, many per SM to hide that wait) load each slot's residual before its own
           * store only, 0.4-2.6 points better there (P98, P99). Held as raw words on the vector
           * path (16 registers for a 16-bit residual), as floats on the scalar one (VEC = 1: not
           * whole words). */
          constexpr bool kRw = VEC * sizeof(R) % 4 == 0;
          constexpr int RW = kRw ? VEC * (int)sizeof(R) / 4 : 1;
          [[maybe_unused]] uint32_t rw[kRw ? NVB : 1][RW];
          [[maybe_unused]] float rf[kRw ? 1 : NVB][kRw ? 1 : VEC];
          auto load_r = [&](int i) {
            if constexpr (kRw) {
              load_words<VEC * sizeof(R)>(rrow + col[i], rw[i]);
            } else {
              load_vec<R, VEC>(rrow + col[i], rf[i]);
            }
          };
          if (batch_res) {
#pragma unroll
            for (int i = 0; i < NVB; ++i) {
              if (valid[i]) load_r(i);
            }
          }
          auto rv = [&](int i, int j) -> float {
            if constexpr (kRw) {
              return unpack_at<R, VEC>(rw[i], j);
            } else {
              return rf[i][j];
            }
          };
#pragma unroll
          for (int i = 0; i < NVB; ++i) {
            if (valid[i]) {
              if (!batch_res) load_r(i);
              float z[VEC];
#pragma unroll
              for (int j = 0; j < VEC; ++j) z[j] = round_to<R>(zv(i, j) + rv(i, j));
              if constexpr (kPacked) {
                pack_to<R, VEC>(z, zw[i]); /* exact: z is already rounded to R */
              } else {
#pragma unroll
                for (int j = 0; j < VEC; ++j) zf[i][j] = z[j];
              }
              store_vec<R, VEC>(orow + col[i], z);
            }
          }
        }
        /* masked slots hold z = 0: nothing added */
#pragma unroll
        for (int i = 0; i < NVB; ++i) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            if (!is_rms) sz += zv(i, j);
            ss = fmaf(zv(i, j), zv(i, j), ss);
          }
        }
      }
      float var;
      if (is_rms) {
        float v[1] = {ss};
        red(v);
        var = v[0] * a.inv_n;
      } else {
        /* LayerNorm (NOTES P80): each thread's shares of E[z] and E[z^2], one reduction of the
         * pair; var = E[z^2] - mean^2 where that loses at most 2 bits (ln_one_pass_var,
         * norm_common.cuh), else a walk over the row again (L2) for the centred mean square.
         * Uniform over the CTA (every thread holds the same sums). */
        float v[2] = {sz * a.inv_n, ss * a.inv_n};
        red2(v);
        mean = v[0];
        if (!ln_one_pass_var(mean, v[1], var)) {
          float q[2] = {0.0f, 0.0f};
          for (int c0 = 0; c0 < cols; c0 += chunk) {
            bool valid[NVB];
            int col[NVB];
            load_chunk(row, c0, valid, col);
#pragma unroll
            for (int i = 0; i < NVB; ++i) {
              if (valid[i]) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) {
                  const float d = zv(i, j) - mean;
                  q[0] = fmaf(d, d, q[0]);
                }
              }
            }
          }
          q[0] *= a.inv_n;
          red2(q);
          var = q[0];
        }
      }
      rs = row_rsigma(var + a.eps);
      if (threadIdx.x == 0) {
        a.rsigma[row] = rs;
        if (!is_rms) a.mu[row] = mean;
      }
    } else {
      rs = a.rsigma[row];
      mean = is_rms ? 0.0f : a.mu[row];
    }

    /* Pass 2: re-read z (L2-resident), write y; one body per form of t (ln_fma_row). */
    const bool fma_row = !is_rms && ln_fma_row(rs, mean); /* mean = c on an FMA row */
    auto pass2 = [&](auto fma_tag) {
      constexpr bool kFma = decltype(fma_tag)::value;
      for (int c0 = 0; c0 < cols; c0 += chunk) {
        bool valid[NVB];
        int col[NVB];
        load_chunk(row, c0, valid, col);
#pragma unroll
        for (int i = 0; i < NVB; ++i) {
          if (valid[i]) {
            float gv[VEC], bv[VEC], y[OVEC];
            if constexpr (kFixed) {
              load_gamma_beta_t<W, kBias, VEC>(a, col[i], gv, bv);
            } else {
              load_gamma_beta<VEC>(a, col[i], has_bias, gv, bv);
            }
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              y[j] = norm_y<kFma>(zv(i, j), mean, rs, gv[j] + g_add, bv[j], has_bias);
            }
            if constexpr (kFp8) {
              if (mode != kApply) {
#pragma unroll
                for (int j = 0; j < VEC; ++j) amax = amax_update(amax, y[j]);
              }
              if (mode != kStats) {
                uint8_t* orow = static_cast<uint8_t*>(a.out) + row * a.out_stride + col[i];
                if constexpr (VEC % 4 == 0) {
#pragma unroll
                  for (int j = 0; j < VEC; ++j) y[j] *= scale;
                  uint32_t w[VEC / 4];
                  pack_fp8<VEC>(y, e5m2, w);
                  store_words<VEC>(orow, w);
                } else {
#pragma unroll
                  for (int j = 0; j < VEC; ++j) orow[j] = fp8_from_float(y[j] * scale, e5m2);
                }
              }
            } else {
              O* orow = static_cast<O*>(a.out) + row * a.out_stride;
              /* A row of one chunk (z held since pass 1): one vector store per 16 bytes, where
               * store_vec made four 4-byte stores (store_words_v). Measured (NOTES P124 / P125,
               * kernel time, means of two alternations, three calls): under the blocked knob
               * LayerNorm bf16 16K +5 to +7 on the H100 (one chunk), RMSNorm +1.5 to +4, the
               * residual rows at 8K (their default kernel) +0.9 to +1.6 on the H100 and the
               * H200. The same store on rows of two chunks lost 1-4 points on the
               * H100 (32K, every 16-bit form; the residual form on the H200 too) and gained with
               * Triton's L2 eviction hints beside it (P125, branch s38-blocked-hints): rows of
               * several chunks keep store_vec until that is measured on both cards. */
              constexpr bool kVecStore = VEC * sizeof(O) % 8 == 0;
              if (kVecStore && keep_z) {
                if constexpr (kVecStore) {
                  uint32_t w[PackedWords<O, VEC>::kWords];
                  pack_to<O, VEC>(y, w);
                  store_words_v<VEC * (int)sizeof(O)>(orow + col[i], w);
                }
              } else {
                store_vec<O, VEC>(orow + col[i], y);
              }
            }
          }
        }
      }
    };
    with_ln_form(fma_row, pass2);
  }
  if constexpr (kFp8) {
    if (mode != kApply) block_amax_atomic(amax, a.amax, amax_buf);
  }
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_CUH_
