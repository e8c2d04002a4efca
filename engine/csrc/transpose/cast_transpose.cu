/*
 * engine_cast_transpose (FP8 cast with fused amax, rowwise and / or transposed output) and
 * engine_fp8_transpose (bitwise tiled byte transpose), see engine/transpose.h.
 *
 * Both work on 64 x 128 tiles (rows x cols) with 256-thread CTAs in a persistent loop over tiles
 * (in groups of 8 tile rows, column by column within a group: tile_at):
 *   - loads: each thread loads (64 * 128 / VEC) / 256 vectors of 16 bytes (VEC = 16 / sizeof(x));
 *     a warp covers whole 128-element tile rows, coalesced; VEC = 1 is the fallback for unaligned
 *     pointers / strides or cols % VEC != 0;
 *   - rowwise FP8 goes straight to global memory (VEC bytes per thread, coalesced);
 *   - the FP8 tile is staged in shared memory (row pitch 144 bytes) and written transposed with
 *     16-byte stores (common/tile.cuh): a 64-byte contiguous run per output row and tile;
 *   - amax: per-thread NaN-propagating max of |x| (amax_update), one atomicMax per CTA.
 * Scaling modes as in the norms: delayed (kFull: read scale, max-update amax), current scaling
 * (cudaMemsetAsync(amax); kStats: amax only; kApply: scale from amax, written by CTA 0 with
 * scale_inv, then cast). scale_inv = 1 / scale is written by exactly one thread.
 */
#include "common/common.cuh"
#include "common/dtype.cuh"
#include "common/reduce.cuh"
#include "common/tile.cuh"
#include "common/vec.cuh"
#include "engine/transpose.h"

namespace engine {
namespace transpose {
namespace {

constexpr int kTileR = 64;
/* Tile rows of the kNarrow kernels (copies whose runs are 2-, 4- or 8-byte aligned): twice
 * kTileR, so that each tile writes 128 contiguous bytes of an output row, of which only the first
 * and last sectors are shared with the neighbouring tiles, where 64 bytes shared two of three
 * (NOTES P138). */
constexpr int kTileRNarrow = 2 * kTileR;
template <bool kNarrow>
constexpr int tile_rows() { return kNarrow ? kTileRNarrow : kTileR; }
constexpr int kTileC = 128;
constexpr int kPitch = kTileC + 16;
constexpr int kThreads = 256;

enum CastMode : int { kFull = 0, kStats = 1, kApply = 2 };

/* Tile t's (row, column) tile indices, in groups of kTileGroup tile rows walked column by column:
 * the CTAs of one wave then cover a few tile rows over many columns, so that the transposed copy
 * of a short matrix (rows of 128K: 8 tile rows) is written as whole output rows by neighbouring
 * CTAs, where row-major tile order spread each wave's 64-byte runs over 34 K output rows
 * (NOTES P81). */
constexpr int kTileGroup = 8;
__device__ __forceinline__ void tile_at(int64_t t, int64_t tiles_r, int64_t tiles_c, int64_t& tr,
                                        int64_t& tc) {
  const int64_t g = t / (kTileGroup * tiles_c);
  const int64_t r0 = g * kTileGroup;
  const int64_t gr = min((int64_t)kTileGroup, tiles_r - r0);
  const int64_t local = t - r0 * tiles_c;
  tc = local / gr;
  tr = r0 + (local - tc * gr);
}

struct CastArgs {
  int64_t rows;
  int64_t cols;
  const void* x;
  int64_t x_stride;
  uint8_t* out; /* NULL: no rowwise output */
  int64_t out_stride;
  uint8_t* out_t; /* NULL: no transposed output */
  float* scale;
  float* amax;
  float* scale_inv;
  float amax_eps;
  float fp8_max;
  int e5m2;
  int mode;
  int t_vec16;
};

template <typename X, int VEC, bool kNarrow>
__global__ void __launch_bounds__(kThreads) cast_transpose_kernel(const CastArgs a) {
  constexpr int TR = tile_rows<kNarrow>();
  constexpr int VPR = kTileC / VEC;              /* vectors per tile row */
  constexpr int NL = TR * VPR / kThreads;        /* vectors per thread per tile */
  static_assert(TR * VPR % kThreads == 0, "tile must split evenly over the CTA");
  __shared__ __align__(16) uint8_t tile[TR * kPitch];
  __shared__ int amax_buf[32];

  const int mode = a.mode;
  float scale = 1.0f;
  if (mode == kApply) {
    scale = compute_scale(*a.amax, a.fp8_max, a.amax_eps);
  } else if (mode == kFull) {
    scale = *a.scale;
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    if (mode == kApply) {
      *a.scale = scale;
      *a.scale_inv = 1.0f / scale;
    } else if (mode == kFull) {
      *a.scale_inv = 1.0f / scale;
    }
  }
  const bool e5m2 = a.e5m2 != 0;
  const bool has_out = a.out != nullptr && mode != kStats;
  const bool has_t = a.out_t != nullptr && mode != kStats;
  float amax = 0.0f;

  const int64_t tiles_c = (a.cols + kTileC - 1) / kTileC;
  const int64_t tiles_r = (a.rows + TR - 1) / TR;
  const int64_t ntiles = tiles_r * tiles_c;
  for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    int64_t tr, tc;
    tile_at(t, tiles_r, tiles_c, tr, tc);
    const int64_t r0 = tr * TR;
    const int64_t c0 = tc * kTileC;
    /* Batches of LB vectors: all of a batch's loads are in flight before the first use (at most
     * kTileR's count per batch, so that the narrow tile's batches hold the same registers). */
    constexpr int LB0 = kTileR * VPR / kThreads;
    constexpr int LB = LB0 < 8 ? LB0 : 8;
#pragma unroll 1
    for (int l0 = 0; l0 < NL; l0 += LB) {
      float v[LB][VEC];
      bool ok[LB];
#pragma unroll
      for (int l = 0; l < LB; ++l) {
        const int idx = threadIdx.x + (l0 + l) * kThreads;
        const int r = idx / VPR;
        const int cv = idx - r * VPR;
        const int64_t row = r0 + r;
        const int64_t col = c0 + cv * VEC;
        ok[l] = row < a.rows && col < a.cols; /* VEC divides cols on the vector path */
        if (ok[l]) {
          load_vec<X, VEC>(static_cast<const X*>(a.x) + row * a.x_stride + col, v[l]);
        } else {
#pragma unroll
          for (int j = 0; j < VEC; ++j) v[l][j] = 0.0f;
        }
      }
#pragma unroll
      for (int l = 0; l < LB; ++l) {
        if (mode != kApply) {
#pragma unroll
          for (int j = 0; j < VEC; ++j) amax = amax_update(amax, v[l][j]); /* masked: 0 */
        }
        if (ok[l] && (has_out || has_t)) {
          const int idx = threadIdx.x + (l0 + l) * kThreads;
          const int r = idx / VPR;
          const int cv = idx - r * VPR;
          if constexpr (VEC % 4 == 0) {
            float y[VEC];
#pragma unroll
            for (int j = 0; j < VEC; ++j) y[j] = v[l][j] * scale;
            uint32_t w[VEC / 4];
            pack_fp8<VEC>(y, e5m2, w);
            if (has_out) store_words<VEC>(a.out + (r0 + r) * a.out_stride + c0 + cv * VEC, w);
            if (has_t) store_words<VEC>(tile + r * kPitch + cv * VEC, w);
          } else {
            const uint8_t q = fp8_from_float(v[l][0] * scale, e5m2);
            if (has_out) a.out[(r0 + r) * a.out_stride + c0 + cv] = q;
            if (has_t) tile[r * kPitch + cv] = q;
          }
        }
      }
    }
    if (has_t) { /* uniform */
      __syncthreads();
      const int64_t rl = a.rows - r0, cl = a.cols - c0;
      store_tile_transposed<false, kNarrow>(tile, kPitch, rl < TR ? (int)rl : TR,
                                            cl < kTileC ? (int)cl : kTileC, a.out_t, a.rows, r0, c0,
                                            a.t_vec16 != 0, threadIdx.x, kThreads);
      __syncthreads();
    }
  }
  if (mode != kApply) block_amax_atomic(amax, a.amax, amax_buf);
}

/* Bitwise transpose of 1-byte elements, VEC = 16 (16-byte loads) or 1. kRev: the tiles from the
 * last to the first (tile_at's order reversed: the last rows first) and the transposed copy's
 * stores streaming (fp8_transpose_order, NOTES P114). kNarrow: the copy's rows (M bytes) are not
 * 16-byte runs but 2-, 4- or 8-byte aligned ones (store_tile_transposed). */
template <int VEC, bool kRev, bool kNarrow>
__global__ void __launch_bounds__(kThreads)
    byte_transpose_kernel(const uint8_t* in, int64_t rows, int64_t cols, int64_t in_stride,
                          uint8_t* out_t, int t_vec16) {
  constexpr int TR = tile_rows<kNarrow>();
  constexpr int VPR = kTileC / VEC;
  constexpr int NL = TR * VPR / kThreads;
  __shared__ __align__(16) uint8_t tile[TR * kPitch];
  const int64_t tiles_c = (cols + kTileC - 1) / kTileC;
  const int64_t tiles_r = (rows + TR - 1) / TR;
  const int64_t ntiles = tiles_r * tiles_c;
  for (int64_t t = blockIdx.x; t < ntiles; t += gridDim.x) {
    int64_t tr, tc;
    tile_at(kRev ? ntiles - 1 - t : t, tiles_r, tiles_c, tr, tc);
    const int64_t r0 = tr * TR;
    const int64_t c0 = tc * kTileC;
    if constexpr (VEC == 16) {
      uint4 v[NL];
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        const int idx = threadIdx.x + l * kThreads;
        const int r = idx / VPR;
        const int cv = idx - r * VPR;
        if (r0 + r < rows && c0 + cv * 16 < cols) {
          v[l] = *reinterpret_cast<const uint4*>(in + (r0 + r) * in_stride + c0 + cv * 16);
        } else {
          v[l] = make_uint4(0, 0, 0, 0);
        }
      }
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        const int idx = threadIdx.x + l * kThreads;
        const int r = idx / VPR;
        const int cv = idx - r * VPR;
        *reinterpret_cast<uint4*>(tile + r * kPitch + cv * 16) = v[l];
      }
    } else {
      uint8_t v[NL];
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        const int idx = threadIdx.x + l * kThreads;
        const int r = idx / VPR;
        const int cv = idx - r * VPR;
        v[l] = (r0 + r < rows && c0 + cv < cols) ? in[(r0 + r) * in_stride + c0 + cv] : (uint8_t)0;
      }
#pragma unroll
      for (int l = 0; l < NL; ++l) {
        const int idx = threadIdx.x + l * kThreads;
        const int r = idx / VPR;
        const int cv = idx - r * VPR;
        tile[r * kPitch + cv] = v[l];
      }
    }
    __syncthreads();
    const int64_t rl = rows - r0, cl = cols - c0;
    store_tile_transposed<kRev, kNarrow>(tile, kPitch, rl < TR ? (int)rl : TR,
                                         cl < kTileC ? (int)cl : kTileC, out_t, rows, r0, c0,
                                         t_vec16 != 0, threadIdx.x, kThreads);
    __syncthreads();
  }
}

/* fp8_transpose_order's choice: the last rows first (kRev) only where the knob says 2. By default
 * the first rows first: on the H100 the reverse order moved the CUDA + T rows by -1.5 to +2 points
 * (kernel time, two alternations; RMSNorm 64K 67.7 -> 69.7, 128K 70.6 -> 69.4; NOTES P114), no
 * consistent gain. Triton's twin defaults to the reverse order (+0.5 to +2 on its rows). */
inline bool byte_transpose_reverse() { return fp8_transpose_order() == 2; }

template <typename X>
engine_status launch_cast(const CastArgs& a, int sm_count, cudaStream_t stream) {
  constexpr int VEC = 16 / sizeof(X);
  const bool vec = (a.cols % VEC == 0) && vec_ok(a.x, a.x_stride, a.rows, sizeof(X), VEC) &&
                   vec_ok(a.out, a.out_stride, a.rows, 1, VEC);
  using Kernel = void (*)(const CastArgs);
  const bool narrow = narrow_runs(a.out_t, a.rows);
  const int64_t ntiles = ceil_div(a.rows, narrow ? kTileRNarrow : kTileR) * ceil_div(a.cols, kTileC);
  const Kernel kernel =
      vec ? (narrow ? &cast_transpose_kernel<X, VEC, true> : &cast_transpose_kernel<X, VEC, false>)
          : (narrow ? &cast_transpose_kernel<X, 1, true> : &cast_transpose_kernel<X, 1, false>);
  int per_sm = 1;
  ENGINE_TRY(blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0, &per_sm));
  const unsigned grid = (unsigned)persistent_grid(ntiles, sm_count, 0, per_sm);
  kernel<<<grid, kThreads, 0, stream>>>(a);
  ENGINE_CHECK_LAUNCH("cast_transpose_kernel");
  return ENGINE_SUCCESS;
}

engine_status dispatch_cast(engine_dtype xt, const CastArgs& a, int sm_count, cudaStream_t stream) {
  switch (xt) {
    case ENGINE_DTYPE_FLOAT32: return launch_cast<float>(a, sm_count, stream);
    case ENGINE_DTYPE_FLOAT16: return launch_cast<__half>(a, sm_count, stream);
    case ENGINE_DTYPE_BFLOAT16: return launch_cast<__nv_bfloat16>(a, sm_count, stream);
    default: break;
  }
  return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                   "engine_cast_transpose: x must be float32, float16 or bfloat16, got %s",
                   dtype_name(xt));
}

}  // namespace
}  // namespace transpose
}  // namespace engine

using namespace engine;
using namespace engine::transpose;

extern "C" engine_status engine_cast_transpose(const engine_cast_transpose_params* p, int sm_count,
                                               cudaStream_t stream) {
  clear_error();
  static const char* fn = "engine_cast_transpose";
  ENGINE_CHECK_ARG(p != nullptr, "%s: params is NULL", fn);
  const int64_t rows = p->rows, cols = p->cols;
  ENGINE_CHECK_ARG(rows >= 0, "%s: rows must be >= 0, got %lld", fn, (long long)rows);
  ENGINE_CHECK_ARG(cols >= 1, "%s: cols must be >= 1, got %lld", fn, (long long)cols);
  ENGINE_CHECK_ARG(sm_count >= 1, "%s: sm_count must be >= 1, got %d", fn, sm_count);
  ENGINE_CHECK_ARG(is_high_precision(p->x_dtype), "%s: x must be float32, float16 or bfloat16, got %s",
                   fn, dtype_name(p->x_dtype));
  ENGINE_CHECK_ARG(is_fp8_dtype(p->out_dtype), "%s: out_dtype must be e4m3 or e5m2, got %d", fn,
                   (int)p->out_dtype);
  ENGINE_CHECK_ARG(p->out != nullptr || p->out_t != nullptr, "%s: out and out_t are both NULL", fn);
  ENGINE_CHECK_ARG(p->scale != nullptr && p->amax != nullptr && p->scale_inv != nullptr,
                   "%s: scale, amax and scale_inv are required", fn);
  ENGINE_CHECK_ARG(rows == 0 || p->x != nullptr, "%s: x is NULL", fn);
  ENGINE_CHECK_ARG(p->x_row_stride >= 0, "%s: x row stride %lld is negative", fn,
                   (long long)p->x_row_stride); /* an input may repeat rows (stride 0) */
  ENGINE_CHECK_ARG(rows <= 1 || p->out == nullptr || p->out_row_stride >= cols,
                   "%s: out row stride %lld < cols %lld", fn, (long long)p->out_row_stride,
                   (long long)cols);

  CastArgs a{};
  a.rows = rows;
  a.cols = cols;
  a.x = p->x;
  a.x_stride = p->x_row_stride;
  a.out = static_cast<uint8_t*>(p->out);
  a.out_stride = p->out_row_stride;
  a.out_t = static_cast<uint8_t*>(p->out_t);
  a.scale = p->scale;
  a.amax = p->amax;
  a.scale_inv = p->scale_inv;
  a.amax_eps = p->amax_epsilon;
  a.fp8_max = fp8_max_of(p->out_dtype);
  a.e5m2 = p->out_dtype == ENGINE_DTYPE_FLOAT8_E5M2 ? 1 : 0;
  a.t_vec16 = (p->out_t != nullptr && ptr_aligned(p->out_t, 16) && rows % 16 == 0) ? 1 : 0;

  if (p->current_scaling) {
    ENGINE_CHECK_CUDA(cudaMemsetAsync(p->amax, 0, sizeof(float), stream));
    CastArgs s = a;
    s.mode = kStats;
    ENGINE_TRY(dispatch_cast(p->x_dtype, s, sm_count, stream));
    a.mode = kApply;
  } else {
    a.mode = kFull;
  }
  return dispatch_cast(p->x_dtype, a, sm_count, stream);
}

extern "C" engine_status engine_fp8_transpose(const void* in, int64_t rows, int64_t cols,
                                              int64_t in_row_stride, void* out_t,
                                              cudaStream_t stream) {
  return engine_fp8_transpose_margin(in, rows, cols, in_row_stride, out_t, 0, stream);
}

extern "C" engine_status engine_fp8_transpose_margin(const void* in, int64_t rows, int64_t cols,
                                                     int64_t in_row_stride, void* out_t,
                                                     int sm_margin, cudaStream_t stream) {
  clear_error();
  static const char* fn = "engine_fp8_transpose";
  ENGINE_CHECK_ARG(rows >= 0 && cols >= 0, "%s: rows and cols must be >= 0, got %lld x %lld", fn,
                   (long long)rows, (long long)cols);
  if (rows == 0 || cols == 0) return ENGINE_SUCCESS;
  ENGINE_CHECK_ARG(in != nullptr && out_t != nullptr, "%s: in and out_t are required", fn);
  ENGINE_CHECK_ARG(in_row_stride >= 0, "%s: row stride %lld is negative", fn,
                   (long long)in_row_stride);
  DeviceInfo info;
  ENGINE_TRY(current_device_info(&info));
  const bool vec = (cols % 16 == 0) && vec_ok(in, in_row_stride, rows, 1, 16);
  const int t_vec16 = (ptr_aligned(out_t, 16) && rows % 16 == 0) ? 1 : 0;
  const bool narrow = narrow_runs(out_t, rows);
  const int64_t ntiles = ceil_div(rows, narrow ? kTileRNarrow : kTileR) * ceil_div(cols, kTileC);
  const bool rev = byte_transpose_reverse();
  using Kernel = void (*)(const uint8_t*, int64_t, int64_t, int64_t, uint8_t*, int);
  static const Kernel kernels[2][2][2] = {  /* [vec][rev][narrow] */
      {{&byte_transpose_kernel<1, false, false>, &byte_transpose_kernel<1, false, true>},
       {&byte_transpose_kernel<1, true, false>, &byte_transpose_kernel<1, true, true>}},
      {{&byte_transpose_kernel<16, false, false>, &byte_transpose_kernel<16, false, true>},
       {&byte_transpose_kernel<16, true, false>, &byte_transpose_kernel<16, true, true>}}};
  const Kernel kernel = kernels[vec][rev][narrow];
  int per_sm = 1;
  ENGINE_TRY(blocks_per_sm(reinterpret_cast<const void*>(kernel), kThreads, 0, &per_sm));
  const unsigned grid = (unsigned)persistent_grid(ntiles, info.sm_count, sm_margin, per_sm);
  const uint8_t* src = static_cast<const uint8_t*>(in);
  uint8_t* dst = static_cast<uint8_t*>(out_t);
  kernel<<<grid, kThreads, 0, stream>>>(src, rows, cols, in_row_stride, dst, t_vec16);
  ENGINE_CHECK_LAUNCH("byte_transpose_kernel");
  return ENGINE_SUCCESS;
}
