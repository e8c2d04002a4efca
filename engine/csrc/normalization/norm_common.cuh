/*
 * Shared definitions of the norm kernels: kernel argument blocks, modes, launch context and the
 * per-dtype dispatch entry points implemented by the instantiation files
 *   norm_fwd_{f32,f16,bf16,fp8}.cu   (split by output dtype)
 *   norm_bwd_{f32,f16,bf16}.cu       (split by the dtype of x, the normalised input z)
 * and called by norm_api.cu (the C API: validation and pass orchestration).
 */
#ifndef ENGINE_CSRC_NORMALIZATION_NORM_COMMON_CUH_
#define ENGINE_CSRC_NORMALIZATION_NORM_COMMON_CUH_

#include <cuda_runtime.h>
#include <stdint.h>

#include "common/common.cuh"
#include "engine/normalization.h"

namespace engine {
namespace norm {

/* Forward kernel modes.
 *   kFull : residual add, statistics, output (high precision, or FP8 with a given scale and amax
 *           max-update; delayed scaling).
 *   kStats: current scaling pass 1: residual add, statistics and amax of y; no output.
 *   kApply: current scaling pass 2: reads z (x points at residual_out or x) and the stored mu /
 *           rsigma, derives the scale from amax, writes out (and out_t), scale and scale_inv. */
enum FwdMode : int { kFull = 0, kStats = 1, kApply = 2 };

struct FwdArgs {
  int64_t rows;
  int cols;
  const void* x; /* kApply: z */
  int64_t x_stride;
  const void* residual; /* NULL: no residual add (always NULL in kApply) */
  int64_t res_stride;
  void* residual_out;
  int64_t res_out_stride;
  const void* weight;
  const void* bias; /* NULL: no bias */
  engine_dtype w_dtype;
  void* out; /* unused in kStats */
  int64_t out_stride;
  float* mu;     /* LayerNorm: written (kFull, kStats) or read (kApply) */
  float* rsigma; /* written (kFull, kStats) or read (kApply) */
  float* scale;
  float* amax;
  float* scale_inv;
  uint8_t* out_t; /* in-kernel transposed FP8 copy [cols, rows], or NULL */
  float eps;
  float inv_n;
  float amax_eps;
  float fp8_max;
  int mode;
  int is_rms;
  int zero_centered;
  int e5m2;
  /* launch configuration, filled in by the launcher */
  int tpr;           /* threads per row (register path) */
  int rows_per_iter; /* row groups per CTA (register path) */
  int tile_rows;     /* rows per transposed tile (0: no in-kernel transpose) */
  int tile_pitch;    /* bytes per shared-memory tile row */
  int t_vec16;       /* out_t rows are 16-byte aligned runs */
  int t_auto;        /* out_t by the faster path (engine_norm_fwd_params::out_t_auto == 1) */
  int t_wanted;      /* a transposed copy of out is made, by the kernel (out_t) or after it */
  int cluster;       /* CTAs per thread-block cluster sharing each row (1: none; register path) */
  int grid_clusters; /* gridDim.x / cluster, the row loop's stride (a parameter, not a register) */
  int gb_off;        /* register path: byte offset in dynamic shared memory of gamma (+ the
                        zero-centred 1) and beta as fp32 (gb_floats per operand), or -1: the
                        epilogue reads them from global memory (L1) per row */
};

struct BwdArgs {
  int64_t rows;
  int cols;
  const void* dy;
  int64_t dy_stride;
  const void* x; /* z */
  int64_t x_stride;
  const float* mu;
  const float* rsigma;
  const void* weight;
  engine_dtype w_dtype;
  const void* dresidual; /* NULL or dres_dtype */
  int64_t dresidual_stride;
  void* dx;
  engine_dtype dx_dtype;
  int64_t dx_stride;
  void* dres; /* NULL or dres_dtype */
  engine_dtype dres_dtype;
  int64_t dres_stride;
  float* ws_dw; /* [num_ctas, ws_pitch] */
  float* ws_db; /* [num_ctas, ws_pitch] or NULL */
  int ws_pitch;
  float inv_n;
  int is_rms;
  int zero_centered;
  int tpr;
  int rows_per_iter;
  int cluster; /* CTAs per thread-block cluster sharing each row (1: none; register path) */
  int grid_clusters; /* gridDim.x / cluster (see FwdArgs) */
  int gb_off;        /* register path: byte offset in dynamic shared memory of gamma + the
                        zero-centred 1 as fp32 (slots as in FwdArgs), or -1: read per row (L1) */
};

struct LaunchCtx {
  int sm_count;
  int sm_margin;
  int max_smem_optin;
  int smem_per_sm;
  int max_cluster; /* largest thread-block cluster a row may be split over (1: none) */
  cudaStream_t stream;
  int fwd_vectors; /* forward register path, 16-bit z: vectors per thread (0: by row width) */
  int bwd_elems;   /* backward register path, 16-bit z and dy: values per thread (0: by width) */
  int fwd_general; /* forward register path: 1 runs the general row loop for every launch */
  int bwd_cta_threads; /* backward register path, 16-bit z and dy: the one-CTA layouts at 16
                          values per thread (engine_set_norm_bwd_cta_threads; 0: the default) */
  int fwd_blocked_from; /* forward: width from which the blocked kernel runs (0: the default;
                           engine_set_norm_fwd_blocked_from) */
  int fwd_grid_per_sm;  /* forward register path without a cluster: CTAs per SM of the grid (0:
                           the default; engine_set_norm_fwd_grid_per_sm) */
  int bwd_stream_from;  /* backward: width from which the streamed kernel runs (0: the default;
                           engine_set_norm_bwd_stream_from) */
  int bwd_stream_threads; /* backward, streamed kernel: largest CTA (0: the default;
                             engine_set_norm_bwd_stream_threads) */
  int fwd_stream_from;  /* forward: width from which the streamed kernel runs (0: the default;
                           engine_set_norm_fwd_stream_from) */
  int fwd_stream_threads; /* forward, streamed kernel: largest CTA (0: the default;
                             engine_set_norm_fwd_stream_threads) */
  int fwd_band;           /* forward, band kernel (FP8 + transposed): 0 the default, 1 never, 2-4
                             one configuration wherever it fits (engine_set_norm_fwd_band) */
  int lean_dram;          /* 1: the lean card's defaults where the cards measured apart (lean_dram,
                             engine_set_dram_class; NOTES P109) */
  int fwd_lean;           /* forward: 1 keeps the register kernel where the lean kernel applies
                             (engine_set_norm_fwd_lean; 0: the default, the lean kernel) */
  int fwd_blocked_shape;  /* forward, blocked kernel, residual rows of a 16-bit x to a non-FP8
                             output: 0 the default (by width: fwd_blocked_res_shape), 1 four
                             vectors per thread per chunk on the resident grid, 2 two vectors per
                             thread, 3 two vectors and 32 CTAs per SM, 4 four vectors and 32 CTAs
                             per SM (engine_set_norm_fwd_blocked_shape; P162) */
  int fwd_fp8_lean;       /* forward, the lean FP8 kernel: 0 the default widths (fwd_fp8_lean_takes),
                             1 never, 2 every width it fits (engine_set_norm_fwd_fp8_lean; P179,
                             P181) */
};

/* Register-path limits (see the launchers): the forward keeps up to 8 vectors of 16 bytes of x
 * per thread, the backward 16 elements; both at most 512 threads per row. */
constexpr int kMaxRowThreads = 512;
constexpr int kFwdNV = 8;
constexpr int kBwdElems = 16;
/* The backward's register path over 16-bit z and dy: the CTA one row of 513-1024 threads gets at
 * kBwdElems values per thread without a cluster (engine_set_norm_bwd_cta_threads), and the
 * launcher's default layout setting (that CTA: benchmarks/NOTES.md, P34, P37). */
constexpr int kBwdCtaThreads = 1024;
constexpr int kBwdCtaThreadsDefault = kBwdCtaThreads;

/* Upper bound on backward CTAs per SM, so that the workspace size depends on (rows, cols,
 * sm_count, sm_margin) only, not on dtypes or occupancy. */
constexpr int kBwdMaxCtasPerSm = 4;

/* Rows wider than one 256-thread CTA on the register path are split over a thread-block cluster
 * of CTAs of at most kClusterRowThreads threads each (sm_90), rather than given to one CTA of up to
 * 512 threads (1 CTA per SM) or to the blocked path (two passes over the row): CTAs per cluster,
 * a power of two <= max_cluster (8 by default; 16, a non-portable size, on request), or 0 when
 * tpr_raw threads per row do not fit max_cluster such CTAs or clusters are off (cta_threads:
 * another CTA size; the streamed backward's). */
constexpr int kClusterRowThreads = 256;
constexpr int kPortableCluster = 8; /* the largest cluster size every sm_90 device guarantees */
inline int row_cluster(int tpr_raw, int max_cluster, int cta_threads = kClusterRowThreads) {
  if (tpr_raw <= cta_threads || max_cluster < 2) return 0;
  for (int c = 2; c <= max_cluster; c *= 2) {
    if (tpr_raw <= c * cta_threads) return c;
  }
  return 0;
}
/* Register paths without a cluster: threads per row group for a row that needs tpr_raw threads
 * (a power of two up to 32, so that the group lives inside one warp; else a multiple of 32), and
 * the row groups one CTA holds (as many as fit 256 threads, at least one). */
inline int row_group_tpr(int tpr_raw) {
  return tpr_raw <= 32 ? pow2_ceil(tpr_raw) : (int)round_up(tpr_raw, 32);
}
inline int row_groups_per_cta(int tpr) { return pow2_floor(tpr >= 256 ? 1 : 256 / tpr); }

/* Threads per CTA of a row split over `cluster` CTAs (a multiple of 32). */
inline int cluster_tpr(int tpr_raw, int cluster) { return (int)round_up(ceil_div(tpr_raw, cluster), 32); }

/* The streamed kernels' layout (norm_fwd_stream.cuh, norm_bwd_stream.cuh): the smallest cluster,
 * at least 2 (their sends and barriers are cluster instructions) and a power of two up to
 * min(max_cluster, cap), whose CTAs of at most tmax threads hold a row of tpr_raw threads; returns
 * it and sets *tpr (threads per CTA), or returns 0 where none fits or clusters are off. */
inline int stream_cluster(int tpr_raw, int max_cluster, int cap, int tmax, int* tpr) {
  if (max_cluster < 2) return 0;
  const int max_c = max_cluster < cap ? max_cluster : cap;
  const int c = tpr_raw <= 2 * tmax ? 2 : row_cluster(tpr_raw, max_c, tmax);
  if (c != 0) *tpr = cluster_tpr(tpr_raw, c);
  return c;
}

/* The streamed kernels' ring of shared-memory stages (shared::cta addresses): a thread's slot in
 * the stage after `s`, wrapping from the last stage to the first. */
struct StageRing {
  uint32_t first; /* the thread's slot in stage 0 */
  uint32_t end;   /* first + stages * bytes */
  uint32_t bytes; /* one stage */
  __device__ __forceinline__ uint32_t next(uint32_t s) const {
    s += bytes;
    return s == end ? first : s;
  }
};

/* rsigma of a row from its mean square (about the mean for LayerNorm) plus eps: the hardware
 * reciprocal square root (rsqrtf, MUFU.RSQ: within 2 ulp, subnormal inputs scaled; 1 / 0 = inf,
 * as 1 / sqrtf(0)), as Transformer Engine's and Apex's norms and Triton's tl.math.rsqrt (this
 * product's Triton backend) compute it, in place of the IEEE sqrt and division (NOTES P186: their
 * slow paths and their latency sit on every row's path between the reductions and the epilogue).
 * One function for every forward kernel, so that every path's rsigma, and so its outputs, have the
 * same bits (kStats / kApply, the stream against the register path). */
__device__ __forceinline__ float row_rsigma(float ms_eps) { return rsqrtf(ms_eps); }

/* LayerNorm's statistics in one pass (NOTES P80): from mean = E[z] and e2 = E[z^2] (one pass's
 * sums of z and z^2 over the row, times 1 / N), var = e2 - mean^2 wherever mean^2 <= 3/4 e2
 * (mean^2 <= 3 var): there var >= e2 / 4, so the subtraction costs at most 2 bits against the
 * rounding of the sums themselves. Returns false (var not to be used) otherwise (a large mean
 * against the spread, or NaN / Inf): the caller then takes the exact centred pass about the mean,
 * E[(z - mean)^2]. Rows of N(0, 1) and any row with |mean| < ~1.7 standard deviations take the
 * one pass; rows of 1e4 + noise the centred one (tests/test_norm_contract.py: large_mean,
 * mean_against_spread). */
constexpr float kLnOnePassMax = 0.75f; /* the largest mean^2 / E[z^2] taken in one pass */
__device__ __forceinline__ bool ln_one_pass_var(float mean, float e2, float& var) {
  const float c = mean * mean;
  var = e2 - c;
  return c <= kLnOnePassMax * e2;
}

/* The same test on sums over n values (s = sum z, q = sum z^2, inv_n = 1 / n): m2 = q - s^2 / n,
 * the sum of squares about the mean (n var), for the streamed kernel's per-warp statistics. */
__device__ __forceinline__ bool ln_one_pass_m2(float s, float q, float inv_n, float& m2) {
  const float c = s * s * inv_n;
  m2 = q - c;
  return c <= kLnOnePassMax * q;
}

/* Register paths, gamma (and beta) as fp32 in shared memory: floats per operand (the slots of one
 * row group, or of this CTA's part of a cluster's row), slot i of lane lr at
 * (i * tpr + lr) * vec. */
__host__ __device__ __forceinline__ int gb_floats(int nv, int tpr, int vec) {
  return nv * tpr * vec;
}

/* Register paths, gamma / beta in shared memory: calls fill(k, v) for every slot k = i * tpr + lr
 * of this CTA's lanes of a row, v being the slot's 16-byte vector (lane0 + lr + i * gstride, lane0
 * the CTA's first lane of the row) where it lies in the row and -1 where it does not (the callers
 * store zeros there: a slot outside the row then computes 0 without a branch), spread over the
 * CTA's threads, then __syncthreads(). Called uniformly by all threads. */
template <typename Fill>
__device__ __forceinline__ void fill_row_slots(int nv, int tpr, int lane0, int gstride, int nvec,
                                               Fill&& fill) {
  for (int k = threadIdx.x; k < nv * tpr; k += blockDim.x) {
    const int v = lane0 + (k % tpr) + (k / tpr) * gstride;
    fill(k, v < nvec ? v : -1);
  }
  __syncthreads();
}

/* Register paths: the thread at lane `glane` of a row of `gstride` threads (a row group of one
 * CTA, or the CTAs of a cluster sharing the row) owns the 16-byte vectors glane, glane + gstride,
 * ..., of the row's nvec; col[i] is the first element of its slot i, valid[i] whether it lies in
 * the row. */
template <int NV, int VEC>
__device__ __forceinline__ void row_slots(int glane, int gstride, int nvec, int (&col)[NV],
                                          bool (&valid)[NV]) {
#pragma unroll
  for (int i = 0; i < NV; ++i) {
    const int v = glane + i * gstride;
    valid[i] = v < nvec;
    col[i] = v * VEC;
  }
}

/*
 * Launch a register-path row kernel (forward or backward) for a configured argument block (tpr,
 * rows_per_iter, cluster): `narrow` is its 256-thread build (blocks of up to 256 threads, and
 * every cluster launch), `wide` its kMaxRowThreads build. The grid is persistent over `work` row
 * blocks, with at most per_sm_cap CTAs per SM (0: occupancy alone) and max_units grid units in all
 * (CTAs, or clusters when a.cluster > 1); *units receives it, and so does the kernel's
 * a.grid_clusters (the row loop's stride). per_sm_set > 0 (without a cluster) sets the CTAs per SM
 * instead of the occupancy: more than fit at once queue for the block scheduler (not under an
 * sm_margin: grid_per_sm).
 */
/* CTAs per SM of a grid without a cluster: per_sm_set (> 0) where a launcher sets it, else the
 * resident count; but under an sm_margin never more than are resident. A grid past residency
 * queues CTAs on every SM, so that no SM is free for the kernels sm_margin makes room for until
 * its tail (NOTES P164: the register and lean kernels' 16 CTAs per SM, the blocked kernel's 32). */
inline int grid_per_sm(int resident, int per_sm_set, int sm_margin) {
  if (per_sm_set <= 0) return resident;
  return sm_margin > 0 && per_sm_set > resident ? resident : per_sm_set;
}

template <typename Args>
engine_status launch_row_kernel(void (*narrow)(Args), void (*wide)(Args), Args a, int block,
                                size_t smem, int64_t work, const LaunchCtx& ctx, int per_sm_cap,
                                int64_t max_units, int64_t* units, const char* name,
                                int per_sm_set = 0) {
  void (*kernel)(Args) = block <= kClusterRowThreads ? narrow : wide;
  const void* fn = reinterpret_cast<const void*>(kernel);
  int64_t grid = 1;
  if (a.cluster > 1) {
    if (block > kClusterRowThreads) { /* the wide build compiles no cluster code */
      return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "%s: a cluster of %d-thread CTAs", name, block);
    }
    int active = 1;
    ENGINE_TRY(active_clusters(fn, block, smem, a.cluster, &active));
    grid = persistent_clusters(work, active, ctx.sm_count, ctx.sm_margin);
  } else {
    int per_sm = 1;
    ENGINE_TRY(blocks_per_sm(fn, block, smem, &per_sm));
    if (per_sm_cap > 0 && per_sm > per_sm_cap) per_sm = per_sm_cap;
    per_sm = grid_per_sm(per_sm, per_sm_set, ctx.sm_margin);
    grid = persistent_grid(work, ctx.sm_count, ctx.sm_margin, per_sm);
  }
  if (grid > max_units) grid = max_units;
  *units = grid;
  a.grid_clusters = (int)grid;
  if (a.cluster > 1) {
    return launch_in_clusters(kernel, grid * a.cluster, block, smem, a.cluster, ctx.stream, a);
  }
  kernel<<<(unsigned)grid, block, smem, ctx.stream>>>(a);
  ENGINE_CHECK_LAUNCH(name);
  return ENGINE_SUCCESS;
}

/* Register paths: where `extra` bytes of shared memory (gamma / beta as fp32) go after the launch's
 * `smem` bytes: *off receives their 16-byte aligned offset, or -1 when they would leave fewer CTAs
 * (clusters) of `fn` resident than without them, not fit the opt-in limit (1024 bytes are kept
 * for the kernels' static shared memory), or take the resident CTAs' shared memory past half of
 * the SM's: shared memory is carved out of the L1 the streaming loads land in, and at 3 x 64 KB
 * (RMSNorm fwd 16K, LayerNorm fwd 8K) the kernels lost 3-9 points where 3 x 32 KB gained
 * (benchmarks/NOTES.md, session 5, P3). *smem grows by them when they are used. */
inline engine_status gb_smem_offset(const void* fn, int block, int cluster, size_t extra,
                                    const LaunchCtx& ctx, size_t* smem, int* off) {
  *off = -1;
  const size_t at = (size_t)round_up((int64_t)*smem, 16);
  if (at + extra > (size_t)ctx.max_smem_optin - 1024) return ENGINE_SUCCESS;
  int base = 0, more = 0;
  if (cluster > 1) {
    ENGINE_TRY(active_clusters(fn, block, *smem, cluster, &base));
    ENGINE_TRY(active_clusters(fn, block, at + extra, cluster, &more));
  } else {
    ENGINE_TRY(blocks_per_sm(fn, block, *smem, &base));
    ENGINE_TRY(blocks_per_sm(fn, block, at + extra, &more));
  }
  const int per_sm = cluster > 1 ? (int)ceil_div((int64_t)more * cluster, ctx.sm_count) : more;
  if (more >= base && (int64_t)per_sm * (int64_t)(at + extra + 1024) <= ctx.smem_per_sm / 2) {
    *off = (int)at;
    *smem = at + extra;
  }
  return ENGINE_SUCCESS;
}

inline int64_t bwd_ws_pitch(int64_t cols) { return round_up(cols, 4); }
inline int64_t bwd_max_ctas(int64_t rows, int sm_count, int sm_margin) {
  int64_t sms = (int64_t)sm_count - (int64_t)(sm_margin > 0 ? sm_margin : 0);
  if (sms < 1) sms = 1;
  const int64_t cap = sms * kBwdMaxCtasPerSm;
  return rows < cap ? rows : cap;
}

/* Launch one forward pass. x_dtype / r_dtype: the row input and residual dtypes (r_dtype ==
 * x_dtype when there is no residual). *transposed: whether out_t was written in-kernel (false:
 * the caller must transpose `out` itself). */
engine_status fwd_out_f32(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                          const LaunchCtx& ctx, bool* transposed);
engine_status fwd_out_f16(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                          const LaunchCtx& ctx, bool* transposed);
engine_status fwd_out_bf16(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                           const LaunchCtx& ctx, bool* transposed);
engine_status fwd_out_fp8(engine_dtype x_dtype, engine_dtype r_dtype, FwdArgs& a,
                          const LaunchCtx& ctx, bool* transposed);
/* fwd_out_fp8's units by x dtype (norm_fwd_fp8_x*.cu); r_dtype: x's own or fp32 */
engine_status fwd_out_fp8_x_f32(engine_dtype r_dtype, FwdArgs& a, const LaunchCtx& ctx,
                                bool* transposed);
engine_status fwd_out_fp8_x_f16(engine_dtype r_dtype, FwdArgs& a, const LaunchCtx& ctx,
                                bool* transposed);
engine_status fwd_out_fp8_x_bf16(engine_dtype r_dtype, FwdArgs& a, const LaunchCtx& ctx,
                                 bool* transposed);

/* Launch the backward main kernel; *num_ctas receives the grid size (rows of partials written to
 * the workspace). The workspace pointers in `a` are laid out by the caller from max_ctas. */
engine_status bwd_x_f32(engine_dtype dy_dtype, BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                        int* num_ctas);
engine_status bwd_x_f16(engine_dtype dy_dtype, BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                        int* num_ctas);
engine_status bwd_x_bf16(engine_dtype dy_dtype, BwdArgs& a, const LaunchCtx& ctx, int64_t max_ctas,
                         int* num_ctas);

}  // namespace norm
}  // namespace engine

#endif  // ENGINE_CSRC_NORMALIZATION_NORM_COMMON_CUH_
