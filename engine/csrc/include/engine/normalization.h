/*
 * engine C API: RMSNorm and LayerNorm, forward and backward, with fused residual add and FP8 output.
 *
 * Shapes: 2-D [rows, cols]; every [rows, cols] operand has unit stride in the last dim and its own
 * row stride (in elements). Statistics are float32 [rows]. All pointers are device pointers.
 *
 * Forward (is_rms_norm picks the formula):
 *   z      = x + residual                       (if residual; z is stored to residual_out in
 *                                                residual_dtype and the stored value is normalised)
 *   mu     = mean(z)                            (LayerNorm only, written to mu)
 *   rsigma = 1 / sqrt(mean((z - mu)^2) + eps)   (RMSNorm: 1 / sqrt(mean(z^2) + eps))
 *   g      = zero_centered_gamma ? 1 + weight : weight
 *   y      = (z - mu) * rsigma * g + bias       (bias optional)
 * out receives y in out_dtype. FP8 out_dtype (e4m3 / e5m2) needs scale, amax, scale_inv:
 *   out = saturate(y * scale) rounded to nearest even, saturate clamps to the format's +-max;
 *   delayed scaling: scale is read once, amax = max(amax, max|y|) (deterministic atomic max);
 *   current scaling: pass 1 computes amax = max|y| (amax is zeroed by the call first), then
 *     scale = fp8_max / max(amax, amax_epsilon) (1.0 if that is 0 or not finite) is written to
 *     scale, and pass 2 quantizes with it;
 *   both: scale_inv = 1 / scale is written by exactly one thread;
 *   out_t (optional): the FP8 data transposed, [cols, rows] contiguous (row stride = rows).
 *
 * Backward (x here is z, the normalised input: residual_out when a residual was added):
 *   xhat = (z - mu) * rsigma,  dyg = dy * g
 *   RMSNorm:   dz = rsigma * (dyg - xhat * mean(dyg * xhat))
 *   LayerNorm: dz = rsigma * (dyg - mean(dyg) - xhat * mean(dyg * xhat))
 *   dz += dresidual (if given); dx = dz in dx_dtype; dres = dz in dres_dtype (if given)
 *   dweight = sum_rows(dy * xhat), dbias = sum_rows(dy): reduced from per-CTA float32 partials
 *   held in the workspace by a second kernel; deterministic, no float atomics.
 *
 * Supported dtypes: x float32/float16/bfloat16; weight and bias: x_dtype or float32;
 * residual / residual_out: x_dtype or float32; out: float32/float16/bfloat16/e4m3/e5m2;
 * backward dy: float32/float16/bfloat16; dx_dtype: any of those three; dresidual / dres: the
 * residual's dtype. Anything else returns ENGINE_ERROR_INVALID_ARGUMENT.
 * cols >= 1 and up to 262144 (and beyond: the blocked path has no upper limit); rows >= 0.
 */
#ifndef ENGINE_NORMALIZATION_H_
#define ENGINE_NORMALIZATION_H_

#include "engine/common.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct {
  int64_t rows, cols;
  const void* x;          /* [in]  [rows, cols] x_dtype */
  engine_dtype x_dtype;
  int64_t x_row_stride;
  const void* residual;   /* [in]  [rows, cols] residual_dtype, or NULL */
  engine_dtype residual_dtype;
  int64_t residual_row_stride;
  const void* weight;     /* [in]  [cols] weight_dtype */
  engine_dtype weight_dtype;
  const void* bias;       /* [in]  [cols] weight_dtype, or NULL */
  void* out;              /* [out] [rows, cols] out_dtype */
  engine_dtype out_dtype;
  int64_t out_row_stride;
  void* residual_out;     /* [out] [rows, cols] residual_dtype; required iff residual */
  int64_t residual_out_row_stride;
  float* mu;              /* [out] [rows], required for LayerNorm, ignored for RMSNorm */
  float* rsigma;          /* [out] [rows] */
  float* scale;           /* [in] (delayed) / [out] (current) [1]; FP8 out only */
  float* amax;            /* [in,out] [1]; FP8 out only */
  float* scale_inv;       /* [out] [1]; FP8 out only */
  void* out_t;            /* [out] [cols, rows] out_dtype, or NULL; FP8 out only */
  float eps;
  float amax_epsilon;     /* current scaling only */
  int is_rms_norm;
  int zero_centered_gamma;
  int current_scaling;
  int out_t_auto;         /* with out_t: 1 writes it by the faster path measured at this width
                             (the norm kernel where it writes the copy faster: the band kernel,
                             the register path's tile up to 1024 columns; else the tiled transpose
                             after the norm), 0 by the norm kernel wherever its path can, 2 by the
                             tiled transpose after the norm always; the same bytes in every case.
                             With 0 and 1 alike, where rows % 16 != 0 and rows is even the tiled
                             transpose after the norm writes it: the copy's runs are then 2-, 4-
                             or 8-byte aligned, which the norm kernels would store byte by byte.
                             Whether a copy is made at all (out_t) may choose the norm's kernel
                             (fwd_stream_from_default's `alone`) */
} engine_norm_fwd_params;

typedef struct {
  int64_t rows, cols;
  const void* dy;         /* [in]  [rows, cols] dy_dtype */
  engine_dtype dy_dtype;
  int64_t dy_row_stride;
  const void* x;          /* [in]  [rows, cols] x_dtype: z, the normalised input */
  engine_dtype x_dtype;
  int64_t x_row_stride;
  const float* mu;        /* [in]  [rows], LayerNorm only */
  const float* rsigma;    /* [in]  [rows] */
  const void* weight;     /* [in]  [cols] weight_dtype */
  engine_dtype weight_dtype;
  const void* dresidual;  /* [in]  [rows, cols] dres_dtype, or NULL: gradient of residual_out */
  int64_t dresidual_row_stride;
  void* dx;               /* [out] [rows, cols] dx_dtype */
  engine_dtype dx_dtype;
  int64_t dx_row_stride;
  void* dres;             /* [out] [rows, cols] dres_dtype, or NULL: dz again, in dres_dtype */
  engine_dtype dres_dtype;
  int64_t dres_row_stride;
  void* dweight;          /* [out] [cols] weight_dtype */
  void* dbias;            /* [out] [cols] weight_dtype, or NULL */
  int is_rms_norm;
  int zero_centered_gamma;
} engine_norm_bwd_params;

/* Forward. sm_count: the device's multiprocessor count; the persistent grid uses
 * (sm_count - sm_margin) SMs' worth of CTAs (at least 1). */
engine_status engine_norm_fwd(const engine_norm_fwd_params* params, int sm_count, int sm_margin,
                              cudaStream_t stream);

/* Bytes of device workspace engine_norm_bwd needs (float32 partials of dweight and dbias). */
size_t engine_norm_bwd_workspace_bytes(int64_t rows, int64_t cols, int has_dbias, int sm_count,
                                       int sm_margin);

/* Backward. workspace: at least engine_norm_bwd_workspace_bytes(...) bytes, 16-byte aligned,
 * contents ignored on entry. */
engine_status engine_norm_bwd(const engine_norm_bwd_params* params, int sm_count, int sm_margin,
                              void* workspace, size_t workspace_bytes, cudaStream_t stream);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGINE_NORMALIZATION_H_ */
