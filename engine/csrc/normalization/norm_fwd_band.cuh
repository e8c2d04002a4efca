/*
 * Band forward (sm_90): a norm of a 16-bit x to an FP8 output and its transposed copy in one
 * kernel, each value read once (NOTES P104). The FP8 + transposed rows were the product's last
 * ones under the bar: the external path (the norm's rowwise bytes, then the tiled transpose reading
 * them back) moves 5 bytes per value against the minimum 4 and stayed at 65-72 % of copy; the
 * in-kernel designs measured before (P76: a streamed row per iteration over a cluster, P77: whole
 * rows per CTA sharing a band over a cluster) paid a barrier or an exchange per row or per few
 * rows with nothing in flight.
 *
 * Here the work unit is a band of 32 consecutive rows: whole 32-byte sectors in every run of the
 * transposed copy. The band's row slices are spread over a thread-block cluster of C CTAs, CTA
 * `rank` owning columns [rank * S, rank * S + S), S = BandShape::kCols (512: rows of up to 8K over
 * at most 16 CTAs; 1024: up to 16K, NOTES P117). A CTA of 8 warps holds the band's slice in shared
 * memory (32 x S values of x: 32 or 64 KB, a ring of kBandStages stages filled by cp.async one
 * band ahead); warp w owns rows 4w .. 4w + 3 of the band, lane l the 16-byte vectors l, l + 32, ...
 * of each, so a row's partial sums need only the warp's butterfly. One exchange per band (not per
 * row): every warp sends its four rows' partial sums (RMSNorm: sum of z^2; LayerNorm: sum of z and
 * the sum of squares about the slice's mean, Chan's formula over the slices, no E[z^2] - E[z]^2)
 * by st.async into every CTA of the cluster, counted by an mbarrier, and waits for the band's
 * totals one phase later:
 *
 *   iteration k:  copy band k+1;  wait for band k's copies;
 *                 phase A of band k: its partial sums, sent;
 *                 phase B of band k-1: y, the FP8 bytes (rowwise to global memory, 8 bytes per
 *                   lane: 256-byte runs per warp; and into a shared-memory tile of 32 rows x S),
 *                   a CTA barrier, the tile stored transposed (store_tile_transposed: 32-byte runs
 *                   of out_t, one per column), amax;
 *                 wait for band k's totals: rsigma (and the mean) of its rows, for phase B in the
 *                   next iteration.
 * The exchange's round trip between SMs hides behind phase B of the previous band. The FP8 tile
 * has two layouts (kTileInStage, P105): written over its band's stage once every thread has read
 * its x there (a CTA barrier before the tile's writes and one after the transposed store, before
 * the next copy refills the stage: 96 KB of shared memory at S = 512, two CTAs per SM; 192 KB at
 * S = 1024, one), or two tiles of their own alternating by band parity, one CTA barrier per band
 * ordering the tile's writes and reads (a tile is rewritten two bands later, after the next band's
 * barrier; 131 KB at S = 512, one CTA per SM).
 * Exchange slot k % 2: a CTA sends band k + 2 only after its wait for band k + 1, which needs
 * every warp of every CTA to have sent band k + 1, which each does after its reads of band k's
 * totals.
 * The totals are added in the same order in every CTA (the butterfly over lanes 0 .. C-1 of each
 * rank's partial): the same rsigma in every CTA and every run. The sums' order is not the register
 * path's, so the FP8 bytes are within one FP8 step of the cast of the fp32 output (another path),
 * at rounding boundaries only (tests/test_fp8.py::test_fp8_band_kernel), and transpose_data is the
 * rowwise data transposed bit for bit. Delayed scaling (kFull) only; current scaling's second pass
 * reads the statistics back (the register path, or the tiled transpose after the norm).
 * Measured (kernel time, NOTES P104 / P105 / P117; fwd_band_cfg has the numbers): RMSNorm e4m3 +
 * transposed at 2K-8K 76-79 % of copy on the H100 and 70-75 % on the H200, against 72 % and
 * 60-66 % for the tiled transpose after the norm; at 16K 71-73 against 70 (H100, S = 1024).
 * LayerNorm at S = 512 under the tiled transpose on both cards; at S = 1024 above it at 2K-16K
 * on the H100 (71-77 against 69-71).
 * Vectors past the row are zero-filled by the copy (they add zeros; gamma = beta = 0 there, y =
 * 0), rows past the matrix too (rsigma 0 there, y = 0: no NaN into amax with eps = 0); their stores
 * are predicated off.
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_FWD_BAND_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_FWD_BAND_CUH_

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/tile.cuh"
#include "common/vec.cuh"
#include "normalization/norm_common.cuh"
#include "normalization/norm_fwd.cuh"

namespace engine {
namespace norm {

constexpr int kBandThreads = 256;                   /* CTA threads: 8 warps */
constexpr int kBandMaxCluster = 16;
constexpr int kBandDepth = 1;                  /* bands copied ahead of phase A's */
constexpr int kBandStages = kBandDepth + 2;    /* the copy's, phase A's and phase B's band */
constexpr int kBandSlots = 2;                  /* exchange slots (the header: why two) */

/* A band kernel's shape: kRows = 32 rows per band (a whole 32-byte sector per run of the
 * transposed copy), kNVL 16-byte vectors (8 values) per lane and row, so a CTA's slice is S =
 * kNVL * 256 columns and rows of up to 16 * S take a cluster of at most 16. Slices of 256 (one
 * vector, 66 KB of shared memory: 3 CTAs per SM) lost 3-8 points to S = 512 at 1K-4K (RMSNorm,
 * H100: twice the exchanges and barriers per byte; NOTES P104). S = 1024 (three stages of 64 KB,
 * one CTA per SM) takes rows of up to 16K (NOTES P117). Bands of 16 rows (S = 1024 at two CTAs
 * per SM, S = 2048 at one: rows of up to 32K) ran at 29-34 % of copy on the H100 (P117): their
 * transposed runs are half sectors, as P106 found for Triton's bands. */
template <int NVL>
struct BandShape {
  static constexpr int kRows = 32;
  static constexpr int kNVL = NVL;
  static constexpr int kRPW = kRows / (kBandThreads / 32); /* rows per warp and band */
  static constexpr int kCols = NVL * 32 * 8;
  /* Bytes per row of the FP8 tile: S + 4, so that store_tile_transposed's two 16-row halves (read
   * by one warp) fall on different banks. */
  static constexpr int kPitch = kCols + 4;
  static constexpr int kStageBytes = kRows * kCols * 2;
};

/* kTileInStage: the FP8 tile of a band is written over its own stage once every thread has read
 * its x there (two more CTA barriers per band), so the CTA needs the stages alone (96 KB at S =
 * 512: two CTAs per SM at up to 128 registers); otherwise two tiles of their own (131 KB: one CTA
 * per SM). */
template <class Sh>
__host__ __device__ constexpr int band_smem_bytes(bool in_stage) {
  return kBandStages * Sh::kStageBytes + (in_stage ? 0 : 2 * Sh::kRows * Sh::kPitch);
}

template <typename X, bool kRms, bool kBias, class Sh, bool kTileInStage, int kMinBlocks>
__global__ void __launch_bounds__(kBandThreads, kMinBlocks) norm_fwd_band_kernel(const FwdArgs a) {
  static_assert(sizeof(X) == 2, "the band forward takes a 16-bit x");
  constexpr int VEC = 8;
  constexpr int kBandRows = Sh::kRows;
  constexpr int NVL = Sh::kNVL;
  constexpr int RPW = Sh::kRPW;
  constexpr int T = kBandThreads;
  constexpr int S = Sh::kCols;
  constexpr int P = Sh::kPitch;
  constexpr int kVals = kRms ? 1 : 2; /* values per row in the exchange */
  constexpr int kWarpVals = RPW * kVals;
  static_assert(kWarpVals % 4 == 0, "a warp's values go out as float4 sends");
  static_assert(!kTileInStage || kBandRows * P <= Sh::kStageBytes, "the tile fits its stage");
  constexpr uint32_t kStageBytes = (uint32_t)Sh::kStageBytes;
  /* [slot][source rank][row of the band][value]: every CTA's partial sums, by st.async */
  __shared__ __align__(16) float recv[kBandSlots][kBandMaxCluster][kBandRows * kVals];
  __shared__ __align__(8) uint64_t mbar[kBandSlots];
  __shared__ int amax_buf[32];
  extern __shared__ __align__(16) uint8_t smem[]; /* the stages, then (!kTileInStage) two tiles */

  const int t = threadIdx.x;
  const int lane = t & 31;
  const int warp = t >> 5;
  const int C = a.cluster;
  const int rank = cluster_rank();
  const int nvec = a.cols / VEC;
  const int64_t M = a.rows;
  const int64_t cid = blockIdx.x / C;
  const int64_t gstride = a.grid_clusters;
  const int64_t nbands = (M + kBandRows - 1) / kBandRows;
  /* bands of this cluster: cid, cid + gstride, ... (fewer than 2^31) */
  const uint32_t count = cid < nbands ? (uint32_t)((nbands - 1 - cid) / gstride + 1) : 0u;
  const int v0 = rank * NVL * 32 + lane; /* this lane's first vector of the row */
  bool in_col[NVL];
#pragma unroll
  for (int m = 0; m < NVL; ++m) in_col[m] = v0 + m * 32 < nvec;
  /* LayerNorm: values of each rank's slice (the same for every row), for Chan's merge */
  const int n_own = min(max(a.cols - rank * S, 0), S);

  float g[NVL][VEC];
  float be[kBias ? NVL : 1][VEC];
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
#pragma unroll
  for (int m = 0; m < NVL; ++m) {
    if (in_col[m]) {
      load_vec_dt<VEC>(a.weight, (int64_t)(v0 + m * 32) * VEC, a.w_dtype, g[m]);
#pragma unroll
      for (int j = 0; j < VEC; ++j) g[m][j] += g_add;
      if constexpr (kBias) load_vec_dt<VEC>(a.bias, (int64_t)(v0 + m * 32) * VEC, a.w_dtype, be[m]);
    } else {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        g[m][j] = 0.0f;
        if constexpr (kBias) be[m][j] = 0.0f;
      }
    }
  }
  const float scale = fwd_fp8_scale<true>(a);
  float amax = 0.0f;

  if (t == 0) {
#pragma unroll
    for (int q = 0; q < kBandSlots; ++q) mbar_init(&mbar[q], 1);
    mbar_init_fence();
  }
  cluster_sync(); /* every CTA's mbarriers are initialised before any send */
  const uint32_t bar0 = smem_u32(&mbar[0]);
  /* lane r < C sends this warp's values to rank r (lanes from C send nothing) */
  const int dst = lane < C ? lane : rank;
  const uint32_t to_recv = mapa_u32(smem_u32(&recv[0][rank][warp * kWarpVals]), dst);
  const uint32_t to_bar = mapa_u32(bar0, dst);
  constexpr uint32_t kRecvSlotBytes = (uint32_t)sizeof(recv[0]);

  /* This thread's vector (j, m) of a stage: ((j * NVL + m) * T + t) * 16 bytes in; it copies and
   * reads only its own vectors, so cp.async's per-thread completion is the only synchronisation
   * the stages need. */
  const uint32_t ring_s = smem_u32(smem) + (uint32_t)t * 16u;
  const StageRing stages{ring_s, ring_s + (uint32_t)kBandStages * kStageBytes, kStageBytes};
  uint32_t st_copy = ring_s, st_a = ring_s, st_b = ring_s;
  uint8_t* const tiles = smem + kBandStages * kStageBytes;

  /* the next copy's band (its first row of this warp), and phase B's */
  const int64_t row_step = gstride * kBandRows;
  int64_t row_copy = cid * kBandRows + warp * RPW;
  int64_t row_b = row_copy;
  const X* const x = static_cast<const X*>(a.x);
  auto issue = [&](uint32_t k) {
    if (k < count) {
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        const int64_t r = row_copy + j;
        const X* src = x + r * a.x_stride + (int64_t)v0 * VEC;
#pragma unroll
        for (int m = 0; m < NVL; ++m) {
          const bool full = r < M && in_col[m];
          cp_async16(st_copy + (uint32_t)((j * NVL + m) * T) * 16u,
                     full ? static_cast<const void*>(src + m * 32 * VEC) : a.x, full);
        }
      }
      row_copy += row_step;
      st_copy = stages.next(st_copy);
    }
    cp_async_commit();
  };

  /* Phase B's statistics (set by the gather of the previous iteration): rsigma and LayerNorm's
   * mean (0 for RMSNorm) of each row of the warp. t = (z - mean) * rsigma: the register path's
   * FMA form for LayerNorm (ln_fma_row) doubled the row body (one per form, a uniform branch per
   * row); without it LayerNorm gained 1-2 points here (NOTES P104), and the bytes are bound to no
   * other path's bits. */
  float rs_b[RPW], mean_b[RPW];
#pragma unroll
  for (int j = 0; j < RPW; ++j) {
    rs_b[j] = 0.0f;
    mean_b[j] = 0.0f;
  }

  auto phase_a = [&](uint32_t k) {
    const uint32_t sa = st_a;
    st_a = stages.next(st_a);
    float vals[kWarpVals];
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
      for (int m = 0; m < NVL; ++m) {
        float z[VEC];
        lds_vec8<X>(sa + (uint32_t)((j * NVL + m) * T) * 16u, z);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          if constexpr (kRms) {
            s0 = fmaf(z[e], z[e], s0);
          } else {
            s0 += z[e];
            s1 = fmaf(z[e], z[e], s1);
          }
        }
      }
      vals[j * kVals] = s0;
      if constexpr (!kRms) vals[j * kVals + 1] = s1;
    }
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
      for (int i = 0; i < kWarpVals; ++i) vals[i] += __shfl_xor_sync(kFullMask, vals[i], off);
    }
    if constexpr (!kRms) {
      /* the slice's sum of squares about its own mean: one pass where that loses at most 2 bits
       * (ln_one_pass_m2), else a centred pass over the stage (past the row: zeros about 0) */
      const float inv_own = n_own > 0 ? 1.0f / (float)n_own : 0.0f;
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        float m2;
        if (!ln_one_pass_m2(vals[2 * j], vals[2 * j + 1], inv_own, m2)) {
          const float mw = vals[2 * j] * inv_own;
          float q = 0.0f;
#pragma unroll
          for (int m = 0; m < NVL; ++m) {
            const float mm = in_col[m] ? mw : 0.0f;
            float z[VEC];
            lds_vec8<X>(sa + (uint32_t)((j * NVL + m) * T) * 16u, z);
#pragma unroll
            for (int e = 0; e < VEC; ++e) {
              const float d = z[e] - mm;
              q = fmaf(d, d, q);
            }
          }
#pragma unroll
          for (int off = 16; off > 0; off >>= 1) q += __shfl_xor_sync(kFullMask, q, off);
          m2 = q;
        }
        vals[2 * j + 1] = m2;
      }
    }
    const int q = (int)(k % (uint32_t)kBandSlots);
    if (t == 0) mbar_arrive_expect_tx(bar0 + (uint32_t)q * 8u, (unsigned)(C * kBandRows * kVals * 4));
    if (lane < C) {
#pragma unroll
      for (int i = 0; i < kWarpVals; i += 4) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
        asm volatile(
            "st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.f32 [%0], {%1, %2, %3, %4}, [%5];"
            ::"r"(to_recv + (uint32_t)q * kRecvSlotBytes + (uint32_t)i * 4u), "f"(vals[i]),
            "f"(vals[i + 1]), "f"(vals[i + 2]), "f"(vals[i + 3]), "r"(to_bar + (uint32_t)q * 8u)
            : "memory");
#endif
      }
    }
  };

  /* The band's totals of this warp's rows, in the same order in every CTA: lane l < C holds rank
   * l's partial, then the xor butterfly. */
  auto gather = [&](uint32_t k, int64_t row0) {
    const int q = (int)(k % (uint32_t)kBandSlots);
    mbar_wait(bar0 + (uint32_t)q * 8u, (k / (uint32_t)kBandSlots) & 1u);
    const float* src = &recv[q][lane < C ? lane : 0][warp * kWarpVals];
    float v[kWarpVals];
#pragma unroll
    for (int i = 0; i < kWarpVals; ++i) v[i] = lane < C ? src[i] : 0.0f;
    if constexpr (kRms) {
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < RPW; ++j) v[j] += __shfl_xor_sync(kFullMask, v[j], off);
      }
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        rs_b[j] = row0 + j < M ? row_rsigma(v[j] * a.inv_n + a.eps) : 0.0f;
      }
    } else {
      /* Chan: mean = sum / N; M2 = sum_r (M2_r + n_r (sum_r / n_r - mean)^2) */
      const int n_l = lane < C ? min(max(a.cols - lane * S, 0), S) : 0;
      const float nf = (float)n_l, inv_l = n_l > 0 ? 1.0f / (float)n_l : 0.0f;
      float mean[RPW], m2[RPW];
#pragma unroll
      for (int j = 0; j < RPW; ++j) mean[j] = v[2 * j];
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < RPW; ++j) mean[j] += __shfl_xor_sync(kFullMask, mean[j], off);
      }
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        mean[j] *= a.inv_n;
        const float d = v[2 * j] * inv_l - mean[j];
        m2[j] = lane < C ? fmaf(nf * d, d, v[2 * j + 1]) : 0.0f;
      }
#pragma unroll
      for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
        for (int j = 0; j < RPW; ++j) m2[j] += __shfl_xor_sync(kFullMask, m2[j], off);
      }
#pragma unroll
      for (int j = 0; j < RPW; ++j) {
        const bool in = row0 + j < M;
        const float rs = in ? row_rsigma(m2[j] * a.inv_n + a.eps) : 0.0f;
        if (rank == 0 && lane == j && in) a.mu[row0 + j] = mean[j];
        mean_b[j] = in ? mean[j] : 0.0f;
        rs_b[j] = rs;
      }
    }
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      if (rank == 0 && lane == j && row0 + j < M) a.rsigma[row0 + j] = rs_b[j];
    }
  };

  const bool vec16 = a.t_vec16 != 0;
  /* Phase B of the band whose first row (of this warp) is row_b, in stage st_b, tile `tb`. */
  auto phase_b = [&](uint32_t kb, auto fmt_tag) {
    constexpr bool kE5M2 = decltype(fmt_tag)::value;
    const uint32_t sb = st_b;
    st_b = stages.next(st_b);
    uint32_t wq[RPW][NVL][VEC / 4]; /* the FP8 bytes, for the tile */
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      const int64_t r = row_b + j;
      const bool row_in = r < M;
      uint8_t* orow = static_cast<uint8_t*>(a.out) + r * a.out_stride + (int64_t)v0 * VEC;
#pragma unroll
      for (int m = 0; m < NVL; ++m) {
        float z[VEC], y[VEC];
        lds_vec8<X>(sb + (uint32_t)((j * NVL + m) * T) * 16u, z);
#pragma unroll
        for (int e = 0; e < VEC; ++e) {
          y[e] = norm_y<false>(z[e], mean_b[j], rs_b[j], g[m][e], kBias ? be[kBias ? m : 0][e] : 0.0f, kBias);
          amax = amax_update(amax, y[e]);
          y[e] *= scale;
        }
        pack_fp8_fmt<VEC, kE5M2 ? __NV_E5M2 : __NV_E4M3>(y, wq[j][m]);
        store_words_if<VEC>(orow + m * 32 * VEC, wq[j][m], row_in && in_col[m]);
      }
    }
    uint8_t* tile;
    if constexpr (kTileInStage) {
      __syncthreads(); /* every thread's reads of the stage: the tile overwrites its x */
      tile = smem + (sb - ring_s);
    } else {
      tile = tiles + (kb & 1u) * (uint32_t)(kBandRows * P);
    }
#pragma unroll
    for (int j = 0; j < RPW; ++j) {
      uint8_t* trow = tile + (warp * RPW + j) * P + lane * VEC;
#pragma unroll
      for (int m = 0; m < NVL; ++m) {
        uint32_t* tw = reinterpret_cast<uint32_t*>(trow + m * 32 * VEC);
        tw[0] = wq[j][m][0];
        tw[1] = wq[j][m][1];
      }
    }
    __syncthreads(); /* the tile's rows, from every warp */
    const int64_t band_row0 = row_b - warp * RPW;
    const int nr = (int)min((int64_t)kBandRows, M - band_row0);
    const int nc = min(max(a.cols - rank * S, 0), S);
    store_tile_transposed(tile, P, nr, nc, a.out_t, M, band_row0, (int64_t)rank * S, vec16, t, T);
    /* in the stage: its reads before the stage is refilled (the next iteration's copy) */
    if constexpr (kTileInStage) __syncthreads();
    row_b += row_step;
  };

  const bool e5m2 = a.e5m2 != 0;
#pragma unroll
  for (int d = 0; d < kBandDepth; ++d) issue((uint32_t)d);
  int64_t row_g = cid * kBandRows + warp * RPW; /* the gather's band (this warp's first row) */
  for (uint32_t k = 0; k < count + 1u; ++k) {
    issue(k + kBandDepth);
    cp_async_wait<kBandDepth>();
    if (k < count) phase_a(k);
    if (k >= 1u) {
      if (e5m2) {
        phase_b(k - 1u, std::true_type{});
      } else {
        phase_b(k - 1u, std::false_type{});
      }
    }
    if (k < count) {
      gather(k, row_g);
      row_g += row_step;
    }
  }
  cluster_sync(); /* no CTA exits while a send to it may be in flight */
  block_amax_atomic(amax, a.amax, amax_buf);
}

/* Which band kernel takes rows of `cols`: 0 none, else one of three configurations (slice width
 * S per CTA, where the FP8 tile lives, CTAs per SM; bands of 32 rows):
 *   1: S = 512, tiles of their own (131 KB), one CTA per SM ("layout 1"; rows of up to 8K);
 *   2: S = 512, the tile in its stage (96 KB), two CTAs per SM ("layout 2"; up to 8K);
 *   3: S = 1024, the tile in its stage (192 KB), one CTA per SM (up to 16K).
 * engine_set_norm_fwd_band's value where set (1: never; 2-4: configuration 1-3 at every width
 * whose cluster fits), else by the card's class (`lean`: lean_dram, the H100; NOTES P109) and
 * whether the launcher picks the path (`t_auto`: out_t_auto) or the caller asked for the copy
 * in-kernel (ENGINE_NORM_EXTERNAL_TRANSPOSE = 0):
 * - RMSNorm above 1K up to 8K: layout 1 on a lean card, 2 on the others. Kernel time, % of copy,
 *   e4m3 at 2K / 4K / 8K (NOTES P104, P105), layout 1 / layout 2 / the tiled transpose after the
 *   norm: H200 66 / 64 / 58, 72-74 / 74-75 / 70, 65-66 / 62 / 60; H100 80 / 81 / 80, 79 / 78 /
 *   76, 72 / 72 / 72 (configuration 3: 79 / 75-76 / 76-78, P117). The cards disagree (the H200's
 *   bandwidth wants the second CTA's copies in flight; on the H100 the extra barriers cost more
 *   than they bring). At 1K the register path's tile stays (H100 82 against the band's 82-83;
 *   H200 77 against 71-72).
 * - RMSNorm above 8K up to 16K, and LayerNorm above 1K up to 16K: configuration 3 on a lean card
 *   (P117, H100: RMSNorm 16K 71-73 against the tiled transpose's 70; LayerNorm 2K / 4K / 8K /
 *   16K 75-76 / 74-76 / 75-77 / 71 against 71 / 71 / 69 / 69, where layout 1 read 73 / 70 / 61 and
 *   layout 2 66 / 65 / 60: at S = 512 LayerNorm's exchange of two values per row and its cluster
 *   of twice the CTAs cost more than RMSNorm's). On a wide card configuration 3 only when asked
 *   in-kernel: it ties the tiled transpose for RMSNorm at 16K and loses for LayerNorm (P117,
 *   H200: 63-64 against 64; LayerNorm 2K / 4K / 8K / 16K 63-64 / 58 / 57 / 51 against 66 / 63 /
 *   60 / 61), but beats the register path's 16-row tile (30-36 %) and layout 2 (LayerNorm 53 /
 *   51 / 45 at 2K-8K, P105).
 * Rows the band kernel does not take get their transposed copy from the tiled transpose after the
 * norm (with out_t_auto), or asked in-kernel from the register path's tile.
 */
inline int fwd_band_cfg(int cols, int knob, bool lean, bool rms, bool t_auto) {
  if (knob != 0) return knob - 1;
  if (cols <= 1024 || cols > 16384) return 0;
  if (rms && cols <= 8192) return lean ? 1 : 2;
  return (lean || !t_auto) ? 3 : 0;
}

template <typename X, class Sh, bool kInStage, int kMinBlocks>
auto fwd_band_kernel(bool rms, bool bias) -> void (*)(FwdArgs) {
  return rms ? &norm_fwd_band_kernel<X, true, false, Sh, kInStage, kMinBlocks>
             : (bias ? &norm_fwd_band_kernel<X, false, true, Sh, kInStage, kMinBlocks>
                     : &norm_fwd_band_kernel<X, false, false, Sh, kInStage, kMinBlocks>);
}

/* Launch configuration (Sh, kInStage, kMinBlocks) of the band kernel if its cluster of
 * C = max(2, ceil(cols / S)) CTAs fits ctx.max_cluster; false where it launched nothing. */
template <typename X, class Sh, bool kInStage, int kMinBlocks>
bool launch_fwd_band_as(FwdArgs& a, const LaunchCtx& ctx, engine_status* st) {
  int c = (int)ceil_div(a.cols, Sh::kCols);
  if (c < 2) c = 2; /* the exchange's sends and barriers are cluster instructions */
  if (c > ctx.max_cluster || c > kBandMaxCluster) return false;
  const size_t smem = (size_t)band_smem_bytes<Sh>(kInStage);
  if (smem + 12288 > (size_t)ctx.max_smem_optin) return false; /* static: up to ~8.3 KB */
  void (*kernel)(FwdArgs) =
      fwd_band_kernel<X, Sh, kInStage, kMinBlocks>(a.is_rms != 0, a.bias != nullptr);
  int active = 0;
  *st = active_clusters(reinterpret_cast<const void*>(kernel), kBandThreads, smem, c, &active);
  if (*st != ENGINE_SUCCESS) return true;
  const int64_t grid =
      persistent_clusters(ceil_div(a.rows, Sh::kRows), active, ctx.sm_count, ctx.sm_margin);
  a.cluster = c;
  a.tpr = kBandThreads;
  a.rows_per_iter = Sh::kRows;
  a.tile_rows = Sh::kRows;
  a.tile_pitch = Sh::kPitch;
  a.t_vec16 = (ptr_aligned(a.out_t, 16) && a.rows % 16 == 0) ? 1 : 0;
  a.gb_off = -1;
  a.grid_clusters = (int)grid;
  *st = launch_in_clusters(kernel, grid * c, kBandThreads, smem, c, ctx.stream, a);
  return true;
}

/* Launch the band kernel where it applies: an FP8 output with out_t in mode kFull (delayed
 * scaling), a 16-bit x without a residual whose rows allow 16-byte vectors (the caller's check),
 * fwd_band_cfg != 0, and that configuration's cluster within ctx.max_cluster. Returns false where
 * it launched nothing. */
template <typename X>
bool launch_fwd_band(FwdArgs& a, const LaunchCtx& ctx, engine_status* st) {
  if (a.mode != kFull || a.out_t == nullptr || a.residual != nullptr || a.rows == 0) return false;
  switch (fwd_band_cfg(a.cols, ctx.fwd_band, ctx.lean_dram != 0, a.is_rms != 0, a.t_auto != 0)) {
    case 1: return launch_fwd_band_as<X, BandShape<2>, false, 1>(a, ctx, st);
    case 2: return launch_fwd_band_as<X, BandShape<2>, true, 2>(a, ctx, st);
    case 3: return launch_fwd_band_as<X, BandShape<4>, true, 1>(a, ctx, st);
    default: return false;
  }
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_FWD_BAND_CUH_
