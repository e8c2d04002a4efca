/* Q77 (benchmarks/NOTES.md): engine's lean bf16 forward kernel (norm_fwd_lean.cuh) built
 * stand-alone, without the extension, so that ci/lean_lab.py times two builds of it (e.g. of two
 * trees' headers: an A/B in one process, bit for bit the same outputs) in one call:
 *
 *   nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -Iengine/csrc -Iengine/csrc/include \
 *     -o /tmp/lean_new.so ci/lean_lab_engine.cu
 *   mkdir -p /tmp/old/normalization && git show REV:engine/csrc/normalization/norm_fwd_lean.cuh \
 *     > /tmp/old/normalization/norm_fwd_lean.cuh
 *   nvcc ... -I/tmp/old -Iengine/csrc -Iengine/csrc/include -o /tmp/lean_old.so ci/lean_lab_engine.cu
 *
 * The launch is the launcher's for a bf16 x, y and weights (launch_fwd_lean, fwd_grid_per_sm):
 * tpr = cols / 64 threads a row, 256 / tpr rows a CTA of 256 threads, 16 CTAs per SM (capped by
 * the row blocks; per_sm: another count, 0 the resident CTAs, a persistent grid); rows of
 * 4096-16384 columns, RMSNorm without or LayerNorm with a bias. */
#include <cuda_runtime.h>

#include <algorithm>

#include "lab_fwd_args.cuh"
#include "normalization/norm_fwd_lean.cuh"

using engine::norm::FwdArgs;

template <bool kRms>
static long long launch_t(const void* x, const void* gb, void* y, float* mu, float* rsigma, long long rows, int n,
                          int per_sm, cudaStream_t s) {
  const int tpr = n / (8 * engine::norm::kLeanNV);
  if (n % (8 * engine::norm::kLeanNV) != 0 || tpr < 32 || tpr > 256 || (tpr & (tpr - 1)) != 0) return -1;
  FwdArgs a = lab_fwd_args(kRms, x, gb, y, mu, rsigma, rows, n, tpr, engine::norm::kLeanThreads / tpr);
  const int sms = lab_sm_count();
  const long long work = (rows + a.rows_per_iter - 1) / a.rows_per_iter;
  auto* k = &engine::norm::norm_fwd_lean_kernel<__nv_bfloat16, __nv_bfloat16, __nv_bfloat16, kRms, !kRms,
                                                 engine::norm::kLeanThreads>;
  if (per_sm == 0 && cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, k, engine::norm::kLeanThreads, 0) !=
                         cudaSuccess) {
    return -2;
  }
  const long long grid = std::min<long long>((long long)per_sm * sms, work);
  a.grid_clusters = (int)grid;
  k<<<(unsigned)grid, engine::norm::kLeanThreads, 0, s>>>(a);
  return cudaGetLastError() == cudaSuccess ? grid : -2;
}

/* One launch (ln: LayerNorm with a bias, gb = gamma then beta; else RMSNorm, gb = gamma; per_sm CTAs
 * per SM, 0 the resident ones); returns the grid, -1 where the width is not the lean kernel's, -2 on
 * a launch error. */
extern "C" long long lean_engine_launch(int ln, const void* x, const void* gb, void* y, float* mu, float* rsigma,
                                        long long rows, int n, int per_sm, void* stream) {
  cudaStream_t s = static_cast<cudaStream_t>(stream);
  return ln ? launch_t<false>(x, gb, y, mu, rsigma, rows, n, per_sm, s)
            : launch_t<true>(x, gb, y, mu, rsigma, rows, n, per_sm, s);
}
