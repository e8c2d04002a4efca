/*
 * Internal helpers shared by every engine/csrc translation unit (never part of the C API).
 *
 * Host side: error reporting into the thread-local engine_last_error() string, argument / launch
 * check macros, a per-device attribute cache and a kernel occupancy cache (so a launch costs no
 * driver query after the first call with the same kernel and block shape).
 * Device side lives in dtype.cuh (types, conversions, FP8), vec.cuh (16-byte loads and stores),
 * reduce.cuh (warp / row-group / block reductions) and tile.cuh (transposed byte-tile stores).
 */
#ifndef ENGINE_CSRC_COMMON_COMMON_CUH_
#define ENGINE_CSRC_COMMON_COMMON_CUH_

#include <cuda_runtime.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/common.h"

namespace engine {

/* Record a failure (printf-style detail) for engine_last_error() and return `status`. */
engine_status set_error(engine_status status, const char* fmt, ...)
#if defined(__GNUC__)
    __attribute__((format(printf, 2, 3)))
#endif
    ;

/* Reset the thread's last-error detail to "" (each public entry point calls this first). */
void clear_error();

/* Name of an engine_dtype for messages. */
const char* dtype_name(engine_dtype t);

/* Attributes of the current device, read once per device. */
struct DeviceInfo {
  int device;
  int sm_count;
  int max_smem_per_block_optin; /* bytes a block may use after cudaFuncSetAttribute */
  int smem_per_sm;              /* bytes of shared memory per multiprocessor */
  int l2_bytes;
  int cc_major;  /* compute capability */
  int clusters;  /* thread-block clusters usable: sm_90+ device and sm_90+ device code */
  int cluster16; /* clusters of 16 CTAs (non-portable) resident even at one CTA per SM */
  int dram_gbps; /* peak DRAM bandwidth, GB/s: 2 x memory clock x bus width (0: not reported) */
};
engine_status current_device_info(DeviceInfo* info);

/*
 * Blocks of `func` (block threads, dyn_smem bytes of dynamic shared memory) resident per SM.
 * Raises the kernel's dynamic shared-memory limit first when dyn_smem exceeds 48 KiB. Results are
 * cached per (device, func, block, dyn_smem). Returns ENGINE_ERROR_CUDA on a driver failure and
 * ENGINE_ERROR_INVALID_ARGUMENT if the block cannot be resident at all.
 */
engine_status blocks_per_sm(const void* func, int block, size_t dyn_smem, int* out);

/* Largest cluster a row kernel may use now: engine_set_max_cluster_size's value (0: 16 where
 * DeviceInfo::cluster16, else 8) where the device and the compiled code have clusters
 * (DeviceInfo::clusters), else 1. */
int max_cluster_size(const DeviceInfo& info);

/* DRAM bandwidth per SM under which a card takes the lean card's launch defaults
 * (engine_set_dram_class): the H100 SXM has 25 GB/s per SM, the H200 37. */
constexpr int kLeanDramGbpsPerSm = 30;

/* Whether launches on `info`'s device take the lean card's defaults: engine_set_dram_class's
 * value where set, else dram_gbps / sm_count < kLeanDramGbpsPerSm (a device that does not report
 * its bandwidth is wide: the defaults measured first, on H200s). */
bool lean_dram(const DeviceInfo& info);

/* engine_set_norm_fwd_vectors's value now (0: the launcher's choice). */
int norm_fwd_vectors();

/* engine_set_norm_bwd_elems's value now (0: the launcher's choice). */
int norm_bwd_elems();
/* engine_set_norm_bwd_reduce_vec's value now (0: the launcher's choice). */
int norm_bwd_reduce_vec();

/* engine_set_norm_bwd_cta_threads's value now (0: the launcher's choice). */
int norm_bwd_cta_threads();

/* engine_set_norm_fwd_general_loop's value now (0: the fast loop where it applies). */
int norm_fwd_general_loop();
/* engine_set_norm_fwd_blocked_from's value now (0: the launcher's default width). */
int norm_fwd_blocked_from();
/* engine_set_norm_fwd_grid_per_sm's value now (0: the launcher's default grid). */
int norm_fwd_grid_per_sm();
/* engine_set_norm_bwd_stream_from's value now (0: the launcher's default width). */
int norm_bwd_stream_from();
/* engine_set_norm_bwd_stream_threads's value now (0: the launcher's default). */
int norm_bwd_stream_threads();
/* engine_set_norm_fwd_stream_from's value now (0: the launcher's default width). */
int norm_fwd_stream_from();
/* engine_set_norm_fwd_stream_threads's value now (0: the launcher's default). */
int norm_fwd_stream_threads();
/* engine_set_norm_fwd_band's value now (0: the launcher's default). */
int norm_fwd_band();
/* engine_set_norm_fwd_lean's value now (0: the default, the lean kernel where it applies). */
int norm_fwd_lean();
/* engine_set_norm_fwd_fp8_lean's value now (0: the default, never). */
int norm_fwd_fp8_lean();
/* engine_set_norm_fwd_blocked_shape's value now (0: the default shape and grid). */
int norm_fwd_blocked_shape();
/* engine_set_fp8_transpose_order's value now (0: the default order). */
int fp8_transpose_order();

/*
 * Clusters of `cluster` CTAs of `func` (block threads, dyn_smem bytes) resident on the device at
 * once (cudaOccupancyMaxActiveClusters), cached like blocks_per_sm. ENGINE_ERROR_INVALID_ARGUMENT
 * if none fits.
 */
engine_status active_clusters(const void* func, int block, size_t dyn_smem, int cluster, int* out);

/* Persistent grid: min(work_items, max(1, sm_count - sm_margin) * per_sm), at least 1. */
inline int64_t persistent_grid(int64_t work_items, int sm_count, int sm_margin, int per_sm) {
  int64_t sms = (int64_t)sm_count - (int64_t)(sm_margin > 0 ? sm_margin : 0);
  if (sms < 1) sms = 1;
  int64_t g = sms * (per_sm < 1 ? 1 : per_sm);
  if (work_items < g) g = work_items;
  return g < 1 ? 1 : g;
}

/* Persistent grid of clusters: min(work_items, the `active` clusters the device holds at once,
 * scaled by the share of SMs left after sm_margin), at least 1. */
inline int64_t persistent_clusters(int64_t work_items, int active, int sm_count, int sm_margin) {
  int64_t sms = (int64_t)sm_count - (int64_t)(sm_margin > 0 ? sm_margin : 0);
  if (sms < 1) sms = 1;
  int64_t g = (int64_t)active * sms / (sm_count < 1 ? 1 : sm_count);
  if (g < 1) g = 1;
  if (work_items < g) g = work_items;
  return g < 1 ? 1 : g;
}

inline bool ptr_aligned(const void* p, int bytes) {
  return (reinterpret_cast<uintptr_t>(p) % (uintptr_t)bytes) == 0;
}

/* True if a [rows, cols] operand of `elem_bytes`-sized elements can be accessed `vec` elements at a
 * time with naturally aligned accesses of min(16, vec * elem_bytes) bytes: the pointer and the row
 * stride in bytes are multiples of that width (cols % vec is checked by the caller). NULL is fine. */
inline bool vec_ok(const void* p, int64_t row_stride, int64_t rows, int elem_bytes, int vec) {
  if (p == nullptr) return true;
  int a = vec * elem_bytes;
  if (a > 16) a = 16;
  if (!ptr_aligned(p, a)) return false;
  return rows <= 1 || ((row_stride * elem_bytes) % a) == 0;
}

inline int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }
inline int64_t round_up(int64_t a, int64_t b) { return ceil_div(a, b) * b; }
inline int pow2_floor(int v) {
  int p = 1;
  while (p * 2 <= v) p *= 2;
  return p;
}
inline int pow2_ceil(int v) {
  int p = 1;
  while (p < v) p *= 2;
  return p;
}

}  // namespace engine

/* Return ENGINE_ERROR_INVALID_ARGUMENT with a message unless `cond`. */
#define ENGINE_CHECK_ARG(cond, ...)                                              \
  do {                                                                           \
    if (!(cond)) return ::engine::set_error(ENGINE_ERROR_INVALID_ARGUMENT, __VA_ARGS__); \
  } while (0)

/* Evaluate a CUDA runtime call; on failure return ENGINE_ERROR_CUDA naming the call. The
 * thread's CUDA error state is cleared (cudaGetLastError) so that a non-sticky failure reported
 * here is not reported again by the framework's next, unrelated launch check. */
#define ENGINE_CHECK_CUDA(expr)                                                                 \
  do {                                                                                          \
    cudaError_t engine_err_ = (expr);                                                           \
    if (engine_err_ != cudaSuccess) {                                                           \
      (void)cudaGetLastError();                                                                 \
      return ::engine::set_error(ENGINE_ERROR_CUDA, "%s failed: %s (%s:%d)", #expr,            \
                                 cudaGetErrorString(engine_err_), __FILE__, __LINE__);          \
    }                                                                                           \
  } while (0)

/* After a <<<>>> launch: return ENGINE_ERROR_CUDA if the launch was rejected. */
#define ENGINE_CHECK_LAUNCH(kernel_name)                                                        \
  do {                                                                                          \
    cudaError_t engine_err_ = cudaGetLastError();                                               \
    if (engine_err_ != cudaSuccess)                                                             \
      return ::engine::set_error(ENGINE_ERROR_CUDA, "launch of %s failed: %s", kernel_name,    \
                                 cudaGetErrorString(engine_err_));                              \
  } while (0)

/* Propagate a non-success engine_status. */
#define ENGINE_TRY(expr)                          \
  do {                                            \
    engine_status engine_st_ = (expr);            \
    if (engine_st_ != ENGINE_SUCCESS) return engine_st_; \
  } while (0)

namespace engine {

/* A launch configuration of `grid` CTAs in clusters of `cluster` along x; *attr is its storage. */
inline cudaLaunchConfig_t cluster_launch_config(int64_t grid, int block, size_t dyn_smem,
                                                int cluster, cudaStream_t stream,
                                                cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((unsigned)grid);
  cfg.blockDim = dim3((unsigned)block);
  cfg.dynamicSmemBytes = dyn_smem;
  cfg.stream = stream;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = (unsigned)cluster;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

/* Launch `kernel(args)` on `grid` CTAs (a multiple of `cluster`) in clusters of `cluster` CTAs. */
template <typename Args>
engine_status launch_in_clusters(void (*kernel)(Args), int64_t grid, int block, size_t dyn_smem,
                                 int cluster, cudaStream_t stream, const Args& args) {
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(grid, block, dyn_smem, cluster, stream, &attr);
  ENGINE_CHECK_CUDA(cudaLaunchKernelEx(&cfg, kernel, args));
  return ENGINE_SUCCESS;
}

}  // namespace engine

#endif  // ENGINE_CSRC_COMMON_COMMON_CUH_
