/* The FwdArgs of the stand-alone builds of engine's kernels (ci/fp8_lab_engine.cu,
 * ci/lean_lab_engine.cu): contiguous bf16 rows of n, bf16 gamma then (LayerNorm, with a bias) beta
 * in gb, eps 1e-5, mode kFull, one CTA per row group set (tpr threads a row, rows_per_iter rows a
 * CTA), no cluster; and the SM count the launches size their grids by. */
#ifndef ENGINE_CI_LAB_FWD_ARGS_CUH_
#define ENGINE_CI_LAB_FWD_ARGS_CUH_

#include <cuda_runtime.h>

#include "normalization/norm_fwd.cuh"

inline engine::norm::FwdArgs lab_fwd_args(bool rms, const void* x, const void* gb, void* y, float* mu, float* rsigma,
                                          long long rows, int n, int tpr, int rows_per_iter) {
  engine::norm::FwdArgs a{};
  a.rows = rows;
  a.cols = n;
  a.x = x;
  a.x_stride = n;
  a.weight = gb;
  a.bias = rms ? nullptr : static_cast<const __nv_bfloat16*>(gb) + n;
  a.w_dtype = ENGINE_DTYPE_BFLOAT16;
  a.out = y;
  a.out_stride = n;
  a.mu = rms ? nullptr : mu;
  a.rsigma = rsigma;
  a.eps = 1e-5f;
  a.inv_n = 1.0f / (float)n;
  a.mode = engine::norm::kFull;
  a.is_rms = rms ? 1 : 0;
  a.tpr = tpr;
  a.rows_per_iter = rows_per_iter;
  a.cluster = 1;
  a.gb_off = -1;
  return a;
}

inline int lab_sm_count() {
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  return sms;
}

#endif  // ENGINE_CI_LAB_FWD_ARGS_CUH_
