/* Q75c (benchmarks/NOTES.md): engine's lean FP8 forward kernel (norm_fwd_fp8_lean.cuh) built
 * stand-alone, without the extension, so that ci/fp8_lab.py times it beside the lab's kernels in
 * one process and ncu profiles both from one script (--engine-so):
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -Iengine/csrc -Iengine/csrc/include \
 *     -o /tmp/fp8_lab_engine.so ci/fp8_lab_engine.cu
 *
 * The launch is the launcher's (launch_fwd_fp8_lean): tpr = cols / 32, 512 / tpr row groups a CTA,
 * one CTA per SM; bf16 x and weights, RMSNorm without or LayerNorm with a bias, e4m3, delayed
 * scaling. To A/B two trees' kernels in one process, build it twice (the older header first on the
 * include path: -I/tmp/old, holding normalization/norm_fwd_fp8_lean.cuh) and hand both to
 * ci/fp8_lab.py --engine-so. */
#include <cuda_runtime.h>

#include <algorithm>

#include "lab_fwd_args.cuh"
#include "normalization/norm_fwd_fp8_lean.cuh"

using engine::norm::FwdArgs;

template <bool kRms>
static long long launch_t(const void* x, const void* gb, void* y, float* mu, float* rsigma, float* scale,
                           float* amax, float* scale_inv, long long rows, int n, cudaStream_t s) {
  if (n % 32 != 0) return -1;
  const int tpr = n / 32;
  if (tpr < 32 || tpr > 512 || tpr % 32 != 0) return -1;
  FwdArgs a = lab_fwd_args(kRms, x, gb, y, mu, rsigma, rows, n, tpr, 512 / tpr);
  a.scale = scale;
  a.amax = amax;
  a.scale_inv = scale_inv;
  a.fp8_max = 448.0f;
  const int sms = lab_sm_count();
  const long long work = (rows + a.rows_per_iter - 1) / a.rows_per_iter;
  const long long grid = std::min<long long>(sms, work);
  a.grid_clusters = (int)grid;
  auto* k = &engine::norm::norm_fwd_fp8_lean_kernel<__nv_bfloat16, __nv_bfloat16, kRms, !kRms, __NV_E4M3>;
  k<<<(unsigned)grid, tpr * a.rows_per_iter, 0, s>>>(a);
  return cudaGetLastError() == cudaSuccess ? grid : -2;
}

/* One launch at 4 vectors per thread (the kernel's only layout since P181); gb = gamma then
 * (LayerNorm) beta. */
extern "C" long long fp8_engine_launch(int ln, const void* x, const void* gb, void* y, float* mu,
                                       float* rsigma, float* scale, float* amax, float* scale_inv,
                                       long long rows, int n, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return ln ? launch_t<false>(x, gb, y, mu, rsigma, scale, amax, scale_inv, rows, n, s)
            : launch_t<true>(x, gb, y, mu, rsigma, scale, amax, scale_inv, rows, n, s);
}
