/*
 * The C API of the norms (engine/normalization.h): parameter validation, pass orchestration and
 * the deterministic dweight / dbias reduction kernel. The row kernels live in norm_fwd.cuh (their
 * launchers in norm_fwd_launch.cuh) and norm_bwd.cuh, instantiated in norm_{fwd,bwd}_<dtype>.cu.
 *
 * Forward:
 *   high-precision out, or FP8 with delayed scaling: one kernel (kFull);
 *   FP8 with current scaling: cudaMemsetAsync(amax) -> kStats kernel (statistics, residual_out,
 *   amax; no output) -> kApply kernel (re-reads z and mu / rsigma, derives the scale from amax,
 *   writes out / out_t, scale and scale_inv).
 *   out_t is written inside the kernel when the register path can stage a tile of rows in shared
 *   memory; otherwise (wide rows, blocked path) the FP8 rowwise output is transposed afterwards by
 *   the tiled fp8 transpose (bitwise the same result).
 *   rows == 0: nothing for high-precision outputs; FP8 still writes scale_inv (and, for current
 *   scaling, amax = 0 and scale = compute_scale(0)).
 * Backward: the row kernel writes per-CTA fp32 partials of dweight / dbias into the workspace
 * ([max_ctas, pitch] each, pitch = cols rounded up to 4 floats), then norm_bwd_reduce_kernel sums
 * the rows actually written in a fixed order. Nothing allocates, nothing synchronises; every call
 * is capturable in a CUDA graph.
 */
#include <algorithm>
#include <type_traits>

#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/tile.cuh"
#include "common/vec.cuh"
#include "engine/normalization.h"
#include "engine/transpose.h"
#include "normalization/norm_common.cuh"

namespace engine {
namespace norm {
namespace {

/* cols are indexed with int inside the kernels (chunk offsets may run past cols by a chunk). */
constexpr int64_t kMaxCols = (int64_t)1 << 30;

engine_status fwd_dispatch(engine_dtype out_dtype, engine_dtype xt, engine_dtype rt, FwdArgs& a,
                           const LaunchCtx& ctx, bool* transposed) {
  switch (out_dtype) {
    case ENGINE_DTYPE_FLOAT32: return fwd_out_f32(xt, rt, a, ctx, transposed);
    case ENGINE_DTYPE_FLOAT16: return fwd_out_f16(xt, rt, a, ctx, transposed);
    case ENGINE_DTYPE_BFLOAT16: return fwd_out_bf16(xt, rt, a, ctx, transposed);
    case ENGINE_DTYPE_FLOAT8_E4M3:
    case ENGINE_DTYPE_FLOAT8_E5M2: return fwd_out_fp8(xt, rt, a, ctx, transposed);
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm forward: unsupported out dtype %d",
                   (int)out_dtype);
}

engine_status bwd_dispatch(engine_dtype xt, engine_dtype dyt, BwdArgs& a, const LaunchCtx& ctx,
                           int64_t max_ctas, int* num_ctas) {
  switch (xt) {
    case ENGINE_DTYPE_FLOAT32: return bwd_x_f32(dyt, a, ctx, max_ctas, num_ctas);
    case ENGINE_DTYPE_FLOAT16: return bwd_x_f16(dyt, a, ctx, max_ctas, num_ctas);
    case ENGINE_DTYPE_BFLOAT16: return bwd_x_bf16(dyt, a, ctx, max_ctas, num_ctas);
    default: break;
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT, "norm backward: unsupported x dtype %s",
                   dtype_name(xt));
}

/* Outputs must not overlap (row stride >= cols); inputs may use any row stride >= 0 (0: every row
 * reads the same data, as for an expanded gradient). */
engine_status check_stride(const char* fn, const char* name, int64_t stride, int64_t rows,
                           int64_t cols, bool output) {
  ENGINE_CHECK_ARG(stride >= 0, "%s: %s row stride %lld is negative", fn, name, (long long)stride);
  ENGINE_CHECK_ARG(!output || rows <= 1 || stride >= cols,
                   "%s: output %s row stride %lld is smaller than cols %lld", fn, name,
                   (long long)stride, (long long)cols);
  return ENGINE_SUCCESS;
}

/* The reduction's CTA: 16 warps, warp ty summing the partial rows ty, ty + 16, ... of its columns
 * in order (a row slice), the slices then combined in slice order by warp 0. */
constexpr int kReduceSlices = 16;
constexpr int kReduceThreads = kReduceSlices * 32;
/* Resident 512-thread CTAs per SM that the strided grid asks for (2048 threads per SM). */
constexpr int kReduceCtasPerSm = 4;

/* dweight[c] (blockIdx.y == 0) or dbias[c] (blockIdx.y == 1) = sum over p < P of ws[p][c]. A
 * column block is 32 * VEC columns: lane tx owns columns tx * VEC .. tx * VEC + VEC - 1 of it, one
 * VEC-float load per partial row (VEC = 4: 16-byte loads; the workspace is 16-byte aligned and
 * its pitch a multiple of 4 floats, so the vector of the last columns stays inside the row, and
 * its lanes past cols are never stored). Every column is summed in the same order for either VEC
 * (slice k: rows k, k + 16, ... in order; the 16 slices added in slice order), a fixed order for
 * given (P, cols): bitwise reproducible, and VEC does not change a bit. The CTAs stride over the
 * column blocks (gridDim.x of them at a time). */
template <int VEC>
__global__ void __launch_bounds__(kReduceThreads)
    norm_bwd_reduce_kernel(const float* ws_dw, const float* ws_db, int P, int cols, int pitch,
                           void* dweight, void* dbias, engine_dtype w_dtype) {
  using V = typename std::conditional<VEC == 4, float4, float>::type;
  __shared__ float sm[kReduceSlices][32 * VEC]; /* [slice][j * 32 + lane]: no bank conflicts */
  const int tx = threadIdx.x & 31;
  const int ty = threadIdx.x >> 5;
  const float* ws = blockIdx.y == 0 ? ws_dw : ws_db;
  void* out = blockIdx.y == 0 ? dweight : dbias;
  const int64_t blocks = ((int64_t)cols + 32 * VEC - 1) / (32 * VEC);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t c0 = b * 32 * VEC + (int64_t)tx * VEC;
    float acc[VEC];
#pragma unroll
    for (int j = 0; j < VEC; ++j) acc[j] = 0.0f;
    if (c0 < cols) {
#pragma unroll 4
      for (int p = ty; p < P; p += kReduceSlices) {
        const V v = *reinterpret_cast<const V*>(ws + (int64_t)p * pitch + c0);
        const float* f = reinterpret_cast<const float*>(&v);
#pragma unroll
        for (int j = 0; j < VEC; ++j) acc[j] += f[j];
      }
    }
#pragma unroll
    for (int j = 0; j < VEC; ++j) sm[ty][j * 32 + tx] = acc[j];
    __syncthreads();
    if (ty == 0) {
#pragma unroll
      for (int j = 0; j < VEC; ++j) {
        const int64_t c = c0 + j;
        if (c < cols) {
          float t[1] = {sm[0][j * 32 + tx]};
#pragma unroll
          for (int k = 1; k < kReduceSlices; ++k) t[0] += sm[k][j * 32 + tx];
          store_vec_dt<1>(out, c, w_dtype, t);
        }
      }
    }
    __syncthreads(); /* sm is rewritten by the next column block */
  }
}

/* The reduction of at most kReduceSlices partial rows (NOTES P172): a thread owns 4 columns (one
 * 16-byte load per partial row, all P loads independent) and adds rows 0 .. P-1 in order from
 * 0.0f, no shared memory, no barrier; 128-thread CTAs stride over blocks of 512 columns (CTAs of
 * 256 left one set of 64K columns at 64 CTAs on 132 SMs: RMSNorm 64K's reduction 2.9 -> 4.0 us
 * in P172's first form; since P172c RMSNorm 64K keeps the sliced kernel: launch_bwd_reduce). For
 * P <= kReduceSlices this is norm_bwd_reduce_kernel's order (each of
 * its slices holds one row or none, added in slice order, and an empty slice adds +0.0 to a sum
 * that cannot be -0.0 after 0.0f + row 0): the same bits. */
constexpr int kReduceFlatThreads = 128;
__global__ void __launch_bounds__(kReduceFlatThreads)
    norm_bwd_reduce_flat_kernel(const float* ws_dw, const float* ws_db, int P, int cols, int pitch,
                                void* dweight, void* dbias, engine_dtype w_dtype) {
  const float* ws = blockIdx.y == 0 ? ws_dw : ws_db;
  void* out = blockIdx.y == 0 ? dweight : dbias;
  const int64_t blocks = ((int64_t)cols + kReduceFlatThreads * 4 - 1) / (kReduceFlatThreads * 4);
  for (int64_t b = blockIdx.x; b < blocks; b += gridDim.x) {
    const int64_t c0 = (b * kReduceFlatThreads + threadIdx.x) * 4;
    if (c0 >= cols) continue;
    float acc[4] = {0.0f, 0.0f, 0.0f, 0.0f};
#pragma unroll 8
    for (int p = 0; p < P; ++p) {
      const float4 v = *reinterpret_cast<const float4*>(ws + (int64_t)p * pitch + c0);
      acc[0] += v.x;
      acc[1] += v.y;
      acc[2] += v.z;
      acc[3] += v.w;
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      if (c0 + j < cols) {
        const float t[1] = {acc[j]};
        store_vec_dt<1>(out, c0 + j, w_dtype, t);
      }
    }
  }
}

/* Launch the reduction of `sets` (1: dweight, 2: and dbias) partial sets of P rows: by default
 * the flat kernel where P <= kReduceSlices (the split / streamed backward's few partial rows)
 * and the sliced kernel's 128-column blocks outnumber its grid (each of its CTAs would walk
 * several blocks in turn), else norm_bwd_reduce_kernel at VEC (the knob, or 4 where the
 * 128-column blocks of all sets cover the SMs left by sm_margin, else 1). At 128K columns the
 * streamed backward leaves P = 8 partial rows (one per cluster), which one 32-column CTA per
 * column block (8192 of them for LayerNorm) summed in 14.3 us of a 208 us fwd + bwd on the H200;
 * 5.5 us sliced at VEC 4 (NOTES P171), 3.2-3.4 us flat (P172). Where one round of sliced CTAs
 * covers the columns, the flat kernel's 128-thread CTAs (one per SM) lose: RMSNorm 64K 2.7-3.0
 * -> 3.6-4.0 us (NOTES P172c). The grid is at most kReduceCtasPerSm sliced CTAs (or 2048
 * threads of flat ones) per SM of SMs - sm_margin per set. */
engine_status launch_bwd_reduce(const float* ws_dw, const float* ws_db, int P, int64_t cols,
                                int64_t pitch, void* dweight, void* dbias, engine_dtype w_dtype,
                                int sets, int sm_count, int sm_margin, cudaStream_t stream) {
  const int64_t sms = std::max<int64_t>(1, (int64_t)sm_count - std::max(0, sm_margin));
  const int64_t cap = std::max<int64_t>(1, sms * kReduceCtasPerSm / sets);
  int vec = norm_bwd_reduce_vec();
  if (vec == 0 && P <= kReduceSlices && ceil_div(cols, (int64_t)128) > cap) {
    const int64_t flat_cap = std::max<int64_t>(1, sms * (2048 / kReduceFlatThreads) / sets);
    const int64_t flat_blocks = ceil_div(cols, (int64_t)(kReduceFlatThreads * 4));
    const dim3 grid((unsigned)std::min(flat_blocks, flat_cap), (unsigned)sets);
    norm_bwd_reduce_flat_kernel<<<grid, kReduceFlatThreads, 0, stream>>>(
        ws_dw, ws_db, P, (int)cols, (int)pitch, dweight, dbias, w_dtype);
    ENGINE_CHECK_LAUNCH("norm_bwd_reduce_flat_kernel");
    return ENGINE_SUCCESS;
  }
  if (vec == 0) vec = ceil_div(cols, (int64_t)128) * sets >= sms ? 4 : 1;
  const int64_t blocks = ceil_div(cols, (int64_t)(32 * vec));
  const dim3 grid((unsigned)std::min(blocks, cap), (unsigned)sets);
  if (vec == 4) {
    norm_bwd_reduce_kernel<4><<<grid, kReduceThreads, 0, stream>>>(ws_dw, ws_db, P, (int)cols,
                                                                   (int)pitch, dweight, dbias, w_dtype);
  } else {
    norm_bwd_reduce_kernel<1><<<grid, kReduceThreads, 0, stream>>>(ws_dw, ws_db, P, (int)cols,
                                                                   (int)pitch, dweight, dbias, w_dtype);
  }
  ENGINE_CHECK_LAUNCH("norm_bwd_reduce_kernel");
  return ENGINE_SUCCESS;
}

}  // namespace
}  // namespace norm
}  // namespace engine

using namespace engine;
using namespace engine::norm;

extern "C" engine_status engine_norm_fwd(const engine_norm_fwd_params* p, int sm_count,
                                         int sm_margin, cudaStream_t stream) {
  clear_error();
  static const char* fn = "engine_norm_fwd";
  ENGINE_CHECK_ARG(p != nullptr, "%s: params is NULL", fn);
  const int64_t rows = p->rows, cols = p->cols;
  ENGINE_CHECK_ARG(rows >= 0, "%s: rows must be >= 0, got %lld", fn, (long long)rows);
  ENGINE_CHECK_ARG(cols >= 1 && cols <= kMaxCols, "%s: cols must be in [1, 2^30], got %lld", fn,
                   (long long)cols);
  ENGINE_CHECK_ARG(sm_count >= 1, "%s: sm_count must be >= 1, got %d", fn, sm_count);
  ENGINE_CHECK_ARG(sm_margin >= 0, "%s: sm_margin must be >= 0, got %d", fn, sm_margin);
  ENGINE_CHECK_ARG(is_high_precision(p->x_dtype),
                   "%s: x must be float32, float16 or bfloat16, got %s", fn, dtype_name(p->x_dtype));
  ENGINE_CHECK_ARG(p->weight_dtype == p->x_dtype || p->weight_dtype == ENGINE_DTYPE_FLOAT32,
                   "%s: weight / bias dtype must be x's (%s) or float32, got %s", fn,
                   dtype_name(p->x_dtype), dtype_name(p->weight_dtype));
  ENGINE_CHECK_ARG(is_high_precision(p->out_dtype) || is_fp8_dtype(p->out_dtype),
                   "%s: unsupported out dtype %d", fn, (int)p->out_dtype);
  ENGINE_CHECK_ARG(p->weight != nullptr, "%s: weight is NULL", fn);
  const bool has_res = p->residual != nullptr;
  if (has_res) {
    ENGINE_CHECK_ARG(p->residual_dtype == p->x_dtype || p->residual_dtype == ENGINE_DTYPE_FLOAT32,
                     "%s: residual dtype must be x's (%s) or float32, got %s", fn,
                     dtype_name(p->x_dtype), dtype_name(p->residual_dtype));
  }
  ENGINE_CHECK_ARG(p->is_rms_norm || rows == 0 || p->mu != nullptr,
                   "%s: LayerNorm needs mu (got NULL)", fn);
  if (rows > 0) {
    ENGINE_CHECK_ARG(p->x != nullptr, "%s: x is NULL", fn);
    ENGINE_CHECK_ARG(p->out != nullptr, "%s: out is NULL", fn);
    ENGINE_CHECK_ARG(p->rsigma != nullptr, "%s: rsigma is NULL", fn);
    ENGINE_CHECK_ARG(!has_res || p->residual_out != nullptr,
                     "%s: residual_out is required when residual is given", fn);
  }
  ENGINE_TRY(check_stride(fn, "x", p->x_row_stride, rows, cols, false));
  ENGINE_TRY(check_stride(fn, "out", p->out_row_stride, rows, cols, true));
  if (has_res) {
    ENGINE_TRY(check_stride(fn, "residual", p->residual_row_stride, rows, cols, false));
    ENGINE_TRY(check_stride(fn, "residual_out", p->residual_out_row_stride, rows, cols, true));
  }
  const bool fp8 = is_fp8_dtype(p->out_dtype);
  if (fp8) {
    ENGINE_CHECK_ARG(p->scale != nullptr && p->amax != nullptr && p->scale_inv != nullptr,
                     "%s: FP8 output needs scale, amax and scale_inv", fn);
  } else {
    ENGINE_CHECK_ARG(p->out_t == nullptr, "%s: out_t is only supported for FP8 outputs", fn);
  }
  ENGINE_CHECK_ARG(p->out_t_auto >= 0 && p->out_t_auto <= 2, "%s: out_t_auto must be 0, 1 or 2, got %d",
                   fn, p->out_t_auto);

  DeviceInfo info;
  ENGINE_TRY(current_device_info(&info));
  const LaunchCtx ctx{sm_count, sm_margin, info.max_smem_per_block_optin, info.smem_per_sm,
                      max_cluster_size(info), stream, norm_fwd_vectors(), 0,
                      norm_fwd_general_loop(), 0, norm_fwd_blocked_from(),
                      norm_fwd_grid_per_sm(), 0, 0, norm_fwd_stream_from(),
                      norm_fwd_stream_threads(), norm_fwd_band(), lean_dram(info) ? 1 : 0,
                      norm_fwd_lean(), norm_fwd_blocked_shape(), norm_fwd_fp8_lean()};

  FwdArgs a{};
  a.rows = rows;
  a.cols = (int)cols;
  a.x = p->x;
  a.x_stride = p->x_row_stride;
  a.residual = p->residual;
  a.res_stride = p->residual_row_stride;
  a.residual_out = has_res ? p->residual_out : nullptr;
  a.res_out_stride = p->residual_out_row_stride;
  a.weight = p->weight;
  a.bias = p->bias;
  a.w_dtype = p->weight_dtype;
  a.out = p->out;
  a.out_stride = p->out_row_stride;
  a.mu = p->is_rms_norm ? nullptr : p->mu;
  a.rsigma = p->rsigma;
  a.scale = p->scale;
  a.amax = p->amax;
  a.scale_inv = p->scale_inv;
  /* out_t_auto 2, and any request where the copy's runs are 2-, 4- or 8-byte aligned (rows % 16 !=
   * 0, even; narrow_runs): no kernel writes the copy; the tiled transpose below does. The in-kernel
   * copies (the band kernel, the register path's tile) would store such runs byte by byte, the
   * tiled transpose stores them in pieces of the runs' width (NOTES P134-P137). */
  const bool t_after = p->out_t_auto == 2 || narrow_runs(p->out_t, rows);
  a.out_t = t_after ? nullptr : static_cast<uint8_t*>(p->out_t);
  a.t_auto = p->out_t_auto == 1 ? 1 : 0;
  a.t_wanted = p->out_t != nullptr ? 1 : 0;
  a.eps = p->eps;
  a.inv_n = 1.0f / (float)cols;
  a.amax_eps = p->amax_epsilon;
  a.fp8_max = fp8_max_of(p->out_dtype);
  a.is_rms = p->is_rms_norm ? 1 : 0;
  a.zero_centered = p->zero_centered_gamma ? 1 : 0;
  a.e5m2 = p->out_dtype == ENGINE_DTYPE_FLOAT8_E5M2 ? 1 : 0;
  const engine_dtype rt = has_res ? p->residual_dtype : p->x_dtype;

  bool transposed = false;
  if (!fp8) {
    if (rows == 0) return ENGINE_SUCCESS;
    a.mode = kFull;
    return fwd_dispatch(p->out_dtype, p->x_dtype, rt, a, ctx, &transposed);
  }
  if (!p->current_scaling) {
    a.mode = kFull;
    ENGINE_TRY(fwd_dispatch(p->out_dtype, p->x_dtype, rt, a, ctx, &transposed));
  } else {
    ENGINE_CHECK_CUDA(cudaMemsetAsync(p->amax, 0, sizeof(float), stream));
    FwdArgs s = a;
    s.mode = kStats;
    s.out_t = nullptr;
    ENGINE_TRY(fwd_dispatch(p->out_dtype, p->x_dtype, rt, s, ctx, &transposed));
    a.mode = kApply;
    if (has_res) {
      a.x = p->residual_out;
      a.x_stride = p->residual_out_row_stride;
    }
    a.residual = nullptr;
    a.residual_out = nullptr;
    ENGINE_TRY(fwd_dispatch(p->out_dtype, rt, rt, a, ctx, &transposed));
  }
  if (p->out_t != nullptr && !transposed && rows > 0) {
    ENGINE_TRY(engine_fp8_transpose_margin(p->out, rows, cols, p->out_row_stride, p->out_t,
                                           sm_margin, stream));
  }
  return ENGINE_SUCCESS;
}

extern "C" size_t engine_norm_bwd_workspace_bytes(int64_t rows, int64_t cols, int has_dbias,
                                                  int sm_count, int sm_margin) {
  if (rows <= 0 || cols < 1) return 0;
  const int64_t p = bwd_max_ctas(rows, sm_count < 1 ? 1 : sm_count, sm_margin);
  return (size_t)p * (size_t)bwd_ws_pitch(cols) * sizeof(float) * (has_dbias ? 2u : 1u);
}

extern "C" engine_status engine_norm_bwd(const engine_norm_bwd_params* p, int sm_count,
                                         int sm_margin, void* workspace, size_t workspace_bytes,
                                         cudaStream_t stream) {
  clear_error();
  static const char* fn = "engine_norm_bwd";
  ENGINE_CHECK_ARG(p != nullptr, "%s: params is NULL", fn);
  const int64_t rows = p->rows, cols = p->cols;
  ENGINE_CHECK_ARG(rows >= 0, "%s: rows must be >= 0, got %lld", fn, (long long)rows);
  ENGINE_CHECK_ARG(cols >= 1 && cols <= kMaxCols, "%s: cols must be in [1, 2^30], got %lld", fn,
                   (long long)cols);
  ENGINE_CHECK_ARG(sm_count >= 1, "%s: sm_count must be >= 1, got %d", fn, sm_count);
  ENGINE_CHECK_ARG(sm_margin >= 0, "%s: sm_margin must be >= 0, got %d", fn, sm_margin);
  ENGINE_CHECK_ARG(is_high_precision(p->dy_dtype), "%s: dy must be float32, float16 or bfloat16, got %s",
                   fn, dtype_name(p->dy_dtype));
  ENGINE_CHECK_ARG(is_high_precision(p->x_dtype), "%s: x must be float32, float16 or bfloat16, got %s",
                   fn, dtype_name(p->x_dtype));
  ENGINE_CHECK_ARG(is_high_precision(p->dx_dtype), "%s: dx must be float32, float16 or bfloat16, got %s",
                   fn, dtype_name(p->dx_dtype));
  ENGINE_CHECK_ARG(is_high_precision(p->weight_dtype),
                   "%s: weight must be float32, float16 or bfloat16, got %s", fn,
                   dtype_name(p->weight_dtype));
  const bool any_dres = p->dres != nullptr || p->dresidual != nullptr;
  ENGINE_CHECK_ARG(!any_dres || is_high_precision(p->dres_dtype),
                   "%s: dresidual / dres must be float32, float16 or bfloat16, got %s", fn,
                   dtype_name(p->dres_dtype));
  ENGINE_CHECK_ARG(p->weight != nullptr && p->dweight != nullptr, "%s: weight and dweight are required",
                   fn);
  ENGINE_CHECK_ARG(p->is_rms_norm || rows == 0 || p->mu != nullptr,
                   "%s: LayerNorm needs mu (got NULL)", fn);
  if (rows > 0) {
    ENGINE_CHECK_ARG(p->dy != nullptr && p->x != nullptr && p->rsigma != nullptr && p->dx != nullptr,
                     "%s: dy, x, rsigma and dx are required", fn);
  }
  ENGINE_TRY(check_stride(fn, "dy", p->dy_row_stride, rows, cols, false));
  ENGINE_TRY(check_stride(fn, "x", p->x_row_stride, rows, cols, false));
  ENGINE_TRY(check_stride(fn, "dx", p->dx_row_stride, rows, cols, true));
  if (p->dresidual) ENGINE_TRY(check_stride(fn, "dresidual", p->dresidual_row_stride, rows, cols, false));
  if (p->dres) ENGINE_TRY(check_stride(fn, "dres", p->dres_row_stride, rows, cols, true));

  const bool has_db = p->dbias != nullptr;
  const size_t need = engine_norm_bwd_workspace_bytes(rows, cols, has_db ? 1 : 0, sm_count, sm_margin);
  ENGINE_CHECK_ARG(workspace_bytes >= need,
                   "%s: workspace of %zu bytes is too small, engine_norm_bwd_workspace_bytes says %zu",
                   fn, workspace_bytes, need);
  ENGINE_CHECK_ARG(need == 0 || (workspace != nullptr && ptr_aligned(workspace, 16)),
                   "%s: workspace must be a 16-byte aligned device pointer", fn);

  const int64_t max_ctas = bwd_max_ctas(rows, sm_count, sm_margin);
  const int64_t pitch = bwd_ws_pitch(cols);
  BwdArgs a{};
  a.rows = rows;
  a.cols = (int)cols;
  a.dy = p->dy;
  a.dy_stride = p->dy_row_stride;
  a.x = p->x;
  a.x_stride = p->x_row_stride;
  a.mu = p->is_rms_norm ? nullptr : p->mu;
  a.rsigma = p->rsigma;
  a.weight = p->weight;
  a.w_dtype = p->weight_dtype;
  a.dresidual = p->dresidual;
  a.dresidual_stride = p->dresidual_row_stride;
  a.dx = p->dx;
  a.dx_dtype = p->dx_dtype;
  a.dx_stride = p->dx_row_stride;
  a.dres = p->dres;
  a.dres_dtype = p->dres_dtype;
  a.dres_stride = p->dres_row_stride;
  a.ws_dw = static_cast<float*>(workspace);
  a.ws_db = (has_db && need > 0) ? static_cast<float*>(workspace) + max_ctas * pitch : nullptr;
  a.ws_pitch = (int)pitch;
  a.inv_n = 1.0f / (float)cols;
  a.is_rms = p->is_rms_norm ? 1 : 0;
  a.zero_centered = p->zero_centered_gamma ? 1 : 0;

  DeviceInfo info;
  ENGINE_TRY(current_device_info(&info));
  const LaunchCtx ctx{sm_count, sm_margin, info.max_smem_per_block_optin, info.smem_per_sm,
                      max_cluster_size(info), stream, 0, norm_bwd_elems(), 0,
                      norm_bwd_cta_threads(), 0, 0, norm_bwd_stream_from(),
                      norm_bwd_stream_threads(), 0, lean_dram(info) ? 1 : 0};
  int num_ctas = 0;
  if (rows > 0) ENGINE_TRY(bwd_dispatch(p->x_dtype, p->dy_dtype, a, ctx, max_ctas, &num_ctas));

  return launch_bwd_reduce(a.ws_dw, a.ws_db, num_ctas, cols, pitch, p->dweight, p->dbias,
                           p->weight_dtype, has_db ? 2 : 1, sm_count, sm_margin, stream);
}
