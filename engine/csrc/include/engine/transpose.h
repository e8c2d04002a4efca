/*
 * engine C API: FP8 cast with fused amax, and tiled transposes.
 *
 * engine_cast_transpose: x [rows, cols] (float32/float16/bfloat16, row stride x_row_stride) ->
 *   out   [rows, cols] FP8 (row stride out_row_stride), optional (NULL: columnwise only)
 *   out_t [cols, rows] FP8 contiguous, optional (NULL: rowwise only); at least one is given.
 *   Scaling as the norm's FP8 epilogue (normalization.h): delayed reads scale and max-updates amax;
 *   current computes amax (zeroed first), writes scale, then casts; scale_inv = 1 / scale.
 *   Values saturate to +-max of the format, round to nearest even. Transposed writes are staged
 *   through shared memory so that both the reads and the writes are coalesced.
 *
 * engine_fp8_transpose: in [rows, cols] FP8 (row stride in_row_stride) -> out_t [cols, rows]
 *   contiguous, a bitwise tiled transpose (any 1-byte dtype).
 */
#ifndef ENGINE_TRANSPOSE_H_
#define ENGINE_TRANSPOSE_H_

#include "engine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t rows, cols;
  const void* x;          /* [in]  [rows, cols] x_dtype */
  engine_dtype x_dtype;
  int64_t x_row_stride;
  void* out;              /* [out] [rows, cols] out_dtype, or NULL */
  int64_t out_row_stride;
  void* out_t;            /* [out] [cols, rows] out_dtype, or NULL */
  engine_dtype out_dtype; /* e4m3 or e5m2 */
  float* scale;           /* [in] (delayed) / [out] (current) [1] */
  float* amax;            /* [in,out] [1] */
  float* scale_inv;       /* [out] [1] */
  float amax_epsilon;
  int current_scaling;
} engine_cast_transpose_params;

engine_status engine_cast_transpose(const engine_cast_transpose_params* params, int sm_count,
                                    cudaStream_t stream);

engine_status engine_fp8_transpose(const void* in, int64_t rows, int64_t cols,
                                   int64_t in_row_stride, void* out_t, cudaStream_t stream);

/* engine_fp8_transpose on the resident CTAs of all SMs but sm_margin (>= 0): the tiled transpose
 * after a norm takes the norm's sm_margin, so that the SMs it leaves free stay free. */
engine_status engine_fp8_transpose_margin(const void* in, int64_t rows, int64_t cols,
                                          int64_t in_row_stride, void* out_t, int sm_margin,
                                          cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGINE_TRANSPOSE_H_ */
