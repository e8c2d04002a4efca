/*
 * Streamed cluster backward (sm_90): rows of 16-bit z and dy split over a thread-block cluster,
 * each CTA owning a contiguous slice of tpr * NV 16-byte vectors of the row, the rows streamed
 * through a ring of shared-memory stages by cp.async, kStreamDepth rows ahead of the one reduced.
 *
 * Why: the cluster kernels of launch_bwd_wide (rows past 32K) hold their slice of a row in
 * registers, so no load of the next row starts before the current one has been reduced over the
 * cluster and its dx stored, and their cluster barrier per row (barrier.cluster.arrive.release)
 * waits for the acknowledgement of every earlier global store of the arriving thread: fwd+bwd
 * 46-60 % of copy at 32K-128K (benchmarks/NOTES.md, session 16; ncu in P49b: barrier and membar
 * stalls). Here the copies of the next rows are in flight while one row is reduced; a row's
 * per-CTA sums travel by st.async into every CTA's shared memory, counted by an mbarrier (no
 * fence on the stores), and the wait for them sits behind the phase B of an earlier row (L = 2;
 * the kernel is written for L = 1 as well, which measured slower after P69: NOTES P70):
 *
 *   iteration k:  copy row k+D;  wait for row k's copies;
 *                 phase A of row k: dweight / dbias partials and each warp's (c2, c1) sums, sent
 *                 by lane r to cluster rank r;
 *                 phase B of row k-L: dx (and dres) from its c1 / c2;
 *                 wait for row k-L+1's sums from every warp of every CTA and add them in a fixed
 *                 order (the same bits in every CTA).
 *
 * Each thread copies and later reads only its own 16-byte vectors (slot i of thread t at vector
 * rank * tpr * NV + i * tpr + t of the row; in shared memory at ((operand * NV + i) * tpr + t) * 16
 * of its stage, conflict-free), so cp.async's per-thread completion (wait_group) is the only
 * synchronisation the data needs. A vector past the row is zero-filled by the copy and then adds
 * zeros to every sum; its stores are masked. gamma (+ the zero-centred 1) is held as floats in
 * registers for the whole kernel, the partials too, and the cluster writes one workspace row
 * (its CTAs their slices) for norm_bwd_reduce_kernel: deterministic, as the other paths.
 * The formulas and the order of operations per value are the register path's (norm_bwd.cuh).
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_BWD_STREAM_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_BWD_STREAM_CUH_

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "normalization/norm_common.cuh"

namespace engine {
namespace norm {

/* Rows copied ahead of the one reduced (D; four measured no faster than two: NOTES P50). */
constexpr int kStreamDepth = 2;
/* Rows between a row's phase A and its phase B (L): the kernel is written for 1 or 2, and runs 2.
 * P51 measured 2 no faster (RMSNorm) or up to 4 points slower (LayerNorm) when the kernel ran ~29
 * instructions per value; after P69 (24 per value) the exchange's wait was exposed, and 2 measured
 * +3 to +5 (RMSNorm, 4K-128K) and +3 to +8.5 (LayerNorm, 4K-8K and 32K-128K; 16K within the
 * spread) of fwd+bwd kernel time (NOTES P70). */
constexpr int kStreamLag = 2;
constexpr int kStreamNV = 2;           /* 16-byte vectors per thread and operand */
constexpr int kStreamMaxThreads = 512; /* CTA threads (launch bound: up to 128 registers) */
constexpr int kStreamMaxCluster = 16;
/* Shared-memory stages of the ring at lag L: rows k-L .. k+D. */
__host__ __device__ constexpr int stream_stages(int lag) { return kStreamDepth + lag + 1; }

template <typename Z, typename DY, int NV, bool kRms, bool kHasDb, int L>
__global__ void __launch_bounds__(kStreamMaxThreads, 1) norm_bwd_stream_kernel(const BwdArgs a) {
  static_assert(sizeof(Z) == 2 && sizeof(DY) == 2, "the streamed backward takes 16-bit z and dy");
  static_assert(L == 1 || L == 2, "lag 1 or 2");
  constexpr int VEC = 8;
  constexpr int D = kStreamDepth;
  constexpr int kStages = stream_stages(L);
  /* Row k's sums use slot k % kSlots. A CTA sends row k only after its wait for row k-L, which
   * completes once every warp of every CTA has sent row k-L, which each does after its reads of
   * row k-L-1's slot: so 2L slots (rows k-2L+1 .. k may be in use), and each receiver's mbarrier
   * of the slot has completed row k-2L's phase before row k's sends reach it. */
  constexpr int kSlots = 2 * L;
  /* [slot][source rank][source warp][c2, c1]: every warp's row sums, sent by every CTA of the
   * cluster to every CTA (st.async), counted by mbar[slot] */
  static_assert(kStreamMaxCluster <= kPairXchgMaxCluster && kStreamMaxThreads / 32 <= kPairXchgMaxWarps,
                "the exchange's arrays hold every rank and warp");
  __shared__ __align__(8) PairRecv<kSlots> recv;
  __shared__ uint64_t mbar[kSlots];
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
  const int count = cid < a.rows ? (int)((a.rows - 1 - cid) / stride + 1) : 0;
  const uint32_t ring_s = smem_u32(ring) + (uint32_t)(t * 16); /* this thread's slot 0 */
  const int stage_bytes = 2 * NV * T * 16;
  const uint32_t step = (uint32_t)T * 16; /* between a thread's slots */
  bool in_row[NV];                        /* which of this thread's vectors lie inside the row */
#pragma unroll
  for (int i = 0; i < NV; ++i) in_row[i] = v0 + i * T < nvec;
  /* dx in z's dtype without a separate dresidual output: phase B's common case, whose stores
   * are typed at compile time (the other cases dispatch on the run-time dtypes per vector) */
  const bool dx_plain = a.dres == nullptr && a.dx_dtype == TypeInfo<Z>::dtype;

  float g[NV][VEC];
  float dw[NV][VEC];
  float db[kHasDb ? NV : 1][VEC];
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = v0 + i * T;
    if (v < nvec) {
      load_vec_dt<VEC>(a.weight, (int64_t)v * VEC, a.w_dtype, g[i]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[i][j] += g_add;
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[i][j] = 0.0f;
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dw[i][j] = 0.0f;
      if constexpr (kHasDb) db[i][j] = 0.0f;
    }
  }

  /* Per-row addresses are advanced from row to row, not derived from the row index (NOTES P69):
   * the stages of the next copy, of phase A and of phase B (each thread's slot 0 of z; slot i of
   * operand op (0: z, 1: dy) is at + (op * NV + i) * step; the ring wraps after kStages), the next
   * copy's sources and phase B's dx (this thread's first vector of the cluster's next row). The copy's offsets per slot are fixed: i * T vectors, or 0 past
   * the row, where the copy reads nothing (zero-fill). */
  const StageRing stages{ring_s, ring_s + (uint32_t)(kStages * stage_bytes), (uint32_t)stage_bytes};
  uint32_t st_copy = ring_s, st_a = ring_s, st_b = ring_s;
  const Z* z_next = static_cast<const Z*>(a.x) + cid * a.x_stride + (int64_t)v0 * VEC;
  const DY* dy_next = static_cast<const DY*>(a.dy) + cid * a.dy_stride + (int64_t)v0 * VEC;
  const int64_t z_step = stride * a.x_stride, dy_step = stride * a.dy_stride;
  int c_off[NV];
#pragma unroll
  for (int i = 0; i < NV; ++i) c_off[i] = in_row[i] ? i * T * VEC : 0;
  Z* dx_next = static_cast<Z*>(a.dx) + cid * a.dx_stride + (int64_t)v0 * VEC; /* dx_plain */
  const int64_t dx_step = stride * a.dx_stride;

  /* The copies of the next row (k) into its stage, whose last row (k - kStages) had its phase B
   * in an earlier iteration (an empty group past the last row, so that every thread commits one
   * group per iteration and wait<D> means "row k has landed"). */
  auto issue = [&](int k) {
    if (k < count) {
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        cp_async16(st_copy + (uint32_t)i * step, z_next + c_off[i], in_row[i]);
        cp_async16(st_copy + (uint32_t)(NV + i) * step, dy_next + c_off[i], in_row[i]);
      }
      z_next += z_step;
      dy_next += dy_step;
      st_copy = stages.next(st_copy);
    }
    cp_async_commit();
  };
  auto slots = [&](uint32_t base, int i, float (&zv)[VEC], float (&dv)[VEC]) {
    lds_vec8<Z>(base + (uint32_t)i * step, zv);
    lds_vec8<DY>(base + (uint32_t)(NV + i) * step, dv);
  };
  /* rsigma (and mu) of the cluster's rows, 32 at a time: lane l of every warp holds row 32 b + l
   * of block b (blk_*) and of block b + 1 (nxt_*, loaded a block ahead), and row k's are
   * shuffled out of the block at its phase A. Loaded per row, one row ahead, the values were
   * moved into uniform registers (R2UR) right after their loads, which stalled every warp on an
   * L2 round trip per row wherever ptxas kept them there (LayerNorm's backward at 128 registers:
   * -7 to -13 points of fwd+bwd, NOTES P69); per lane they stay in vector registers. */
  const int lane = t & 31;
  auto load_blk = [&](int b, float& rs, float& mu) {
    const int kk = 32 * b + lane;
    rs = mu = 0.0f;
    if (kk < count) {
      const int64_t row = cid + (int64_t)kk * stride;
      rs = a.rsigma[row];
      if constexpr (!kRms) mu = a.mu[row];
    }
  };
  float blk_rs, blk_mu, nxt_rs, nxt_mu;
  load_blk(0, blk_rs, blk_mu);
  load_blk(1, nxt_rs, nxt_mu);

  const PairXchgAddr xa = pair_xchg_init(recv, mbar, rank, C);
#pragma unroll
  for (int d = 0; d < D; ++d) issue(d);
  /* rs / mu of rows k, k-1, .., k-L (index j: row k-j), shifted once per iteration */
  float rsh[L + 1], muh[L + 1];
#pragma unroll
  for (int j = 0; j <= L; ++j) rsh[j] = muh[j] = 0.0f;
  rsh[0] = __shfl_sync(kFullMask, blk_rs, 0); /* row 0's */
  muh[0] = kRms ? 0.0f : __shfl_sync(kFullMask, blk_mu, 0);
  float k2_p = 0.0f, k1_p = 0.0f; /* row k-L's, from the previous iteration's wait */
  for (int k = 0; k < count + L; ++k) {
    issue(k + D);
    /* row k+1's rsigma / mu, shuffled out of its block here and first used in the next iteration */
    const int kn = k + 1;
    if ((kn & 31) == 0) { /* block kn / 32 starts: the next one is loaded */
      blk_rs = nxt_rs;
      blk_mu = nxt_mu;
      load_blk(kn / 32 + 1, nxt_rs, nxt_mu);
    }
    const float rs_n = __shfl_sync(kFullMask, blk_rs, kn & 31);
    const float mu_n = kRms ? 0.0f : __shfl_sync(kFullMask, blk_mu, kn & 31);
    const int kb = k - L; /* phase B's row index */
    /* row kb's dresidual, read here so that phase A covers its latency */
    float dr[NV][VEC];
    const bool has_dr = a.dresidual != nullptr && kb >= 0;
    if (has_dr) {
      const int64_t row = cid + (int64_t)kb * stride;
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        const int v = v0 + i * T;
        if (v < nvec) {
          load_vec_dt<VEC>(a.dresidual, row * a.dresidual_stride + (int64_t)v * VEC, a.dres_dtype, dr[i]);
        }
      }
    }
    cp_async_wait<D>();
    /* k < count, kb >= 0, kw in [0, count): uniform over the cluster, whose CTAs share the row
     * sequence */
    if (k < count) { /* phase A of row k */
      const int q = (int)((unsigned)k % (unsigned)kSlots);
      float s[2] = {0.0f, 0.0f};
      const uint32_t sa = st_a;
      st_a = stages.next(st_a);
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        float zv[VEC], dv[VEC];
        slots(sa, i, zv, dv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float xhat = (kRms ? zv[j] : zv[j] - muh[0]) * rsh[0];
          const float dyg = dv[j] * g[i][j];
          dw[i][j] = fmaf(dv[j], xhat, dw[i][j]);
          if constexpr (kHasDb) db[i][j] += dv[j];
          s[0] = fmaf(dyg, xhat, s[0]);
          if constexpr (!kRms) s[1] += dyg;
        }
      }
      /* (c2, c1; c1: LayerNorm) over the warp, sent by lane r to rank r (kSlots' comment: why
       * the slot is free) */
      warp_sum_pair<!kRms>(s);
      pair_xchg_send(xa, q, C, s[0], s[1]);
    }
    if (kb >= 0) { /* phase B of row kb */
      const uint32_t sb = st_b;
      st_b = stages.next(st_b);
      /* dz of slot i (past the row: computed from the copy's zeros and never stored) */
      auto dz_of = [&](int i, float (&dz)[VEC]) {
        float zv[VEC], dv[VEC];
        slots(sb, i, zv, dv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float dyg = dv[j] * g[i][j];
          dz[j] = fmaf(dyg, rsh[L], kRms ? zv[j] * k2_p : fmaf(zv[j] - muh[L], k2_p, k1_p));
        }
        if (has_dr) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) dz[j] += dr[i][j];
        }
      };
      if (dx_plain) { /* the row's address once, one predicated store per vector (NOTES P58) */
        Z* dxr = dx_next;
        dx_next += dx_step;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          float dz[VEC];
          dz_of(i, dz);
          uint32_t w[VEC / 2];
          pack_to<Z, VEC>(dz, w);
          store_words_if<VEC * 2>(dxr + (int64_t)i * T * VEC, w, in_row[i]);
        }
      } else {
        const int64_t row = cid + (int64_t)kb * stride;
#pragma unroll
        for (int i = 0; i < NV; ++i) {
          if (in_row[i]) {
            float dz[VEC];
            dz_of(i, dz);
            const int64_t col = (int64_t)(v0 + i * T) * VEC;
            store_vec_dt<VEC>(a.dx, row * a.dx_stride + col, a.dx_dtype, dz);
            if (a.dres != nullptr) store_vec_dt<VEC>(a.dres, row * a.dres_stride + col, a.dres_dtype, dz);
          }
        }
      }
    }
    const int kw = kb + 1; /* the row whose sums this iteration waits for */
    if (kw >= 0 && kw < count) {
      /* every warp's sums of every CTA, added in a fixed order (the same bits in every CTA) */
      float s[2];
      pair_xchg_gather<!kRms>(recv, xa, (int)((unsigned)kw % (unsigned)kSlots),
                             ((unsigned)kw / (unsigned)kSlots) & 1u, s);
      const float c2 = s[0] * a.inv_n;
      const float c1 = kRms ? 0.0f : s[1] * a.inv_n;
      /* dz = rs * (dyg - xhat * c2 - c1) as in the register path (NOTES P40); row kw's rs / mu
       * sit at index L - 1 now and at L in the next iteration, whose phase B is row kw's */
      k2_p = -(rsh[L - 1] * rsh[L - 1]) * c2;
      k1_p = -rsh[L - 1] * c1;
    }
#pragma unroll
    for (int j = L; j > 0; --j) {
      rsh[j] = rsh[j - 1];
      muh[j] = muh[j - 1];
    }
    rsh[0] = rs_n;
    muh[0] = mu_n;
  }
  cluster_sync(); /* no CTA exits while a send to it may be in flight */

  float* wsd = a.ws_dw + cid * a.ws_pitch;
  float* wsb = a.ws_db != nullptr ? a.ws_db + cid * a.ws_pitch : nullptr;
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = v0 + i * T;
    if (v < nvec) {
      store_vec<float, VEC>(wsd + (int64_t)v * VEC, dw[i]);
      if constexpr (kHasDb) store_vec<float, VEC>(wsb + (int64_t)v * VEC, db[i]);
    }
  }
}

/* Whether the streamed kernel takes a row of `cols` 16-bit values: from engine_set_norm_bwd_
 * stream_from's width where it is set, else from kStreamFromDefault. Measured on the H200 (fwd+bwd
 * kernel time, % of copy, other paths -> streamed; NOTES P51, P52): RMSNorm 2K-128K 86 / 82 / 72
 * / 79 / 60 / 53 / 47 -> 86 / 86 / 85 / 84 / 77 / 71 / 67, LayerNorm 81 / 75 / 65 / 62 / 51 / 45 /
 * 38 -> 82 / 81 / 79 / 77 / 67 / 64 / 55: from 4K (2K ties). */
constexpr int kStreamFromDefault = 4096;
inline bool bwd_take_stream(int cols, int stream_from) {
  return cols >= (stream_from != 0 ? stream_from : kStreamFromDefault);
}

/* The build of the streamed kernel for (norm, dbias partials) at lag L. */
template <typename Z, typename DY, int L>
auto bwd_stream_kernel(bool rms, bool has_db) -> void (*)(BwdArgs) {
  constexpr int NV = kStreamNV;
  return rms ? (has_db ? &norm_bwd_stream_kernel<Z, DY, NV, true, true, L>
                       : &norm_bwd_stream_kernel<Z, DY, NV, true, false, L>)
             : (has_db ? &norm_bwd_stream_kernel<Z, DY, NV, false, true, L>
                       : &norm_bwd_stream_kernel<Z, DY, NV, false, false, L>);
}

/* Launch the streamed kernel for 16-bit z and dy with 16-byte vectors: the smallest cluster (a
 * power of two up to ctx.max_cluster, at least 2: the kernel's barriers need sm_90's clusters)
 * whose CTAs of at most ctx.bwd_stream_threads threads (0: kStreamMaxThreads) hold the row at
 * kStreamNV vectors per thread and operand, with a ring of stream_stages(kStreamLag) stages that
 * fits the opt-in shared memory. Returns false (nothing launched) where none fits. */
template <typename Z, typename DY>
bool launch_bwd_stream(BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas, int* num_ctas,
                       engine_status* st) {
  if constexpr (sizeof(Z) == 2 && sizeof(DY) == 2) {
    constexpr int NV = kStreamNV;
    const int tmax = ctx.bwd_stream_threads != 0 ? ctx.bwd_stream_threads : kStreamMaxThreads;
    int tpr = 0;
    const int c = stream_cluster((int)ceil_div(a.cols / 8, NV), ctx.max_cluster, kStreamMaxCluster,
                                 tmax, &tpr);
    if (c == 0) return false;
    const size_t stage = (size_t)2 * NV * tpr * 16;
    const size_t room = (size_t)ctx.max_smem_optin - 12288; /* the kernel's static shared memory */
    const size_t smem = (size_t)stream_stages(kStreamLag) * stage;
    if (smem > room) return false;
    void (*kernel)(BwdArgs) = bwd_stream_kernel<Z, DY, kStreamLag>(a.is_rms != 0, a.ws_db != nullptr);
    const void* fn = reinterpret_cast<const void*>(kernel);
    int active = 0;
    *st = active_clusters(fn, tpr, smem, c, &active);
    if (*st != ENGINE_SUCCESS) return true;
    int64_t grid = persistent_clusters(a.rows, active, ctx.sm_count, ctx.sm_margin);
    if (grid > max_ctas) grid = max_ctas;
    a.cluster = c;
    a.tpr = tpr;
    a.rows_per_iter = 1;
    a.grid_clusters = (int)grid;
    a.gb_off = -1;
    *num_ctas = (int)grid;
    *st = launch_in_clusters(kernel, grid * c, tpr, smem, c, ctx.stream, a);
    return true;
  }
  return false;
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_BWD_STREAM_CUH_
