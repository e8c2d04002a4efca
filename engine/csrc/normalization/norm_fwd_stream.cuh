/*
 * Streamed cluster forward (sm_90): rows of a 16-bit x (and, in kRes builds, a residual and
 * residual_out of x's dtype) split over a thread-block cluster, each CTA owning a contiguous
 * slice of tpr * NV 16-byte vectors of the row, the rows streamed through a ring of
 * shared-memory stages by cp.async, kFwdStreamDepth rows ahead of the one reduced. The backward's recipe (norm_bwd_stream.cuh) for the forward.
 *
 * Why: the register kernel's cluster rows (norm_fwd.cuh) load a row only after they stored the
 * previous one; at 2-3 CTAs of 8 warps per SM they wait on their own loads (ncu, RMSNorm 64K:
 * long-scoreboard 4.4 stalls per issued instruction, 35 % of warp slots active; NOTES P53), and
 * that kernel, at its 80-register cap, has no room for copies ahead (P54, P55: ptxas spills).
 * Here each thread copies the next rows' vectors of its own into shared memory while one row is
 * reduced, and the row sums travel by st.async into every CTA's shared memory, counted by an
 * mbarrier (no barrier.cluster per row: its release waits for the previous row's stores).
 *
 *   iteration k:  copy row k+D;  wait for row k's copies;
 *                 phase A of row k, each warp's sums sent by lane r to rank r: RMSNorm the sum of
 *                   z^2; LayerNorm the sum of z and, about the warp's own mean, of (z - mean)^2
 *                   (from one pass's sums of z and z^2 where exact enough: ln_one_pass_m2);
 *                 phase B of row k-2 (y, its stores, amax);
 *                 wait for row k-1's sums from every warp of every CTA: rsigma(k-1) (and the
 *                   mean), phase B's in the next iteration.
 * A row's sums are awaited one iteration after they are sent, so the exchange's round trip between
 * SMs sits behind phase A of the next row and a phase B (NOTES P67, P68). LayerNorm's statistics
 * are each warp's (n, sum, M2), M2 from one pass's sums of z and z^2 where that loses at most 2
 * bits and from a second, centred pass over the stage otherwise (ln_one_pass_m2, NOTES P80),
 * merged across warps and CTAs by Chan's formula (pair_xchg_gather_chan): no E[z^2] - E[z]^2
 * cancellation for large-mean rows. The sums over warps and CTAs are added in a fixed order
 * (pair_xchg_gather):
 * the same bits in every CTA and every run. Each thread copies and later reads only its
 * own 16-byte vectors (slot i of thread t at vector rank * T * NV + i * T + t of the row; in
 * shared memory at (i * T + t) * 16 of its stage), so cp.async's per-thread completion is the
 * only synchronisation the data needs; a vector past the row is zero-filled by the copy (it adds
 * zeros to the sums of z and z^2 and, about a zero mean, to the centred sum; its stores are
 * predicated off).
 * kRes (the fused residual add, NOTES P89): a stage holds the slice's x vectors and then its
 * residual vectors (twice the bytes: CTAs of at most kFwdStreamResMaxThreads); phase A adds them,
 * rounds z = x + r to x's dtype (the register kernel's arithmetic: the same residual_out bits),
 * stores residual_out, writes z back over x's vectors in the stage (each thread only its own, as
 * the copies) and sums the rounded z, so phase B and LayerNorm's centred pass read z where they
 * read x. Vectors past the row are zero-filled for both (z = 0) and their stores predicated off.
 * gamma (+ the zero-centred 1) and beta are held as floats in registers for the whole kernel.
 * Modes kFull (any output dtype; FP8 with a given scale, fused amax) and kStats (current scaling's
 * first pass: statistics and amax, no output). Current scaling's second pass (kApply) reads the
 * statistics back and computes y with the same formula (norm_y) on the register path: the same
 * bits as this kernel's kFull output, so current scaling's FP8 output is delayed scaling's at the
 * same scale, and the cast of the fp32 output wherever that output takes this kernel too
 * (fwd_take_stream: RMSNorm's FP8 outputs take it from 16K, the other rows from 32K, but for
 * non-FP8 rows of exactly 32768 the lean kernel on one card per norm, fwd_lean_cols; on a lean
 * card an FP8 output in delayed scaling without a transposed copy only past 32K).
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_STREAM_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_STREAM_CUH_

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "normalization/norm_common.cuh"
#include "normalization/norm_fwd.cuh"

namespace engine {
namespace norm {

constexpr int kFwdStreamDepth = 2;        /* rows copied ahead of the one reduced (D) */
constexpr int kFwdStreamNV = 4;           /* 16-byte vectors of x per thread */
constexpr int kFwdStreamMaxThreads = 512; /* CTA threads (launch bound: up to 128 registers) */
/* The largest CTA the launcher picks (engine_set_norm_fwd_stream_threads: another) */
constexpr int kFwdStreamThreadsDefault = 512;
constexpr int kFwdStreamMaxCluster = 16;
/* The largest CTA of a kRes build: its stages hold x and the residual (5 x 2 x 16 KB at 256) */
constexpr int kFwdStreamResMaxThreads = 256;
/* The largest CTA the launcher picks for rows of `cols` (engine_set_norm_fwd_stream_threads
 * unset): kFwdStreamThreadsDefault, but on a card of lean DRAM bandwidth per SM (`lean`:
 * lean_dram, the H100) from 64K the CTA of a 16-CTA cluster (128 threads at 64K, 256 at 128K:
 * more, smaller CTAs per SM). Kernel time, % of the H100's copy, 512 / 256 / 128 threads (NOTES
 * Q17): 64K RMSNorm e4m3 82.1 / 84.5 / 83.8, LayerNorm e4m3 77.4 / 77.3 / 82.1, RMSNorm +
 * residual (256 by default) 89.2 / 92.1, LayerNorm + residual 86.3 / 90.0; 128K RMSNorm e4m3
 * 84.0 / 86.3, LayerNorm e4m3 80.5 / 83.6; the 16-bit outputs within 1-2 points either way; at
 * 32K 512 stays ahead. On the H200 the smaller CTAs lost at 64K-128K (P79, Q14: LayerNorm e4m3
 * 64K 71.0 -> 60.3 at 128 threads). Every output dtype alike: a row's sums then add in the same
 * order for an FP8 output as for the fp32 one, whose cast it is (NOTES P109: with the FP8 outputs
 * alone on the smaller CTAs, LayerNorm's 64K-128K e4m3 / e5m2 bytes missed that cast at rounding
 * boundaries, tests/test_fp8.py). */
inline int fwd_stream_threads_default(int cols, bool lean) {
  if (!lean || cols < 65536) return kFwdStreamThreadsDefault;
  const int per_cta = (int)ceil_div(cols, 8 * kFwdStreamNV * 16); /* threads of a 16-CTA cluster */
  int t = 128;
  while (t < per_cta && t < kFwdStreamThreadsDefault) t *= 2;
  return t;
}
/* Rows between a row's phase A and its phase B: 2. Both norms wait for a row's sums one
 * iteration after sending them (WL below), so the exchange's round trip between SMs hides behind
 * phase A of the next row and one phase B, where waiting in the sending iteration left it behind
 * one phase B (ncu: 17 % of the stall samples on the exchange's mbarrier, NOTES Q3, P67, P68). */
__host__ __device__ constexpr int fwd_stream_lag(bool /* rms */) { return 2; }
/* Shared-memory stages of the ring: rows k - lag .. k + D. */
__host__ __device__ constexpr int fwd_stream_stages(bool rms) {
  return kFwdStreamDepth + fwd_stream_lag(rms) + 1;
}

/* LayerNorm's gather (pair_xchg_gather's exchange, reduce.cuh, for Chan's formula): each entry
 * is one warp's (sum, M2 about the warp's own mean) over n_e values, n_e and 1 / n_e (0 where
 * n_e = 0: a warp past the row) from tables the same in every CTA. Chan's formula, M2 = sum_e
 * (M2_e + n_e (m_e - mean)^2) with m_e = sum_e / n_e, in one round where that is exact enough
 * (NOTES P118): about a reference r = m_0 (entry 0, rank 0's warp 0, always inside the row), with
 * d_e = m_e - r, D = sum_e n_e d_e and B = sum_e (M2_e + n_e d_e^2), the row's mean = r + D / N and
 * M2 = B - D^2 / N, taken where D^2 / N <= 3/4 B (ln_one_pass_m2: at most 2 bits lost to the
 * subtraction). That holds wherever the warps' means lie near each other against the spread,
 * rows of 1e4 + noise included. Otherwise (a warp's mean far from the others', or NaN / Inf) a
 * second round adds the centred terms about that mean (the two-round form: no E[z^2] - E[z]^2).
 * Each round adds as pair_xchg_gather adds (lane l: entries l, l + 32, ..., then the xor
 * butterfly), so every warp of every CTA of the cluster gets the same bits and takes the same
 * branch. The two-round form ran two dependent butterflies per row and warp (ncu: the gather and
 * its wait held 45 % of the stall samples of LayerNorm 64K on the H100, NOTES P118). */
template <int kSlots>
__device__ __forceinline__ void pair_xchg_gather_chan(const PairRecv<kSlots>& recv, const PairXchgAddr& x,
                                                      int q, unsigned parity, const float* n_e,
                                                      const float* inv_e, float inv_n, float& mean,
                                                      float& m2) {
  mbar_wait(x.bar + (uint32_t)q * 8u, parity);
  const float2* flat = reinterpret_cast<const float2*>(&recv[q][0][0]);
  const float r = flat[0].x * inv_e[0];
  float s[2]; /* D, B */
  pair_xchg_add<true>(flat, x.n,
                      [&](int e, float2 v, float (&a)[2]) {
                        const float d = fmaf(v.x, inv_e[e], -r);
                        const float nd = n_e[e] * d;
                        a[0] += nd;
                        a[1] += fmaf(nd, d, v.y);
                      },
                      s);
  mean = fmaf(s[0], inv_n, r);
  if (warp_uniform(ln_one_pass_m2(s[0], s[1], inv_n, m2))) return; /* the same bits in every lane */
  const float mu = mean; /* round 2: the centred terms about the mean */
  pair_xchg_add<false>(flat, x.n,
                       [&](int e, float2 v, float (&a)[2]) {
                         const float d = fmaf(v.x, inv_e[e], -mu);
                         a[0] += fmaf(n_e[e] * d, d, v.y);
                       },
                       s);
  m2 = s[0];
}

/* y = norm_y(z, mean, rsigma, gamma, beta) of one row's 16-bit x in clusters; the formula and
 * the FP8 cast are the register kernel's (norm_fwd.cuh). */
template <typename X, typename O, bool kRms, bool kBias, bool kRes>
__global__ void __launch_bounds__(kFwdStreamMaxThreads, 1) norm_fwd_stream_kernel(const FwdArgs a) {
  static_assert(sizeof(X) == 2, "the streamed forward takes a 16-bit x");
  constexpr int VEC = 8;
  constexpr int NV = kFwdStreamNV;
  constexpr int D = kFwdStreamDepth;
  constexpr int LB = fwd_stream_lag(kRms);
  constexpr int WL = 1; /* iterations between an exchange's send and its wait */
  constexpr uint32_t kStages = (uint32_t)fwd_stream_stages(kRms);
  constexpr bool kFp8 = is_fp8_v<O>;
  /* Exchange k (sent in iteration k, awaited in iteration k + WL) uses slot k % kSlots: a warp
   * sends exchange k only after its wait for exchange k - 1 - WL (iteration k - 1), which
   * completes once every warp of every CTA sent that exchange, which each does after its reads
   * (gather) of exchange k - 2 - 2 WL: 2 (WL + 1) slots, as in norm_bwd_stream.cuh (2 L). */
  constexpr int kSlots = 2 * (WL + 1);
  /* [slot][source rank][source warp][the pair]: every warp's sums, sent by every CTA of the
   * cluster to every CTA (st.async), counted by mbar[slot] */
  static_assert(kFwdStreamMaxCluster <= kPairXchgMaxCluster &&
                    kFwdStreamMaxThreads / 32 <= kPairXchgMaxWarps,
                "the exchange's arrays hold every rank and warp");
  __shared__ __align__(8) PairRecv<kSlots> recv;
  __shared__ uint64_t mbar[kSlots];
  __shared__ int amax_buf[32];
  /* LayerNorm: values per exchange entry rank * W + warp of the row (W = T / 32), and their
   * reciprocals (0 for none), the same in every CTA (pair_xchg_gather_chan) */
  __shared__ float n_ent[kRms ? 1 : kFwdStreamMaxCluster * kPairXchgMaxWarps];
  __shared__ float inv_ent[kRms ? 1 : kFwdStreamMaxCluster * kPairXchgMaxWarps];
  extern __shared__ __align__(16) uint8_t ring[];

  const int T = blockDim.x;
  const int t = threadIdx.x;
  const int C = a.cluster;
  const int nvec = a.cols / VEC;
  const int rank = cluster_rank();
  const int v0 = rank * T * NV + t;
  const int64_t cid = blockIdx.x / C;
  const int64_t stride = a.grid_clusters;
  /* rows of this cluster: cid, cid + stride, ... (fewer than 2^31) */
  const uint32_t count = cid < a.rows ? (uint32_t)((a.rows - 1 - cid) / stride + 1) : 0u;
  const uint32_t ring_s = smem_u32(ring) + (uint32_t)(t * 16); /* this thread's slot 0 */
  const uint32_t step = (uint32_t)T * 16;                       /* between its slots */
  /* x's vectors, then (kRes) the residual's at r_part */
  const uint32_t r_part = (uint32_t)(NV * T * 16);
  const int stage_bytes = (kRes ? 2 : 1) * NV * T * 16;
  const bool store_y = a.mode != kStats;
  /* Which of this thread's vectors lie inside the row. Those past it were zero-filled by the
   * copy: phase A adds their zeros, phase B computes them with gamma = beta = 0 and a zero mean
   * (y = 0, which leaves amax alone) and skips only their stores, one predicated instruction
   * each instead of a branch around the whole vector. */
  bool in_row[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) in_row[i] = v0 + i * T < nvec;

  float g[NV][VEC];
  float be[kBias ? NV : 1][VEC];
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = v0 + i * T;
    if (in_row[i]) {
      load_vec_dt<VEC>(a.weight, (int64_t)v * VEC, a.w_dtype, g[i]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[i][j] += g_add;
      if constexpr (kBias) load_vec_dt<VEC>(a.bias, (int64_t)v * VEC, a.w_dtype, be[i]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        g[i][j] = 0.0f;
        if constexpr (kBias) be[i][j] = 0.0f;
      }
    }
  }
  const float scale = fwd_fp8_scale<kFp8>(a);
  float amax = 0.0f;
  /* mean (LayerNorm) and rsigma of phase B's row (k - LB), set by the previous iteration's wait,
   * and LayerNorm's form of t for it (ln_fma_row: fma_b, where mean_b holds c = -mean * rsigma) */
  float mean_b = 0.0f, rs_b = 0.0f;
  bool fma_b = false;
  /* The FMA form for FP8 and fp32 outputs only: those must be the statistics pass's bits (current
   * scaling's apply pass, on the register path) and each other's (tests/test_fp8.py:
   * same_row_sums); the 16-bit outputs, bound to neither, lost 1.4 points with it at 16K-64K
   * (NOTES P87) and keep (z - mean) * rsigma. */
  constexpr bool kFmaOut = !kRms && (kFp8 || sizeof(O) == 4);
  if constexpr (!kRms) { /* the tables, read after pair_xchg_init's barrier */
    const int nw = T >> 5;
    for (int e = t; e < C * nw; e += T) {
      const int r = e / nw, w = e % nw;
      int n = 0;
#pragma unroll
      for (int i = 0; i < NV; ++i) n += min(max(nvec - (r * T * NV + i * T + w * 32), 0), 32);
      n_ent[e] = (float)(n * VEC);
      inv_ent[e] = n > 0 ? 1.0f / (float)(n * VEC) : 0.0f;
    }
  }

  /* Per-row addresses are advanced from row to row, not derived from the row index (NOTES P69):
   * the stages of the next copy, of phase A and of phase B (each thread's slot 0; the ring wraps
   * after kStages), the next copy's source and phase B's destination (this thread's first vector
   * of the cluster's next row). The copy's offsets per slot are fixed: i * T vectors, or 0 past
   * the row, where the copy reads nothing (zero-fill). */
  const StageRing stages{ring_s, ring_s + kStages * (uint32_t)stage_bytes, (uint32_t)stage_bytes};
  uint32_t st_copy = ring_s, st_a = ring_s, st_b = ring_s;
  const X* x_next = static_cast<const X*>(a.x) + cid * a.x_stride + (int64_t)v0 * VEC;
  const int64_t x_step = stride * a.x_stride;
  int x_off[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) x_off[i] = in_row[i] ? i * T * VEC : 0;
  uint8_t* o_next = static_cast<uint8_t*>(a.out) + (cid * a.out_stride + (int64_t)v0 * VEC) * (int64_t)sizeof(O);
  const int64_t o_step = stride * a.out_stride * (int64_t)sizeof(O);
  /* kRes: the next copy's residual source and phase A's residual_out destination (x's offsets) */
  const X* r_next = kRes ? static_cast<const X*>(a.residual) + cid * a.res_stride + (int64_t)v0 * VEC : nullptr;
  const int64_t r_step = stride * a.res_stride;
  X* ro_next = kRes ? static_cast<X*>(a.residual_out) + cid * a.res_out_stride + (int64_t)v0 * VEC : nullptr;
  const int64_t ro_step = stride * a.res_out_stride;
  /* The copies of the next row (k) into its stage, whose last row (k - kStages) had its phase B
   * in an earlier iteration (an empty group past the last row, so that every thread commits one
   * group per iteration and wait<D> means "row k has landed"). */
  auto issue = [&](uint32_t k) {
    if (k < count) {
#pragma unroll
      for (int i = 0; i < NV; ++i) cp_async16(st_copy + (uint32_t)i * step, x_next + x_off[i], in_row[i]);
      x_next += x_step;
      if constexpr (kRes) {
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          cp_async16(st_copy + r_part + (uint32_t)i * step, r_next + x_off[i], in_row[i]);
        }
        r_next += r_step;
      }
      st_copy = stages.next(st_copy);
    }
    cp_async_commit();
  };
  /* Phase B of row k - LB (its stage st_b, its output o_next): y, its stores (kOut 1: e4m3, 2:
   * e5m2, 3: O itself; 0: none, kStats) and amax. The store kind and the form of t (kFma:
   * ln_fma_row) are template arguments so that the per-vector code has no branch on the mode, the
   * FP8 format or the form (one uniform branch per row picks the instance). */
  auto phase_b = [&](auto out_kind, auto fma_tag) {
    constexpr int kOut = decltype(out_kind)::value;
    constexpr bool kFma = decltype(fma_tag)::value;
    const uint32_t sb = st_b;
    const float mb = kRms ? 0.0f : mean_b;
    uint8_t* orow = o_next;
    const int ostep = T * VEC * (int)sizeof(O);
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      float z[VEC], y[VEC];
      lds_vec8<X>(sb + (uint32_t)i * step, z);
      /* a zero mean past the row: y = 0 there for any mean and finite rsigma (an infinite one,
       * eps = 0 on a constant row, makes the row's own y NaN as well) */
      const float m = kRms ? 0.0f : (in_row[i] ? mb : 0.0f);
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        y[j] = norm_y<kFma>(z[j], m, rs_b, g[i][j], kBias ? be[kBias ? i : 0][j] : 0.0f, kBias);
      }
      uint8_t* op = orow + (int64_t)i * ostep;
      if constexpr (kOut == 3) {
        uint32_t w[VEC * sizeof(O) / 4];
        pack_to<O, VEC>(y, w);
        store_words_if<VEC * (int)sizeof(O)>(op, w, in_row[i]);
      } else {
#pragma unroll
        for (int j = 0; j < VEC; ++j) amax = amax_update(amax, y[j]);
        if constexpr (kOut != 0) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) y[j] *= scale;
          uint32_t w[VEC / 4];
          pack_fp8_fmt<VEC, kOut == 2 ? __NV_E5M2 : __NV_E4M3>(y, w);
          store_words_if<VEC>(op, w, in_row[i]);
        }
      }
    }
  };

  const PairXchgAddr xa = pair_xchg_init(recv, mbar, rank, C);
  /* LayerNorm: 1 / the values of this thread's warp inside the row (0 for none) */
  const float inv_nw = kRms ? 0.0f : inv_ent[rank * (T >> 5) + (t >> 5)];
#pragma unroll
  for (int d = 0; d < D; ++d) issue((uint32_t)d);
  for (uint32_t k = 0; k < count + (uint32_t)LB; ++k) {
    issue(k + D);
    cp_async_wait<D>();
    /* k < count, kb, kw: uniform over the cluster, whose CTAs share the row sequence */
    if (k < count) { /* phase A of row k */
      const uint32_t sa = st_a;
      st_a = stages.next(st_a);
      float s[2] = {0.0f, 0.0f};
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float z[VEC];
        lds_vec8<X>(sa + (uint32_t)i * step, z);
        if constexpr (kRes) { /* z = round_X(x + r): stored, put back in the stage, summed */
          float rv[VEC];
          lds_vec8<X>(sa + r_part + (uint32_t)i * step, rv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) z[j] += rv[j];
          uint32_t w[4];
          pack_to<X, VEC>(z, w);
          sts_words16(sa + (uint32_t)i * step, w);
          store_words_if<16>(ro_next + i * T * VEC, w, in_row[i]);
#pragma unroll
          for (int j = 0; j < VEC; ++j) z[j] = unpack_at<X, VEC>(w, j);
        }
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          if constexpr (kRms) {
            s[0] = fmaf(z[j], z[j], s[0]);
          } else {
            s[0] += z[j];
            s[1] = fmaf(z[j], z[j], s[1]);
          }
        }
      }
      warp_sum_pair<!kRms>(s); /* over the warp: every lane holds the warp's sums */
      if constexpr (!kRms) {
        /* the warp's sum of squares about its mean: from the one pass where that loses at most
         * 2 bits (ln_one_pass_m2, norm_common.cuh; the same bits in every lane, so the branch is
         * uniform over the warp), else a second, centred pass over the stage (past the row: the
         * copy's zeros about a zero mean add exact zeros) */
        float m2;
        if (!warp_uniform(ln_one_pass_m2(s[0], s[1], inv_nw, m2))) {
          const float mw = s[0] * inv_nw;
          float q[2] = {0.0f, 0.0f};
#pragma unroll
          for (int i = 0; i < NV; ++i) {
            const float m = in_row[i] ? mw : 0.0f;
            float z[VEC];
            lds_vec8<X>(sa + (uint32_t)i * step, z);
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              const float dz = z[j] - m;
              q[0] = fmaf(dz, dz, q[0]);
            }
          }
          warp_sum_pair<false>(q);
          m2 = q[0];
        }
        s[1] = m2;
      }
      if constexpr (kRes) ro_next += ro_step;
      /* sent by lane r to rank r (kSlots' comment: why the slot is free) */
      pair_xchg_send(xa, (int)(k % (uint32_t)kSlots), C, s[0], s[1]);
    }
    if (k >= (uint32_t)LB) { /* phase B of row k - LB */
      auto run_b = [&](auto out_kind) {
        if constexpr (!kFmaOut) {
          phase_b(out_kind, std::false_type{});
        } else {
          with_ln_form(warp_uniform(fma_b), [&](auto form) { phase_b(out_kind, form); });
        }
      };
      if constexpr (!kFp8) {
        run_b(std::integral_constant<int, 3>{});
      } else if (!store_y) {
        run_b(std::integral_constant<int, 0>{});
      } else if (a.e5m2 != 0) {
        run_b(std::integral_constant<int, 2>{});
      } else {
        run_b(std::integral_constant<int, 1>{});
      }
      st_b = stages.next(st_b);
      o_next += o_step;
    }
    /* wait for exchange kw = k - WL (sent WL iterations ago); add its sums in the fixed order:
     * rsigma (and the mean) of row kw, phase B's in the next iteration */
    if (k >= (uint32_t)WL && k - (uint32_t)WL < count) {
      const uint32_t kw = k - (uint32_t)WL;
      const int q = (int)(kw % (uint32_t)kSlots);
      const unsigned parity = (kw / (uint32_t)kSlots) & 1u;
      const bool writer = rank == 0 && t == 0;
      if constexpr (kRms) {
        float s[2];
        pair_xchg_gather<false>(recv, xa, q, parity, s);
        rs_b = row_rsigma(s[0] * a.inv_n + a.eps);
      } else {
        float m2;
        pair_xchg_gather_chan(recv, xa, q, parity, n_ent, inv_ent, a.inv_n, mean_b, m2);
        rs_b = row_rsigma(m2 * a.inv_n + a.eps);
        if (writer) a.mu[cid + (int64_t)kw * stride] = mean_b;
        if constexpr (kFmaOut) fma_b = ln_fma_row(rs_b, mean_b); /* mean_b = c on an FMA row */
      }
      if (writer) a.rsigma[cid + (int64_t)kw * stride] = rs_b;
    }
  }
  cluster_sync(); /* no CTA exits while a send to it may be in flight */
  if constexpr (kFp8) block_amax_atomic(amax, a.amax, amax_buf);
}

/* Whether the streamed forward takes a row of `cols` values to an FP8 output (`fp8`) or another:
 * from engine_set_norm_fwd_stream_from's width where it is set (every output dtype: A/B runs),
 * else from fwd_stream_from_default, per norm and output kind. FP8 covers both scalings: delayed
 * scaling's kFull and current scaling's kStats both run with O = fp8 (norm_api.cu dispatches
 * either pass on the FP8 out dtype: fwd_out_fp8), so current scaling's statistics are delayed
 * scaling's and its bytes delayed scaling's at the same scale, except where delayed scaling
 * without a transposed copy takes another kernel (`alone`, P133 below): there they are those of
 * delayed scaling with the copy. Measured (kernel time, % of copy,
 * register path -> streamed): on the H200 (NOTES P59/P67/P68) FP8 outputs gained one width below
 * the others (RMSNorm 16K e4m3 75.0 -> 81.7, LayerNorm 8K e4m3 60.5 -> 68.3), which lost there
 * (RMSNorm 16K bf16 86.3 -> 82.7, LayerNorm 8K bf16 80.0 -> 76.5), so FP8 from 16K (RMSNorm) /
 * 8K (LayerNorm), the others from 32K / 16K. Session 30 (H100, two alternations each; NOTES
 * P101, P102) measured the register path ahead of the stream for LayerNorm below 32K (bf16 16K
 * 84.3 -> 91.9; e4m3 16K 76.8 -> 84.4, 8K 85.9 against the stream's 74-79; current scaling 2.1
 * behind at 16K, the transposed copy 1.0 ahead); at 32K the register path gained for e4m3 alone
 * (77.9 -> 83.5) and lost with the transposed copy (-2.1) and current scaling (-3.5). So
 * LayerNorm takes the stream from 32K for every output, as RMSNorm's non-FP8 outputs; RMSNorm's
 * FP8 outputs keep it from 16K, where the launcher asks fwd_take_blocked first, which takes
 * 4K-16K (P100), so the stream's RMSNorm FP8 rows start just above 16K. The path fixes the order
 * of a row's sums: at RMSNorm 16K-32K an FP8 output is no longer the exact cast of the same
 * call's fp32 output (the register path's) but within one FP8 step of it, at rounding
 * boundaries only (tests/test_fp8.py::cuda_fp8_own_path). Session 30 measured on H100s only; on
 * the H200 LayerNorm's FP8 rows lost 7-10 points on the register path (NOTES P116, kernel time,
 * two alternations, register path -> stream: e4m3 8K 67.5-68.3 -> 74.3-75.0, 16K 65.2-65.5 -> 75.7,
 * + T 16K 55.8 -> 60.9-61.3, current scaling 16K +2.9), so a card that is not lean (`lean`:
 * lean_dram) streams LayerNorm's FP8 rows from 8K, as before P101; its 16-bit rows keep 32K.
 * Session 30's losses at 32K were the transposed copy's and current scaling's; delayed scaling
 * with no transposed copy (`alone`: mode kFull, FwdArgs::t_wanted 0) gains on the clusters on a
 * lean card at every width to 32K (NOTES Q25 / Q26, H100, kernel time, three alternations, the
 * stream -> the clusters: RMSNorm e4m3 20K / 24K / 28K / 32K 84.3 / 82.2 / 82.9 / 84.6 -> 86.1 /
 * 86.8 / 85.5 / 86.8, LayerNorm 32K 77.7 -> 82.7; past 32K the stream leads by 1.6-13.5; with the
 * copy at 32K the clusters lose 1-2, the tiled transpose after them running slower), so there
 * such rows take the stream only past 32K (P133). */
inline int fwd_stream_from_default(bool rms, bool fp8, bool res, bool lean, bool alone) {
  /* the fused residual add, before the blocked kernel (NOTES P89, P90); a non-FP8 output past
   * 16K, the blocked kernel taking its rows of one chunk (fwd_take_blocked has P130's numbers) */
  if (res) return fp8 ? 16384 : 16384 + 1;
  if (fp8 && lean && alone) return 32768 + 1; /* P133 */
  if (fp8) return rms ? 16384 : (lean ? 32768 : 8192);
  /* LayerNorm's rows on a card that is not lean (the H200) past 32K: 32K itself on the clusters
   * (NOTES Q23 / P131, kernel time: three alternations over two calls, the stream 75.7-78.6
   * against the clusters 80.0-80.9; the A/B of the defaults, 76.7-78.1 -> 79.7-80.5; at 64K /
   * 128K the stream leads by 11-15) */
  return rms || lean ? 32768 : 32768 + 1;
}
/* The default's one gap: the fused residual add at 32K-64K goes to the blocked kernel
 * (fwd_take_blocked), which, since it loads a chunk's residual before its stores (P96), beat the
 * stream there (H200, kernel time, % of copy, two alternations, h200_ab_s29_p96_stream.log, bf16
 * out: 32K RMSNorm 86.3 -> 87.5, LayerNorm 82.5 -> 86.8; at 64K the stream wins, 87.9 / 83.2
 * against 77.9 / 76.5; at 16K they tied then, 85.8 / 81.3 against 84.9 / 81.3), for every output
 * dtype since P103 (H100, e4m3 out, two alternations, h100_ab_s30_p103_knob.log: 32K RMSNorm 89.1
 * -> 89.1, LayerNorm 82.7 -> 87.0; an FP8 output had kept the stream, within one FP8 step of the
 * fp32 output's cast; now its exact cast). The knob (stream_from != 0) has no gap. */
inline bool fwd_take_stream(int cols, int stream_from, bool rms, bool fp8, bool res, bool lean,
                            bool alone) {
  if (stream_from != 0) return cols >= stream_from;
  if (res && cols >= 32768 && cols < 65536) return false; /* NOTES P96 / P97 / P103 */
  return cols >= fwd_stream_from_default(rms, fp8, res, lean, alone);
}

template <typename X, typename O, bool kRes>
auto fwd_stream_kernel_r(bool rms, bool bias) -> void (*)(FwdArgs) {
  return rms ? (bias ? &norm_fwd_stream_kernel<X, O, true, true, kRes>
                     : &norm_fwd_stream_kernel<X, O, true, false, kRes>)
             : (bias ? &norm_fwd_stream_kernel<X, O, false, true, kRes>
                     : &norm_fwd_stream_kernel<X, O, false, false, kRes>);
}
template <typename X, typename O>
auto fwd_stream_kernel(bool rms, bool bias, bool res) -> void (*)(FwdArgs) {
  return res ? fwd_stream_kernel_r<X, O, true>(rms, bias) : fwd_stream_kernel_r<X, O, false>(rms, bias);
}

/* Launch the streamed kernel for a 16-bit x, without a residual (z = x) or with one of x's dtype
 * (kRes), modes kFull and kStats, where fwd_take_stream says so: the smallest cluster (a power of
 * two up to ctx.max_cluster, at least 2: the kernel's sends and barriers are cluster
 * instructions) whose CTAs of at most ctx.fwd_stream_threads threads (0: fwd_stream_threads_default;
 * kRes: at most kFwdStreamResMaxThreads) hold the row at kFwdStreamNV vectors per thread, with a
 * ring of fwd_stream_stages stages that fits the opt-in shared memory. Returns false (nothing
 * launched) where it does not apply or fit; the caller's x / out (and residual / residual_out)
 * allow 16-byte vector access. */
template <typename X, typename R, typename O>
bool launch_fwd_stream(FwdArgs& a, const LaunchCtx& ctx, engine_status* st) {
  if constexpr (sizeof(X) == 2 && std::is_same<X, R>::value) {
    constexpr int NV = kFwdStreamNV;
    const bool res = a.residual != nullptr;
    if (a.mode == kApply) return false;
    if (!fwd_take_stream(a.cols, ctx.fwd_stream_from, a.is_rms != 0, is_fp8_v<O>, res,
                         ctx.lean_dram != 0, a.mode == kFull && a.t_wanted == 0)) {
      return false;
    }
    int tmax = ctx.fwd_stream_threads != 0
                   ? ctx.fwd_stream_threads
                   : fwd_stream_threads_default(a.cols, ctx.lean_dram != 0);
    if (res && tmax > kFwdStreamResMaxThreads) tmax = kFwdStreamResMaxThreads;
    int tpr = 0;
    const int c = stream_cluster((int)ceil_div(a.cols / 8, NV), ctx.max_cluster, kFwdStreamMaxCluster,
                                 tmax, &tpr);
    if (c == 0) return false;
    const bool rms = a.is_rms != 0;
    const size_t smem = (size_t)fwd_stream_stages(rms) * NV * tpr * 16 * (res ? 2 : 1);
    const size_t room = (size_t)ctx.max_smem_optin - 16384; /* its static shared memory: up to 10.4 KB */
    if (smem > room) return false;
    void (*kernel)(FwdArgs) = fwd_stream_kernel<X, O>(rms, a.bias != nullptr, res);
    int active = 0;
    *st = active_clusters(reinterpret_cast<const void*>(kernel), tpr, smem, c, &active);
    if (*st != ENGINE_SUCCESS) return true;
    const int64_t grid = persistent_clusters(a.rows, active, ctx.sm_count, ctx.sm_margin);
    a.cluster = c;
    a.tpr = tpr;
    a.rows_per_iter = 1;
    a.tile_rows = 0;
    a.out_t = nullptr;
    a.gb_off = -1;
    a.grid_clusters = (int)grid;
    *st = launch_in_clusters(kernel, grid * c, tpr, smem, c, ctx.stream, a);
    return true;
  }
  return false;
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_STREAM_CUH_
