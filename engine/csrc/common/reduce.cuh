/*
 * Warp, row-group and block reductions (device side).
 *
 * Determinism: every reduction has a fixed combination order that depends only on the launch
 * shape, so results are bitwise identical run to run. The xor-butterfly sums give every lane of a
 * group the same bits (float addition is commutative, and each level adds the same two partial
 * sums on both sides), so all threads of a row agree on mean / rsigma without a broadcast.
 *
 * Row groups: a CTA is split into groups of `tpr` consecutive threads, each reducing its own row.
 * tpr is a power of two <= 32 (the group lives inside one warp: shuffles only) or a multiple of 32
 * (any number of warps, not necessarily a power of two: warp partials go through shared memory and
 * every thread sums its group's partials in warp order, after a barrier over the group's warps:
 * a named barrier per group). Every thread of the CTA must call the reducer the same number of
 * times (the kernels keep their row loops uniform across the CTA and mask invalid rows instead of
 * skipping them), because the multi-warp case uses a barrier.
 */
#ifndef ENGINE_CSRC_COMMON_REDUCE_CUH_
#define ENGINE_CSRC_COMMON_REDUCE_CUH_

#include <stdint.h>

#include "common/dtype.cuh"

namespace engine {

constexpr unsigned kFullMask = 0xffffffffu;

/* p, which the caller knows to be the same in every lane of the warp (a row group's when the
 * group spans whole warps, tpr >= 32), through a vote, so that ptxas sees a branch on it as
 * uniform: no reconvergence bookkeeping (BSSY / BSYNC) and, measured in the lean FP8 kernel's lab
 * twin (benchmarks/NOTES.md, Q78c / P183), registers enough to keep the held gamma / beta values
 * as floats. All 32 lanes must be active. */
__device__ __forceinline__ bool warp_uniform(bool p) { return __all_sync(kFullMask, p); }

/* Sum of K values over row groups of `tpr` threads; every thread gets its group's sums.
 * `buf` is shared memory of 2 * 32 * K floats; the two halves alternate between calls so that one
 * barrier per call suffices (a half is rewritten only after the next call's barrier, which
 * every thread reaches after finishing its reads of the previous use).
 * The caller passes its group's index (threadIdx.x / tpr, which the row kernels hold anyway), so
 * that no call divides: recomputed per call, `threadIdx.x / tpr` for the barrier and
 * `warp / wpr` for the group's first warp cost two integer divisions and, with the butterfly's
 * levels tested by branches, about 110 executed instructions per call and thread at a row of 2
 * warps (ncu per SASS line, benchmarks/NOTES.md, P17); held as members, the derived values cost
 * the 80-register kernels spills. The butterfly shuffles at every level and adds where the level
 * lies inside the group (a predicated add): the same additions in the same order as a loop over
 * the group's levels, so the same bits. */
template <int K>
struct RowGroupSum {
  float* buf;
  int parity;
  int tpr;
  int group;

  __device__ __forceinline__ RowGroupSum(float* shared_buf, int tpr_, int group_)
      : buf(shared_buf), parity(0), tpr(tpr_), group(group_) {}

  __device__ __forceinline__ void operator()(float (&v)[K]) {
    const int width = tpr < 32 ? tpr : 32;
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int k = 0; k < K; ++k) {
        const float o = __shfl_xor_sync(kFullMask, v[k], off);
        if (off < width) v[k] += o;
      }
    }
    if (tpr > 32) {
      const int wpr = tpr >> 5;
      const int warp = threadIdx.x >> 5;
      const int first = group * wpr;
      float* b = buf + parity * 32 * K;
      if ((threadIdx.x & 31) == 0) {
#pragma unroll
        for (int k = 0; k < K; ++k) b[warp * K + k] = v[k];
      }
      /* Named barrier 1 + group over the group's warps when the CTA holds several groups (at
       * most 8: tpr >= 64, blockDim <= 512), so that a group waits for its own warps only;
       * __syncthreads otherwise (barrier 0 stays the CTA-wide one). */
      if ((int)blockDim.x > tpr) {
        asm volatile("bar.sync %0, %1;" ::"r"(1 + group), "r"(tpr) : "memory");
      } else {
        __syncthreads();
      }
#pragma unroll
      for (int k = 0; k < K; ++k) {
        float s = b[first * K + k];
        for (int j = 1; j < wpr; ++j) s += b[(first + j) * K + k];
        v[k] = s;
      }
      parity ^= 1;
    }
  }
};

/* Thread-block clusters (sm_90): a row split over the CTAs of a cluster, each CTA holding its
 * slice of the row in registers, as Quack does for wide rows; the per-row sums meet in
 * distributed shared memory. Device code compiled for an earlier architecture has no clusters:
 * there cluster_rank() is 0 and a cluster reduction traps (the launchers never ask for one there:
 * DeviceInfo::clusters is set only for an sm_90+ device running sm_90+ device code). */
__device__ __forceinline__ int cluster_rank() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  unsigned r;
  asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
  return (int)r;
#else
  return 0;
#endif
}

/* Barrier over every thread of the cluster; shared-memory writes before it are visible to every
 * CTA of the cluster after it (release / acquire). Called uniformly by all threads. */
__device__ __forceinline__ void cluster_sync() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;"
               ::: "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}

/* mbarriers and st.async (sm_90): a CTA sends values into the shared memory of the CTAs of its
 * cluster, each send completing bytes of the receiver's mbarrier transaction count, and a
 * receiver waits on its own mbarrier only. Unlike barrier.cluster (cluster_sync), whose release
 * orders every earlier memory access of the arriving thread, global stores included, a send
 * orders nothing but itself: a kernel streaming stores past its per-row reductions does not wait
 * for their acknowledgement at every row (the streamed backward, norm_bwd_stream.cuh).
 * mbar_init: by one thread, then mbar_init_fence() and a cluster_sync() before any send. */
__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return (uint32_t)__cvta_generic_to_shared(p);
}
__device__ __forceinline__ void mbar_init(uint64_t* bar, unsigned count) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(smem_u32(bar)), "r"(count) : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void mbar_init_fence() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
#endif
}
/* This thread's arrival at `bar` (of this CTA; its shared::cta address), raising the phase's
 * expected transaction bytes by `bytes` (sends may have completed some already: the count may go
 * below zero meanwhile). */
__device__ __forceinline__ void mbar_arrive_expect_tx(uint32_t bar, unsigned bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
#elif defined(__CUDA_ARCH__)
  (void)bar, (void)bytes;
  __trap();
#endif
}
__device__ __forceinline__ void mbar_arrive_expect_tx(uint64_t* bar, unsigned bytes) {
  mbar_arrive_expect_tx(smem_u32(bar), bytes);
}
/* Wait until the phase of `bar` (its shared::cta address) with the given parity (0 for its 1st,
 * 3rd, ... phase) completes; the sends it counted are then visible to this thread. */
__device__ __forceinline__ void mbar_wait(uint32_t bar, unsigned parity) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  uint32_t done = 0;
  do {
    asm volatile(
        "{\n\t.reg .pred p;\n\t"
        "mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n\t"
        "selp.u32 %0, 1, 0, p;\n\t}"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
  } while (!done);
#elif defined(__CUDA_ARCH__)
  (void)bar, (void)parity;
  __trap();
#endif
}
__device__ __forceinline__ void mbar_wait(uint64_t* bar, unsigned parity) { mbar_wait(smem_u32(bar), parity); }
/* The shared::cluster address of this CTA's shared::cta address `p` in cluster CTA `rank`. */
__device__ __forceinline__ uint32_t mapa_u32(uint32_t p, int rank) {
  uint32_t r = 0;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(p), "r"(rank)); /* pure: may be hoisted */
#elif defined(__CUDA_ARCH__)
  (void)p, (void)rank;
  __trap();
#endif
  return r;
}
/* Send two floats to the shared::cluster address `rp` (8-byte aligned, from mapa_u32), completing
 * 8 transaction bytes of the mbarrier at `rb` (the same CTA's, from mapa_u32). */
__device__ __forceinline__ void st_async_f2(uint32_t rp, uint32_t rb, float a, float b) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v2.f32 [%0], {%1, %2}, [%3];"
               ::"r"(rp), "f"(a), "f"(b), "r"(rb)
               : "memory");
#elif defined(__CUDA_ARCH__)
  (void)rp, (void)rb, (void)a, (void)b;
  __trap();
#endif
}

/* The per-row exchange of the streamed cluster kernels (norm_fwd_stream.cuh, norm_bwd_stream.cuh),
 * over arrays the kernel declares in shared memory: recv[slot][entry][pair] (PairRecv)
 * and one mbarrier per slot. pair_xchg_init: once, by every thread (zeroes recv, then a cluster
 * barrier; returns the thread's addresses, PairXchgAddr). Per row: pair_xchg_send by every thread
 * (each warp's pair, the same in all its lanes, sent by lane r to cluster rank r; thread 0 raises
 * its own CTA's expected bytes), later
 * pair_xchg_gather by every thread: the wait on this CTA's mbarrier, then lane l adds the entries
 * l, l + 32, ... of the slot's C * W pairs, entry rank * W + warp (W = the CTA's warps: a compact
 * array, so that a cluster of small CTAs reads only its own entries), and the warp adds the lanes
 * (warp_sum_pair): the same values in the same order in every warp of every CTA of the cluster,
 * so the same bits. (The earlier forms: lane w adding warp w's C pairs over the ranks ran a rank
 * loop of C loads per lane in half the lanes, ~60 instructions per row at C = 8, NOTES P58; entry
 * rank * 16 + warp read C * 16 pairs whatever W, 6 zeros of every 8 in the streamed forward's
 * 128-thread CTAs at 64K on a lean card, NOTES P118.) When a slot may be reused is the kernels'
 * argument (their kSlots). */
constexpr int kPairXchgMaxCluster = 16;
constexpr int kPairXchgMaxWarps = 16;
/* [slot][entry rank * W + warp][pair], W the CTA's warps */
template <int kSlots>
using PairRecv = float[kSlots][kPairXchgMaxCluster * kPairXchgMaxWarps][2];

/* s summed over the warp by an xor butterfly (s[1] only where kTwo): every lane gets the same
 * bits. */
template <bool kTwo>
__device__ __forceinline__ void warp_sum_pair(float (&s)[2]) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) {
    s[0] += __shfl_xor_sync(kFullMask, s[0], off);
    if constexpr (kTwo) s[1] += __shfl_xor_sync(kFullMask, s[1], off);
  }
}

/* The exchange's addresses, computed once per thread by pair_xchg_init: slot q's are slot 0's plus
 * q times a slot's bytes (a CTA's shared memory is one contiguous range of the cluster's shared
 * window, so mapa(p + d) = mapa(p) + d). The per-row calls derived them again every row (the
 * CTA's shared window, each remote address: ~20 instructions per row, NOTES P69). */
struct PairXchgAddr {
  uint32_t bar;     /* this CTA's bar[0] (shared::cta) */
  uint32_t to_recv; /* lane r < C: recv[0][this rank * W + this warp] in rank r's shared memory */
  uint32_t to_bar;  /* lane r < C: bar[0] in rank r's shared memory */
  int n;            /* entries per slot: C * W */
};
constexpr uint32_t kPairSlotBytes = kPairXchgMaxCluster * kPairXchgMaxWarps * 2 * sizeof(float);

template <int kSlots>
__device__ __forceinline__ PairXchgAddr pair_xchg_init(PairRecv<kSlots>& recv, uint64_t (&bar)[kSlots],
                                                       int rank, int C) {
  static_assert(sizeof(recv[0]) == kPairSlotBytes, "a slot of recv");
  float* flat = &recv[0][0][0];
  for (int e = (int)threadIdx.x; e < (int)(sizeof(PairRecv<kSlots>) / sizeof(float)); e += (int)blockDim.x)
    flat[e] = 0.0f;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  /* the zeroes before any st.async into recv, whichever proxy the PTX ISA counts st.async in */
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
#endif
  if (threadIdx.x == 0) {
#pragma unroll
    for (int q = 0; q < kSlots; ++q) mbar_init(&bar[q], 1);
    mbar_init_fence();
  }
  cluster_sync(); /* every CTA's mbarriers are initialised before any send */
  PairXchgAddr x;
  x.bar = smem_u32(&bar[0]);
  const int lane = (int)threadIdx.x & 31;
  const int dst = lane < C ? lane : rank; /* lanes from C send nothing */
  const int nw = (int)blockDim.x >> 5;
  x.to_recv = mapa_u32(smem_u32(&recv[0][rank * nw + ((int)threadIdx.x >> 5)][0]), dst);
  x.to_bar = mapa_u32(x.bar, dst);
  x.n = C * nw;
  return x;
}

__device__ __forceinline__ void pair_xchg_send(const PairXchgAddr& x, int q, int C, float s0, float s1) {
  const int t = (int)threadIdx.x;
  if (t == 0) mbar_arrive_expect_tx(x.bar + (uint32_t)q * 8u, (unsigned)(((int)blockDim.x >> 5) * C * 8));
  if ((t & 31) < C) st_async_f2(x.to_recv + (uint32_t)q * kPairSlotBytes, x.to_bar + (uint32_t)q * 8u, s0, s1);
}

/* The exchange's fixed order of addition: lane l applies add(e, entry e, s) to the entries l,
 * l + 32, ... of a slot's n (s zeroed first), then the warp adds the lanes (warp_sum_pair<kTwo>).
 * Every warp of every CTA gets the same bits of whatever `add` computes from the entries. */
template <bool kTwo, typename Add>
__device__ __forceinline__ void pair_xchg_add(const float2* flat, int n, Add add, float (&s)[2]) {
  s[0] = s[1] = 0.0f;
#pragma unroll 4
  for (int e = (int)threadIdx.x & 31; e < n; e += 32) add(e, flat[e], s);
  warp_sum_pair<kTwo>(s);
}

template <bool kTwo, int kSlots>
__device__ __forceinline__ void pair_xchg_gather(const PairRecv<kSlots>& recv, const PairXchgAddr& x,
                                                 int q, unsigned parity, float (&s)[2]) {
  mbar_wait(x.bar + (uint32_t)q * 8u, parity);
  pair_xchg_add<kTwo>(reinterpret_cast<const float2*>(&recv[q][0][0]), x.n,
                      [](int, float2 v, float (&a)[2]) {
                        a[0] += v.x;
                        if constexpr (kTwo) a[1] += v.y;
                      },
                      s);
}

/* st_async_f2 for four floats (`p` 16-byte aligned, 16 transaction bytes). */
__device__ __forceinline__ void st_async_f4(const float4* p, uint64_t* bar, int rank, float4 v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  const uint32_t rp = mapa_u32(smem_u32(p), rank), rb = mapa_u32(smem_u32(bar), rank);
  asm volatile(
      "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
      ::"r"(rp), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w), "r"(rb)
      : "memory");
#elif defined(__CUDA_ARCH__)
  (void)p, (void)bar, (void)rank, (void)v;
  __trap();
#endif
}

/* Per-row reductions over the n CTAs of a cluster (sm_90) for the register kernels whose rows are
 * split over a cluster (norm_fwd_reg_kernel, norm_bwd_reg_kernel): each call sends the CTA's four
 * values to every CTA of the cluster with st.async and waits on its own mbarrier for the n CTAs'
 * values. It replaced a barrier.cluster per row (a shared-memory write, the barrier, remote
 * loads), whose arrive.release waits for the acknowledgement of every earlier global store of the
 * arriving thread, the previous row's outputs included (benchmarks/NOTES.md, P49 / P53).
 * Two slots alternate between calls: call c uses slot c % 2 at phase parity (c / 2) % 2. A CTA
 * sends call c + 2 only after its wait for call c + 1 completed, i.e. after every CTA sent call
 * c + 1, which each CTA does only after all its threads read call c (the caller's contract below):
 * so no send overwrites a slot before its receiver read it, and no send reaches a receiver's
 * mbarrier before that slot's previous phase completed.
 * Contract: every thread of every CTA of the cluster makes the same calls (uniform row loops);
 * between two calls every thread passes a CTA-wide barrier after its reads of the first (the row
 * kernels' RowGroupSum over a row of several warps does; a cluster row is at least 160 threads
 * per CTA); the four values are the same in every thread of the CTA; finish() before exit. */
constexpr int kXchgMaxCluster = 16;
struct ClusterXchgSmem {
  float4 recv[2][kXchgMaxCluster]; /* [slot][source rank] */
  uint64_t bar[2];
};
class ClusterXchg {
 public:
  /* n == 1: every call returns at once. Called by every thread (a cluster barrier for n > 1). */
  __device__ __forceinline__ ClusterXchg(ClusterXchgSmem& s, int n) : s_(s), n_(n), calls_(0) {
    if (n > 1) {
      if (threadIdx.x == 0) {
        mbar_init(&s.bar[0], 1);
        mbar_init(&s.bar[1], 1);
        mbar_init_fence();
      }
      cluster_sync(); /* every CTA's mbarriers are initialised before any send */
    }
  }
  __device__ __forceinline__ int size() const { return n_; }
  /* Send v to every CTA, wait for every CTA's; lane r < n of each warp gets rank r's values,
   * the other lanes zeros. */
  __device__ __forceinline__ float4 exchange(float4 v) {
    const int q = (int)(calls_ & 1u);
    const unsigned parity = (calls_ >> 1) & 1u;
    ++calls_;
    const int t = (int)threadIdx.x;
    if (t == 0) mbar_arrive_expect_tx(&s_.bar[q], (unsigned)(n_ * (int)sizeof(float4)));
    if (t < n_) st_async_f4(&s_.recv[q][cluster_rank()], &s_.bar[q], t, v);
    mbar_wait(&s_.bar[q], parity);
    const int lane = t & 31;
    return lane < n_ ? s_.recv[q][lane] : make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  }
  /* No CTA exits while another may still send to it. */
  __device__ __forceinline__ void finish() const {
    if (n_ > 1) cluster_sync();
  }

 private:
  ClusterXchgSmem& s_;
  int n_;
  unsigned calls_;
};

/* Sum of K <= 4 per-CTA values over the cluster (n == 1: nothing to do), added in rank order by
 * broadcast shuffles (lane r holds rank r's values), so every CTA of the cluster holds the same
 * bits. Every thread passes its CTA's values (the same in every thread of the CTA, e.g. a
 * RowGroupSum result) and gets the cluster's sums. */
template <int K>
__device__ __forceinline__ void cluster_sum(float (&v)[K], ClusterXchg& x) {
  static_assert(K >= 1 && K <= 4, "up to four values per exchange");
  const int n = x.size();
  if (n == 1) return;
  float w[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll
  for (int k = 0; k < K; ++k) w[k] = v[k];
  const float4 p = x.exchange(make_float4(w[0], w[1], w[2], w[3]));
  const float pv[4] = {p.x, p.y, p.z, p.w};
#pragma unroll
  for (int k = 0; k < K; ++k) {
    float s = __shfl_sync(kFullMask, pv[k], 0);
    for (int r = 1; r < n; ++r) s += __shfl_sync(kFullMask, pv[k], r);
    v[k] = s;
  }
}

__device__ __forceinline__ int warp_max_int(int v) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  return __reduce_max_sync(kFullMask, v);
#else
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) v = max(v, __shfl_xor_sync(kFullMask, v, off));
  return v;
#endif
}

/* Max of each thread's running amax (non-negative or NaN, see amax_update) over the block, then
 * ONE atomicMax per block into *amax, on the float's bits (abs_bits: deterministic, monotone for
 * non-negative floats, NaN above +inf). Must be called by every thread of the block;
 * blockDim.x % 32 == 0; `sm` is shared memory of 32 ints. */
__device__ __forceinline__ void block_amax_atomic(float thread_amax, float* amax, int* sm) {
  int bits = warp_max_int(abs_bits(thread_amax));
  const int warp = threadIdx.x >> 5;
  if ((threadIdx.x & 31) == 0) sm[warp] = bits;
  __syncthreads();
  if (threadIdx.x == 0) {
    int m = sm[0];
    const int nw = blockDim.x >> 5;
    for (int w = 1; w < nw; ++w) m = max(m, sm[w]);
    atomicMax(reinterpret_cast<int*>(amax), m);
  }
}

}  // namespace engine

#endif  // ENGINE_CSRC_COMMON_REDUCE_CUH_
