/*
 * Norm backward kernels and launcher template.
 *
 *   xhat = (z - mu) * rsigma,  dyg = dy * g
 *   dz   = rsigma * (dyg - c1 - xhat * c2),  c2 = mean(dyg * xhat),  c1 = mean(dyg) (LayerNorm; 0
 *          for RMSNorm), both computed once per row by one two-value row reduction
 *   dz  += dresidual;  dx = dz (dx_dtype), dres = dz (dres_dtype)
 *   dweight = sum_rows(dy * xhat), dbias = sum_rows(dy)
 *
 * Templated on (Z = dtype of x/z, DY); the dtypes of dx, dres / dresidual and weight are uniform
 * run-time switches at their (vectorised) accesses, which keeps the instantiation count at 9 per
 * path instead of 81 at a cost of a few uniform branch instructions per 16-byte vector. The
 * register path is also templated on the norm (kRms) and on the dbias partials (kHasDb).
 *
 * Register path (norm_bwd_reg_kernel): rows of up to kMaxRowThreads * kBwdElems elements (8K) with
 * vector-friendly operands. Row groups as in the forward; gamma re-read per row from L1 (as in the
 * forward: registers), dbias partials only with a bias (kHasDb); each thread keeps its
 * dweight / dbias partials for its columns in registers across all of its CTA's rows, then the CTA
 * combines its row groups in a fixed order through shared memory and writes ONE row of fp32
 * partials to the workspace ([num_ctas, ws_pitch] for dweight, the same for dbias).
 * One-CTA path (the register kernel, 1024-thread build): rows of 8K-16K over 16-bit z and dy,
 * 16 values per thread in one CTA per row, no cluster (launch_bwd; NOTES P34, P37); LayerNorm's
 * builds keep their partials in shared memory (kPartSmem) and gamma in global memory (L1).
 * Cluster path (the register kernel, sm_90): other rows wider than one 256-thread CTA (8K-32K for
 * 16-bit operands) are split over a thread-block cluster as in the forward; c1 / c2 are reduced
 * across the cluster in distributed shared memory, and the cluster writes one workspace row, each
 * CTA its own columns. Rows of 4K-8K over 16-bit z and dy take the same kernel with 32 values
 * per thread in one CTA, and rows past 32K (to 256K) in clusters of 8 or 16 CTAs with 32 or 64,
 * the partials in shared memory (launch_bwd_wide).
 * Streamed path (norm_bwd_stream.cuh, the default for 16-bit z and dy from 4K columns on sm_90):
 * the row over a cluster, the next rows copied into shared memory by cp.async, the per-row sums
 * exchanged by st.async; the register, one-CTA and cluster paths below remain for other dtypes,
 * devices without clusters, rows the stream cannot hold (past 128K), and the knobs.
 * Blocked path (norm_bwd_blocked_kernel): one CTA per row at a time; pass 1 reduces c1 / c2 over
 * column chunks, pass 2 re-reads (L2) and writes dx, and read-modify-writes the CTA's own
 * workspace row (the first row of a CTA stores instead of adding).
 * norm_bwd_reduce_kernel (norm_api.cu) then sums the workspace rows per column in a fixed order:
 * deterministic, no float atomics anywhere.
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_BWD_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_BWD_CUH_

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/vec.cuh"
#include "normalization/norm_bwd_stream.cuh"
#include "normalization/norm_common.cuh"

namespace engine {
namespace norm {

template <typename Z, typename DY>
constexpr int bwd_vec() {
  return 16 / (sizeof(Z) < sizeof(DY) ? sizeof(Z) : sizeof(DY));
}

/* kMaxThreads: 256 or kMaxRowThreads (rows that need more than 256 threads), as in the forward,
 * or kBwdCtaThreads (launch_bwd's one-CTA layout of a RMSNorm row to 16K).
 * Blocks of up to 256 threads over 16-bit z and dy holding kBwdElems values per thread are
 * compiled for 3 CTAs per SM (at most 85 registers, no spills); with an fp32 operand that spills,
 * so those keep 2. The 32- and 64-value builds (2x / 4x kBwdElems) have no minimum: ptxas gives
 * them 95-179 registers, 2 CTAs per SM at 32 values, 1 at 64. */
template <typename Z, typename DY>
constexpr int bwd_min_blocks(int max_threads, int elems) {
  return (max_threads <= 256 && sizeof(Z) == 2 && sizeof(DY) == 2 && elems <= kBwdElems) ? 3 : 1;
}

/* Where a build of the register kernel (kMaxThreads, values per thread) keeps its dweight /
 * dbias partials and gamma: one definition for the kernel and its launcher (launch_bwd_reg).
 * Partials in shared memory: the 32- and 64-value builds, and LayerNorm's 1024-thread builds
 * (kernel comments). Gamma in shared memory where the launcher finds room, except on LayerNorm's
 * 1024-thread builds, whose 64-128 KB of partials leave none under gb_smem_offset's half-SM rule
 * (the kernel then compiles that path out, which it needed to fit 64 registers). */
__host__ __device__ constexpr bool bwd_part_smem(bool rms, int max_threads, int elems) {
  return elems > kBwdElems || (!rms && max_threads > kMaxRowThreads);
}
__host__ __device__ constexpr bool bwd_gamma_smem(bool rms, int max_threads, int elems) {
  return rms || max_threads <= kMaxRowThreads || elems != kBwdElems;
}

/* kRms is a template parameter on the register path (the forward's reason: no mean subtraction
 * per value, twice, and no c1 for RMSNorm in an issue-bound loop). */
template <typename Z, typename DY, int VEC, int NV, bool kRms, bool kHasDb, int kMaxThreads>
__global__ void __launch_bounds__(kMaxThreads, bwd_min_blocks<Z, DY>(kMaxThreads, NV * VEC))
    norm_bwd_reg_kernel(const BwdArgs a) {
  __shared__ float red_buf[2 * 32 * 2];
  __shared__ ClusterXchgSmem cl_smem;
  /* [rows_per_iter][ws_pitch] when > 1 group; the partials of the wide-cluster builds (below) */
  extern __shared__ __align__(16) float part[];

  const int tpr = a.tpr;
  const int group = threadIdx.x / tpr;
  const int lr = threadIdx.x - group * tpr;
  const int nvec = a.cols / VEC;
  const bool has_dres_in = a.dresidual != nullptr;
  const bool has_dres_out = a.dres != nullptr;
  /* Rows split over a cluster of a.cluster CTAs as in the forward; the cluster is one workspace
   * row, each CTA writing its columns of it. */
  const int ncl = kMaxThreads <= kClusterRowThreads ? a.cluster : 1;
  const int glane = ncl > 1 ? cluster_rank() * tpr + lr : lr;
  const int gstride = ncl * tpr;

  int col[NV];
  bool valid[NV];
  row_slots<NV, VEC>(glane, gstride, nvec, col, valid);
  /* gamma is re-read per row (L1-resident) rather than held as floats across the row loop, and
   * the dbias partials exist only when there is a bias (kHasDb): 16 + 16 registers fewer.
   * The 32- and 64-value builds (more than kBwdElems values per thread: launch_bwd_wide)
   * keep their partials in shared memory instead (kPartSmem): at 32 / 64 values per thread the packed row
   * alone takes 32 / 64 registers, and with the partials in registers too ptxas spilled (LayerNorm
   * with a bias at 32, everything at 64). Each thread owns its slots there, laid out
   * [operand][slot][quad of 4 floats][tpr] so that a warp's 16-byte accesses are conflict-free;
   * the same fmaf per value in the same order, so the same bits as in registers. */
  /* The LayerNorm builds of 1024 threads (one CTA per 16K row, launch_bwd) too: at their 64
   * registers ptxas spilled 4 bytes without dbias partials, 160-196 with them in registers, and
   * 24-40 with dweight's in registers and dbias's here (NOTES P37, P39). */
  constexpr bool kPartSmem = bwd_part_smem(kRms, kMaxThreads, NV * VEC);
  constexpr int kRegNV = kPartSmem ? 1 : NV;
  constexpr bool kGammaSmem = bwd_gamma_smem(kRms, kMaxThreads, NV * VEC);
  float dw[kRegNV][VEC];
  float db[kHasDb ? kRegNV : 1][VEC];
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
#pragma unroll
  for (int i = 0; i < kRegNV; ++i) {
#pragma unroll
    for (int j = 0; j < VEC; ++j) {
      dw[i][j] = 0.0f;
      if constexpr (kHasDb) db[i][j] = 0.0f;
    }
  }
  /* Slot i's partials of operand op (0: dweight, 1: dbias) in shared memory: load / store. */
  auto part_io = [&](int op, int i, float (&v)[VEC], bool store) {
#pragma unroll
    for (int q = 0; q < VEC / 4; ++q) {
      float* p = part + ((((op * NV + i) * (VEC / 4) + q) * tpr) + lr) * 4;
      float(&v4)[4] = *reinterpret_cast<float(*)[4]>(&v[q * 4]);
      if (store) {
        store_vec<float, 4>(p, v4);
      } else {
        load_vec<float, 4>(p, v4);
      }
    }
  };
  if constexpr (kPartSmem) {
    float zero[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) zero[j] = 0.0f;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      part_io(0, i, zero, true);
      if constexpr (kHasDb) part_io(1, i, zero, true);
    }
  }

  /* gamma + g_add as fp32 in shared memory when the launcher found room (gb_off >= 0; see the
   * forward): two 16-byte LDS per 8 values instead of a converted load and an add per value,
   * twice per row; the same floats either way. */
  const float* gsm = nullptr;
  if (kGammaSmem && a.gb_off >= 0) {
    float* gw = reinterpret_cast<float*>(reinterpret_cast<uint8_t*>(part) + a.gb_off);
    fill_row_slots(NV, tpr, glane - lr, gstride, nvec, [&](int k, int v) {
      float gv[VEC] = {};
      if (v >= 0) {
        load_vec_dt<VEC>(a.weight, (int64_t)v * VEC, a.w_dtype, gv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) gv[j] += g_add;
      }
      store_vec<float, VEC>(gw + k * VEC, gv);
    });
    gsm = gw;
  }
  /* gamma + g_add of slot i */
  auto gamma_at = [&](int i, float (&gv)[VEC]) {
    if (kGammaSmem && gsm != nullptr) {
      load_vec<float, VEC>(gsm + (i * tpr + lr) * VEC, gv);
    } else {
      load_vec_dt<VEC>(a.weight, col[i], a.w_dtype, gv);
#pragma unroll
      for (int j = 0; j < VEC; ++j) gv[j] += g_add;
    }
  };

  RowGroupSum<2> red(red_buf, tpr, group);
  ClusterXchg xchg(cl_smem, ncl); /* c2, c1 over a cluster (reduce.cuh) */
  const int G = a.rows_per_iter;
  const int64_t nblk = (a.rows + G - 1) / G;
  for (int64_t blk = blockIdx.x / ncl; blk < nblk; blk += a.grid_clusters) {
    const int64_t row = blk * G + group;
    const bool ok = row < a.rows;
    const int64_t r = ok ? row : 0;
    const DY* dyrow = static_cast<const DY*>(a.dy) + r * a.dy_stride;
    const Z* zrow = static_cast<const Z*>(a.x) + r * a.x_stride;
    /* z and dy stay packed in their storage types (16-bit values two to a register); xhat and
     * dy * g are recomputed in the second loop (the same operations, so the same bits). */
    uint32_t zw[NV][PackedWords<Z, VEC>::kWords];
    uint32_t dw_in[NV][PackedWords<DY, VEC>::kWords];
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (ok && valid[i]) {
        load_words<VEC * sizeof(DY)>(dyrow + col[i], dw_in[i]);
        load_words<VEC * sizeof(Z)>(zrow + col[i], zw[i]);
      } else {
#pragma unroll
        for (int k = 0; k < PackedWords<DY, VEC>::kWords; ++k) dw_in[i][k] = 0u;
#pragma unroll
        for (int k = 0; k < PackedWords<Z, VEC>::kWords; ++k) zw[i][k] = 0u;
      }
    }
    float mean = 0.0f, rs = 0.0f;
    if (ok) {
      rs = a.rsigma[row];
      if constexpr (!kRms) mean = a.mu[row];
    }
    float s[2] = {0.0f, 0.0f};
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (ok && valid[i]) {
        float gv[VEC], pw[VEC], pb[VEC];
        gamma_at(i, gv);
        if constexpr (kPartSmem) part_io(0, i, pw, false);
        float(&aw)[VEC] = kPartSmem ? pw : dw[kPartSmem ? 0 : i];
        float(&ab)[VEC] = kPartSmem ? pb : db[(kPartSmem || !kHasDb) ? 0 : i];
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float zj = unpack_at<Z, VEC>(zw[i], j);
          const float xhat = (kRms ? zj : zj - mean) * rs;
          const float dy = unpack_at<DY, VEC>(dw_in[i], j);
          const float dyg = dy * gv[j];
          aw[j] = fmaf(dy, xhat, aw[j]);
          if constexpr (kHasDb && !kPartSmem) ab[j] += dy;
          s[0] = fmaf(dyg, xhat, s[0]);
          if constexpr (!kRms) s[1] += dyg;
        }
        if constexpr (kPartSmem) part_io(0, i, pw, true);
      }
    }
    red(s);
    cluster_sum<2>(s, xchg);
    const float c2 = s[0] * a.inv_n;
    const float c1 = kRms ? 0.0f : s[1] * a.inv_n;
    /* dz = rs * (dyg - xhat * c2 - c1) as dyg * rs + ((z - mean) * k2 + k1), k2 = -rs^2 c2 and
     * k1 = -rs c1 per row: two multiply-adds per value and no xhat (dweight took it in the first
     * loop), one operation fewer per value for RMSNorm, two for LayerNorm (NOTES P40). rs^2
     * leaves fp32's normal range only for rows with sigma past 1e19. */
    const float k2 = -(rs * rs) * c2;
    const float k1 = -rs * c1;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (ok && valid[i]) {
        float gv[VEC], dz[VEC];
        gamma_at(i, gv);
#pragma unroll
        for (int j = 0; j < VEC; ++j) {
          const float zj = unpack_at<Z, VEC>(zw[i], j);
          const float dyg = unpack_at<DY, VEC>(dw_in[i], j) * gv[j];
          dz[j] = fmaf(dyg, rs, kRms ? zj * k2 : fmaf(zj - mean, k2, k1));
        }
        if (has_dres_in) {
          float dr[VEC];
          load_vec_dt<VEC>(a.dresidual, row * a.dresidual_stride + col[i], a.dres_dtype, dr);
#pragma unroll
          for (int j = 0; j < VEC; ++j) dz[j] += dr[j];
        }
        store_vec_dt<VEC>(a.dx, row * a.dx_stride + col[i], a.dx_dtype, dz);
        if (has_dres_out) store_vec_dt<VEC>(a.dres, row * a.dres_stride + col[i], a.dres_dtype, dz);
        /* kPartSmem: dbias here, apart from dweight (the 1024-thread LayerNorm build spilled 44
         * bytes with both partials in the first loop; NOTES P37) */
        if constexpr (kPartSmem && kHasDb) {
          float pb[VEC];
          part_io(1, i, pb, false);
#pragma unroll
          for (int j = 0; j < VEC; ++j) pb[j] += unpack_at<DY, VEC>(dw_in[i], j);
          part_io(1, i, pb, true);
        }
      }
    }
  }

  xchg.finish();
  /* One workspace row of partials per CTA (per cluster). */
  const int64_t ws_row = blockIdx.x / ncl;
  float* wsd = a.ws_dw + ws_row * a.ws_pitch;
  float* wsb = a.ws_db != nullptr ? a.ws_db + ws_row * a.ws_pitch : nullptr;
  if constexpr (kPartSmem) { /* G == 1: one row per CTA or cluster */
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (valid[i]) {
        float v[VEC];
        part_io(0, i, v, false);
        store_vec<float, VEC>(wsd + col[i], v);
        if constexpr (kHasDb) {
          part_io(1, i, v, false);
          store_vec<float, VEC>(wsb + col[i], v);
        }
      }
    }
  } else if (G == 1) {
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (valid[i]) {
        store_vec<float, VEC>(wsd + col[i], dw[i]);
        if constexpr (kHasDb) store_vec<float, VEC>(wsb + col[i], db[i]);
      }
    }
  } else {
    /* Combine the row groups in group order through shared memory. */
    const int pitch = a.ws_pitch;
#pragma unroll
    for (int i = 0; i < NV; ++i) {
      if (valid[i]) store_vec<float, VEC>(part + group * pitch + col[i], dw[i]);
    }
    __syncthreads();
    for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
      float acc = part[c];
      for (int k = 1; k < G; ++k) acc += part[k * pitch + c];
      wsd[c] = acc;
    }
    if constexpr (kHasDb) {
      __syncthreads();
#pragma unroll
      for (int i = 0; i < NV; ++i) {
        if (valid[i]) store_vec<float, VEC>(part + group * pitch + col[i], db[i]);
      }
      __syncthreads();
      for (int c = threadIdx.x; c < a.cols; c += blockDim.x) {
        float acc = part[c];
        for (int k = 1; k < G; ++k) acc += part[k * pitch + c];
        wsb[c] = acc;
      }
    }
  }
}

template <typename Z, typename DY, int VEC, int NVB>
__global__ void __launch_bounds__(kMaxRowThreads, 1)
    norm_bwd_blocked_kernel(const BwdArgs a) {
  __shared__ float red_buf[2 * 32 * 2];
  const int nt = blockDim.x;
  const int chunk = nt * NVB * VEC;
  const int cols = a.cols;
  const bool is_rms = a.is_rms != 0;
  const bool has_dres_in = a.dresidual != nullptr;
  const bool has_dres_out = a.dres != nullptr;
  const float g_add = a.zero_centered ? 1.0f : 0.0f;
  float* wsd = a.ws_dw + (int64_t)blockIdx.x * a.ws_pitch;
  float* wsb = a.ws_db != nullptr ? a.ws_db + (int64_t)blockIdx.x * a.ws_pitch : nullptr;
  RowGroupSum<2> red(red_buf, nt, 0);
  bool first = true;

  for (int64_t row = blockIdx.x; row < a.rows; row += gridDim.x) {
    const DY* dyrow = static_cast<const DY*>(a.dy) + row * a.dy_stride;
    const Z* zrow = static_cast<const Z*>(a.x) + row * a.x_stride;
    const float rs = a.rsigma[row];
    const float mean = is_rms ? 0.0f : a.mu[row];

    /* Pass 1: c1, c2. */
    float s[2] = {0.0f, 0.0f};
    for (int c0 = 0; c0 < cols; c0 += chunk) {
      float zv[NVB][VEC], dv[NVB][VEC];
      bool valid[NVB];
      int col[NVB];
#pragma unroll
      for (int i = 0; i < NVB; ++i) {
        col[i] = c0 + (threadIdx.x + i * nt) * VEC;
        valid[i] = col[i] < cols;
        if (valid[i]) {
          load_vec<DY, VEC>(dyrow + col[i], dv[i]);
          load_vec<Z, VEC>(zrow + col[i], zv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < NVB; ++i) {
        if (valid[i]) {
          float gv[VEC];
          load_vec_dt<VEC>(a.weight, col[i], a.w_dtype, gv);
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xhat = (zv[i][j] - mean) * rs;
            const float dyg = dv[i][j] * (gv[j] + g_add);
            s[0] = fmaf(dyg, xhat, s[0]);
            s[1] += dyg;
          }
        }
      }
    }
    red(s);
    const float c2 = s[0] * a.inv_n;
    const float c1 = is_rms ? 0.0f : s[1] * a.inv_n;

    /* Pass 2: dx, dres, workspace partials. */
    for (int c0 = 0; c0 < cols; c0 += chunk) {
      float zv[NVB][VEC], dv[NVB][VEC];
      bool valid[NVB];
      int col[NVB];
#pragma unroll
      for (int i = 0; i < NVB; ++i) {
        col[i] = c0 + (threadIdx.x + i * nt) * VEC;
        valid[i] = col[i] < cols;
        if (valid[i]) {
          load_vec<DY, VEC>(dyrow + col[i], dv[i]);
          load_vec<Z, VEC>(zrow + col[i], zv[i]);
        }
      }
#pragma unroll
      for (int i = 0; i < NVB; ++i) {
        if (valid[i]) {
          float gv[VEC], dz[VEC], pw[VEC], pb[VEC];
          load_vec_dt<VEC>(a.weight, col[i], a.w_dtype, gv);
          if (first) {
#pragma unroll
            for (int j = 0; j < VEC; ++j) {
              pw[j] = 0.0f;
              pb[j] = 0.0f;
            }
          } else {
            load_vec<float, VEC>(wsd + col[i], pw);
            if (wsb != nullptr) load_vec<float, VEC>(wsb + col[i], pb);
          }
#pragma unroll
          for (int j = 0; j < VEC; ++j) {
            const float xhat = (zv[i][j] - mean) * rs;
            const float dy = dv[i][j];
            const float dyg = dy * (gv[j] + g_add);
            dz[j] = rs * (dyg - c1 - xhat * c2);
            pw[j] = fmaf(dy, xhat, pw[j]);
            pb[j] += dy;
          }
          store_vec<float, VEC>(wsd + col[i], pw);
          if (wsb != nullptr) store_vec<float, VEC>(wsb + col[i], pb);
          if (has_dres_in) {
            float dr[VEC];
            load_vec_dt<VEC>(a.dresidual, row * a.dresidual_stride + col[i], a.dres_dtype, dr);
#pragma unroll
            for (int j = 0; j < VEC; ++j) dz[j] += dr[j];
          }
          store_vec_dt<VEC>(a.dx, row * a.dx_stride + col[i], a.dx_dtype, dz);
          if (has_dres_out) store_vec_dt<VEC>(a.dres, row * a.dres_stride + col[i], a.dres_dtype, dz);
        }
      }
    }
    first = false;
  }
  if (first) { /* a CTA without rows (not launched that way, but keep the workspace defined) */
    for (int c = threadIdx.x; c < cols; c += nt) {
      wsd[c] = 0.0f;
      if (wsb != nullptr) wsb[c] = 0.0f;
    }
  }
}

/* Launch the register-path kernel for a configured BwdArgs (tpr, rows_per_iter). kNarrowOnly:
 * compile the 256-thread build only (the 32- and 64-value builds, which run in clusters or in one
 * CTA of at most 256 threads). */
template <typename Z, typename DY, int VEC, int NV, bool kRms, bool kHasDb, bool kNarrowOnly>
engine_status launch_bwd_reg(BwdArgs a, const LaunchCtx& ctx, int64_t max_ctas, int* num_ctas,
                             int block, size_t smem) {
  auto* narrow = &norm_bwd_reg_kernel<Z, DY, VEC, NV, kRms, kHasDb, 256>;
  auto* wide = narrow;
  int max_block = kClusterRowThreads;
  bool cta1024 = false; /* the 1024-thread build runs */
  if constexpr (!kNarrowOnly) {
    wide = &norm_bwd_reg_kernel<Z, DY, VEC, NV, kRms, kHasDb, kMaxRowThreads>;
    max_block = kMaxRowThreads;
    /* One CTA of up to kBwdCtaThreads for a 16-bit row of 16 values per thread (launch_bwd):
     * RMSNorm without dbias partials (RMSNorm with them spilled 160 bytes at the 64 registers of
     * 1024 threads; ptxas -v), LayerNorm with its partials in shared memory (kPartSmem) */
    if constexpr (sizeof(Z) == 2 && sizeof(DY) == 2 && NV * VEC == kBwdElems && !(kRms && kHasDb)) {
      max_block = kBwdCtaThreads;
      cta1024 = block > kMaxRowThreads;
      if (cta1024) wide = &norm_bwd_reg_kernel<Z, DY, VEC, NV, kRms, kHasDb, kBwdCtaThreads>;
    }
  }
  if (a.cluster <= 1 && block > max_block) { /* the launcher asked for a build this one lacks */
    return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm_bwd_reg_kernel: no %d-thread build here",
                     block);
  }
  /* the build that runs, and where it keeps its partials and gamma (bwd_part_smem,
   * bwd_gamma_smem: the kernel's kPartSmem and kGammaSmem) */
  const bool narrow_runs = block <= kClusterRowThreads;
  const int build = narrow_runs ? 256 : (cta1024 ? kBwdCtaThreads : kMaxRowThreads);
  if (bwd_part_smem(kRms, build, NV * VEC)) { /* one row per CTA or cluster */
    smem = (size_t)(kHasDb ? 2 : 1) * gb_floats(NV, a.tpr, VEC) * sizeof(float);
  }
  /* gamma + g_add as fp32 in shared memory after the row groups' partials, where gb_smem_offset
   * allows (as in the forward) */
  const void* fn = reinterpret_cast<const void*>(narrow_runs ? narrow : wide);
  const size_t gb = (size_t)gb_floats(NV, a.tpr, VEC) * sizeof(float);
  a.gb_off = -1;
  if (bwd_gamma_smem(kRms, build, NV * VEC)) {
    ENGINE_TRY(gb_smem_offset(fn, block, a.cluster, gb, ctx, &smem, &a.gb_off));
  }
  int64_t grid = 0;
  ENGINE_TRY(launch_row_kernel(narrow, wide, a, block, smem, ceil_div(a.rows, a.rows_per_iter), ctx,
                               kBwdMaxCtasPerSm, max_ctas, &grid, "norm_bwd_reg_kernel"));
  *num_ctas = (int)grid; /* rows of partials in the workspace (one per cluster when clustered) */
  return ENGINE_SUCCESS;
}

/* Compile-time norm kind and dbias partials. */
template <typename Z, typename DY, int VEC, int NV, bool kNarrowOnly = false>
engine_status launch_bwd_reg_k(const BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                               int* num_ctas, int block, size_t smem) {
  const bool has_db = a.ws_db != nullptr;
  if (a.is_rms) {
    return has_db ? launch_bwd_reg<Z, DY, VEC, NV, true, true, kNarrowOnly>(a, ctx, max_ctas, num_ctas, block, smem)
                  : launch_bwd_reg<Z, DY, VEC, NV, true, false, kNarrowOnly>(a, ctx, max_ctas, num_ctas, block, smem);
  }
  return has_db ? launch_bwd_reg<Z, DY, VEC, NV, false, true, kNarrowOnly>(a, ctx, max_ctas, num_ctas, block, smem)
                : launch_bwd_reg<Z, DY, VEC, NV, false, false, kNarrowOnly>(a, ctx, max_ctas, num_ctas, block, smem);
}

/* Rows past the widest kBwdElems cluster of portable size (8 x 256 threads x 16 = 32K elements)
 * over 16-bit z and dy: the same cluster kernel with 2x / 4x the values per thread, so that the
 * row is read once and the dweight / dbias partials stay on chip across the CTA's rows. The
 * blocked kernel these rows took before read-modify-writes a workspace row of N floats per row
 * (per operand), 2.3x the backward's minimum traffic at 64K: 1.6-2.1x slower (benchmarks/NOTES.md,
 * session 7, P10-P11). In order, fewest values per thread first and, at equal values, portable
 * clusters first (measured, P11: 16 values in 16 CTAs lost 1 point to 32 values in 8 at 64K;
 * 32 values in 16 CTAs beat 64 in 8 by 3-5 at 128K, where 64 values leave one CTA per SM; at
 * 98304, in one run, LayerNorm went the other way, 35.0 against 39.5, and RMSNorm tied):
 *   32 values in <= 8 CTAs (to 64K), 32 in 16 (to 128K), 64 in <= 16 (to 256K).
 * Where 32 values fit 256 threads, one CTA and no cluster (rows of 4K-8K by default, and past
 * 4K with engine_set_norm_bwd_elems at 32; callers pass rows needing more than 128 threads at 32
 * values, so that a CTA holds one row and the partials have the shared memory to themselves).
 * Returns false (nothing launched) when none fits max_cluster. */
template <typename Z, typename DY, int VEC, int NV>
bool launch_bwd_wide(BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas, int* num_ctas,
                     engine_status* st) {
  if constexpr (sizeof(Z) == 2 && sizeof(DY) == 2) {
    const int nvec = a.cols / VEC;
    const int t2 = (int)ceil_div(nvec, 2 * NV), t4 = (int)ceil_div(nvec, 4 * NV);
    const int portable = ctx.max_cluster < kPortableCluster ? ctx.max_cluster : kPortableCluster;
    int c = t2 <= kClusterRowThreads ? 1 : row_cluster(t2, portable);
    if (c == 0) c = row_cluster(t2, ctx.max_cluster);
    if (c > 0) {
      a.cluster = c;
      a.tpr = c == 1 ? (int)round_up(t2, 32) : cluster_tpr(t2, c);
      a.rows_per_iter = 1;
      *st = launch_bwd_reg_k<Z, DY, VEC, 2 * NV, true>(a, ctx, max_ctas, num_ctas, a.tpr, 0);
      return true;
    }
    if ((c = row_cluster(t4, ctx.max_cluster)) > 0) {
      a.cluster = c;
      a.tpr = cluster_tpr(t4, c);
      a.rows_per_iter = 1;
      *st = launch_bwd_reg_k<Z, DY, VEC, 4 * NV, true>(a, ctx, max_ctas, num_ctas, a.tpr, 0);
      return true;
    }
  }
  return false;
}

template <typename Z, typename DY>
engine_status launch_bwd(BwdArgs a, const LaunchCtx& ctx, int64_t max_ctas, int* num_ctas) {
  constexpr int VEC = bwd_vec<Z, DY>();
  constexpr int NV = kBwdElems / VEC;
  const int64_t rows = a.rows;
  const int cols = a.cols;
  const int wsz = dtype_size(a.w_dtype);
  const int rsz = dtype_size(a.dres_dtype);
  const bool vec = (cols % VEC == 0) && vec_ok(a.dy, a.dy_stride, rows, sizeof(DY), VEC) &&
                   vec_ok(a.x, a.x_stride, rows, sizeof(Z), VEC) &&
                   vec_ok(a.dx, a.dx_stride, rows, dtype_size(a.dx_dtype), VEC) &&
                   vec_ok(a.dres, a.dres_stride, rows, rsz, VEC) &&
                   vec_ok(a.dresidual, a.dresidual_stride, rows, rsz, VEC) &&
                   vec_ok(a.weight, 0, 1, wsz, VEC);
  const int nvec = cols / VEC;
  const int tpr_raw = (nvec + NV - 1) / NV;
  const int tpr = row_group_tpr(tpr_raw);

  a.cluster = 1;
  /* The streamed cluster kernel (norm_bwd_stream.cuh) for 16-bit rows from bwd_take_stream's
   * width, where a cluster holds the row. */
  if (sizeof(Z) == 2 && sizeof(DY) == 2 && vec && bwd_take_stream(cols, ctx.bwd_stream_from)) {
    engine_status st = ENGINE_SUCCESS;
    if (launch_bwd_stream<Z, DY>(a, ctx, max_ctas, num_ctas, &st)) return st;
  }
  /* 16 values per thread in one CTA per row (16-bit z and dy), as the Triton backward runs 16K (one
   * program of 32 warps per SM, the row in registers: NOTES P33): no cluster barrier per row, the
   * partials in registers. By default (ctx.bwd_cta_threads 0 or 1024) rows that need 513-1024
   * threads (bf16 8K-16K) in one CTA of up to 1024: RMSNorm fwd+bwd 16K 65 -> 77 % (P34);
   * LayerNorm's partials in shared memory there (P37). 512: rows of 257-512
   * threads (4K-8K) in one CTA of up to 512, both norms, which lost 5 points at 8K to the 32
   * values in 256 threads below (P34), for A/B runs only; 256: neither. */
  const int cta = ctx.bwd_cta_threads != 0 ? ctx.bwd_cta_threads : kBwdCtaThreadsDefault;
  /* the 1024-thread builds (launch_bwd_reg): RMSNorm without dbias partials, LayerNorm */
  const bool has_cta_build = !a.is_rms || a.ws_db == nullptr;
  const bool one_cta =
      cta == kMaxRowThreads   ? tpr_raw > kClusterRowThreads && tpr_raw <= kMaxRowThreads
      : cta == kBwdCtaThreads ? tpr_raw > kMaxRowThreads && tpr_raw <= kBwdCtaThreads && has_cta_build
                              : false;
  if (sizeof(Z) == 2 && sizeof(DY) == 2 && vec && ctx.bwd_elems != 32 && one_cta) {
    a.tpr = (int)round_up(tpr_raw, 32);
    a.rows_per_iter = 1;
    return launch_bwd_reg_k<Z, DY, VEC, NV>(a, ctx, max_ctas, num_ctas, a.tpr, 0);
  }
  /* 32 values per thread in one CTA for 16-bit rows of 4K-8K (tpr_raw 257-512), where 16 would
   * need a 2-CTA cluster: +2.3-2.5 points of fwd+bwd at 8K in an A/B/A run (P14); at 16K-32K
   * clusters of half the size at 32 values lost 2-3 points, so those keep 16 (the knob: 32
   * values past 4K everywhere, 16 nowhere). */
  const bool elems32 = ctx.bwd_elems == 32 || (ctx.bwd_elems == 0 && tpr_raw <= 2 * kClusterRowThreads);
  if (elems32 && vec && tpr_raw > kClusterRowThreads) {
    engine_status st = ENGINE_SUCCESS;
    if (launch_bwd_wide<Z, DY, VEC, NV>(a, ctx, max_ctas, num_ctas, &st)) return st;
  }
  /* kBwdElems values per thread in clusters of portable size only: past 32K the wide-cluster
   * kernels (below) beat 16 values in 16 CTAs (P11). */
  const int cluster =
      vec ? row_cluster(tpr_raw, ctx.max_cluster < kPortableCluster ? ctx.max_cluster : kPortableCluster) : 0;
  if (cluster > 1) { /* the row over a cluster of CTAs (see the forward) */
    a.cluster = cluster;
    a.tpr = cluster_tpr(tpr_raw, cluster);
    a.rows_per_iter = 1;
    return launch_bwd_reg_k<Z, DY, VEC, NV>(a, ctx, max_ctas, num_ctas, a.tpr, 0);
  }

  if (vec && tpr <= kMaxRowThreads) {
    const int G = row_groups_per_cta(tpr);
    const int block = tpr * G;
    a.tpr = tpr;
    a.rows_per_iter = G;
    const size_t smem = G > 1 ? (size_t)G * a.ws_pitch * sizeof(float) : 0;
    return launch_bwd_reg_k<Z, DY, VEC, NV>(a, ctx, max_ctas, num_ctas, block, smem);
  }

  if (vec && tpr > kMaxRowThreads && ctx.bwd_elems != 16) { /* 16: the knob's 16 values only */
    engine_status st = ENGINE_SUCCESS;
    if (launch_bwd_wide<Z, DY, VEC, NV>(a, ctx, max_ctas, num_ctas, &st)) return st;
  }

  if (vec) {
    constexpr int NVB = NV;
    const int block = kMaxRowThreads;
    const void* fn = reinterpret_cast<const void*>(&norm_bwd_blocked_kernel<Z, DY, VEC, NVB>);
    int per_sm = 1;
    ENGINE_TRY(blocks_per_sm(fn, block, 0, &per_sm));
    if (per_sm > kBwdMaxCtasPerSm) per_sm = kBwdMaxCtasPerSm;
    int64_t grid = persistent_grid(rows, ctx.sm_count, ctx.sm_margin, per_sm);
    if (grid > max_ctas) grid = max_ctas;
    *num_ctas = (int)grid;
    norm_bwd_blocked_kernel<Z, DY, VEC, NVB><<<(unsigned)grid, block, 0, ctx.stream>>>(a);
    ENGINE_CHECK_LAUNCH("norm_bwd_blocked_kernel");
  } else {
    constexpr int NVB = 8;
    int64_t want = round_up(ceil_div(cols, NVB), 32);
    const int block = (int)(want < 32 ? 32 : (want > kMaxRowThreads ? kMaxRowThreads : want));
    const void* fn = reinterpret_cast<const void*>(&norm_bwd_blocked_kernel<Z, DY, 1, NVB>);
    int per_sm = 1;
    ENGINE_TRY(blocks_per_sm(fn, block, 0, &per_sm));
    if (per_sm > kBwdMaxCtasPerSm) per_sm = kBwdMaxCtasPerSm;
    int64_t grid = persistent_grid(rows, ctx.sm_count, ctx.sm_margin, per_sm);
    if (grid > max_ctas) grid = max_ctas;
    *num_ctas = (int)grid;
    norm_bwd_blocked_kernel<Z, DY, 1, NVB><<<(unsigned)grid, block, 0, ctx.stream>>>(a);
    ENGINE_CHECK_LAUNCH("norm_bwd_blocked_kernel(scalar)");
  }
  return ENGINE_SUCCESS;
}

template <typename Z>
engine_status dispatch_bwd_dy(engine_dtype dyt, BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                              int* num_ctas) {
  switch (dyt) {
    case ENGINE_DTYPE_FLOAT32: return launch_bwd<Z, float>(a, ctx, max_ctas, num_ctas);
    case ENGINE_DTYPE_FLOAT16: return launch_bwd<Z, __half>(a, ctx, max_ctas, num_ctas);
    case ENGINE_DTYPE_BFLOAT16: return launch_bwd<Z, __nv_bfloat16>(a, ctx, max_ctas, num_ctas);
    default: break;
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm backward: unsupported dy dtype %s",
                   dtype_name(dyt));
}

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_BWD_CUH_
