/*
 * engine_status_string / engine_last_error (the C API's error reporting), the host-side caches
 * declared in common.cuh and the cluster-size knob. The only kernel here is an empty probe whose
 * PTX version tells whether the loaded device code has clusters.
 *
 * The last-error detail is a thread-local string: each public entry point clears it, a failure
 * fills it, and engine_last_error() returns it (valid until the thread's next engine call).
 * The device and occupancy caches are small arrays behind a mutex: a launch after the first one of
 * a given kernel shape costs one uncontended lock and a short linear search, no driver call.
 */
#include <stdarg.h>
#include <stdio.h>

#include <atomic>
#include <mutex>
#include <string>
#include <vector>

#include "common/common.cuh"

namespace engine {
namespace {

thread_local std::string g_last_error;

constexpr int kMaxDevices = 64;
std::mutex g_device_mutex;
bool g_device_valid[kMaxDevices];
DeviceInfo g_device_info[kMaxDevices];

struct OccEntry {
  int device;
  const void* func;
  int block;
  size_t smem;
  int cluster; /* 0: blocks per SM (blocks_per_sm); > 0: active clusters of this size */
  int blocks;
};
std::mutex g_occ_mutex;
std::vector<OccEntry> g_occ;
/* (device, func) pairs whose dynamic shared-memory limit was raised to the device maximum. */
std::vector<std::pair<int, const void*>> g_smem_raised;

std::atomic<int> g_max_cluster{0}; /* 0: the device's largest (max_cluster_size) */
std::atomic<int> g_norm_fwd_vectors{0};
std::atomic<int> g_norm_bwd_elems{0};
std::atomic<int> g_norm_bwd_reduce_vec{0};
std::atomic<int> g_norm_bwd_cta_threads{0};
std::atomic<int> g_norm_fwd_general_loop{0};
std::atomic<int> g_norm_fwd_blocked_from{0};
std::atomic<int> g_norm_fwd_grid_per_sm{0};
std::atomic<int> g_norm_bwd_stream_from{0};
std::atomic<int> g_norm_bwd_stream_threads{0};
std::atomic<int> g_norm_fwd_stream_from{0};
std::atomic<int> g_norm_fwd_stream_threads{0};
std::atomic<int> g_norm_fwd_band{0};
std::atomic<int> g_norm_fwd_blocked_shape{0};
std::atomic<int> g_norm_fwd_lean{0};
std::atomic<int> g_norm_fwd_fp8_lean{0};
std::atomic<int> g_fp8_transpose_order{0};
std::atomic<int> g_dram_class{0}; /* engine_set_dram_class: 0 by the device */

/* Compiled like every kernel of the library: its PTX version tells whether the device code the
 * driver loads for this device was compiled for sm_90+ (where clusters exist), e.g. not when only
 * compute_80 PTX was built and is JIT-compiled for an H100. */
__global__ void probe_kernel() {}

/* The cached occupancy of (dev, func, block, smem, cluster) into *out; false if not cached yet. */
bool lookup_occ(int dev, const void* func, int block, size_t smem, int cluster, int* out) {
  std::lock_guard<std::mutex> lock(g_occ_mutex);
  for (const OccEntry& e : g_occ) {
    if (e.device == dev && e.func == func && e.block == block && e.smem == smem &&
        e.cluster == cluster) {
      *out = e.blocks;
      return true;
    }
  }
  return false;
}

}  // namespace

engine_status set_error(engine_status status, const char* fmt, ...) {
  char buf[1024];
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(buf, sizeof(buf), fmt, ap);
  va_end(ap);
  g_last_error.assign(buf);
  return status;
}

void clear_error() { g_last_error.clear(); }

const char* dtype_name(engine_dtype t) {
  switch (t) {
    case ENGINE_DTYPE_FLOAT32: return "float32";
    case ENGINE_DTYPE_FLOAT16: return "float16";
    case ENGINE_DTYPE_BFLOAT16: return "bfloat16";
    case ENGINE_DTYPE_FLOAT8_E4M3: return "float8_e4m3";
    case ENGINE_DTYPE_FLOAT8_E5M2: return "float8_e5m2";
  }
  return "unknown dtype";
}

engine_status current_device_info(DeviceInfo* info) {
  int dev = 0;
  ENGINE_CHECK_CUDA(cudaGetDevice(&dev));
  if (dev < 0 || dev >= kMaxDevices) {
    return set_error(ENGINE_ERROR_CUDA, "device ordinal %d out of the supported range", dev);
  }
  {
    std::lock_guard<std::mutex> lock(g_device_mutex);
    if (g_device_valid[dev]) {
      *info = g_device_info[dev];
      return ENGINE_SUCCESS;
    }
  }
  DeviceInfo d;
  d.device = dev;
  ENGINE_CHECK_CUDA(cudaDeviceGetAttribute(&d.sm_count, cudaDevAttrMultiProcessorCount, dev));
  ENGINE_CHECK_CUDA(
      cudaDeviceGetAttribute(&d.max_smem_per_block_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, dev));
  ENGINE_CHECK_CUDA(
      cudaDeviceGetAttribute(&d.smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, dev));
  ENGINE_CHECK_CUDA(cudaDeviceGetAttribute(&d.l2_bytes, cudaDevAttrL2CacheSize, dev));
  ENGINE_CHECK_CUDA(cudaDeviceGetAttribute(&d.cc_major, cudaDevAttrComputeCapabilityMajor, dev));
  {
    int mem_khz = 0, bus_bits = 0;
    ENGINE_CHECK_CUDA(cudaDeviceGetAttribute(&mem_khz, cudaDevAttrMemoryClockRate, dev));
    ENGINE_CHECK_CUDA(cudaDeviceGetAttribute(&bus_bits, cudaDevAttrGlobalMemoryBusWidth, dev));
    d.dram_gbps = (int)(2.0 * mem_khz * bus_bits / 8.0 / 1e6);
  }
  {
    cudaFuncAttributes attr;
    ENGINE_CHECK_CUDA(cudaFuncGetAttributes(&attr, reinterpret_cast<const void*>(&probe_kernel)));
    d.clusters = (d.cc_major >= 9 && attr.ptxVersion >= 90) ? 1 : 0;
  }
  d.cluster16 = 0;
  if (d.clusters) {
    /* Can a cluster of 16 CTAs be resident when each CTA takes a whole SM (the strictest case:
     * 16 free SMs in one GPC)? Asked of the probe with more than half an SM's shared memory. */
    const void* fn = reinterpret_cast<const void*>(&probe_kernel);
    const size_t smem = (size_t)d.smem_per_sm / 2 + 1024;
    int n = 0;
    if (smem <= (size_t)d.max_smem_per_block_optin &&
        cudaFuncSetAttribute(fn, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem) == cudaSuccess &&
        cudaFuncSetAttribute(fn, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) == cudaSuccess) {
      cudaLaunchAttribute la;
      const cudaLaunchConfig_t cfg = cluster_launch_config(16, 32, smem, 16, 0, &la);
      if (cudaOccupancyMaxActiveClusters(&n, fn, &cfg) != cudaSuccess) n = 0;
    }
    (void)cudaGetLastError(); /* a refused query is an answer here, not an error to keep */
    d.cluster16 = n >= 1 ? 1 : 0;
  }
  {
    std::lock_guard<std::mutex> lock(g_device_mutex);
    g_device_info[dev] = d;
    g_device_valid[dev] = true;
  }
  *info = d;
  return ENGINE_SUCCESS;
}

int max_cluster_size(const DeviceInfo& info) {
  if (!info.clusters) return 1;
  const int n = g_max_cluster.load(std::memory_order_relaxed);
  return n != 0 ? n : (info.cluster16 ? 16 : 8);
}

bool lean_dram(const DeviceInfo& info) {
  const int knob = g_dram_class.load(std::memory_order_relaxed);
  if (knob != 0) return knob == 1;
  return info.dram_gbps > 0 && info.sm_count > 0 && info.dram_gbps < kLeanDramGbpsPerSm * info.sm_count;
}

int norm_fwd_vectors() { return g_norm_fwd_vectors.load(std::memory_order_relaxed); }

int norm_bwd_elems() { return g_norm_bwd_elems.load(std::memory_order_relaxed); }
int norm_bwd_reduce_vec() { return g_norm_bwd_reduce_vec.load(std::memory_order_relaxed); }

int norm_bwd_cta_threads() { return g_norm_bwd_cta_threads.load(std::memory_order_relaxed); }

int norm_fwd_general_loop() { return g_norm_fwd_general_loop.load(std::memory_order_relaxed); }

int norm_fwd_blocked_from() { return g_norm_fwd_blocked_from.load(std::memory_order_relaxed); }

int norm_fwd_grid_per_sm() { return g_norm_fwd_grid_per_sm.load(std::memory_order_relaxed); }

int norm_bwd_stream_from() { return g_norm_bwd_stream_from.load(std::memory_order_relaxed); }

int norm_bwd_stream_threads() { return g_norm_bwd_stream_threads.load(std::memory_order_relaxed); }
int norm_fwd_stream_from() { return g_norm_fwd_stream_from.load(std::memory_order_relaxed); }
int norm_fwd_stream_threads() { return g_norm_fwd_stream_threads.load(std::memory_order_relaxed); }

int norm_fwd_band() { return g_norm_fwd_band.load(std::memory_order_relaxed); }
int norm_fwd_lean() { return g_norm_fwd_lean.load(std::memory_order_relaxed); }
int norm_fwd_fp8_lean() { return g_norm_fwd_fp8_lean.load(std::memory_order_relaxed); }
int norm_fwd_blocked_shape() { return g_norm_fwd_blocked_shape.load(std::memory_order_relaxed); }
int fp8_transpose_order() { return g_fp8_transpose_order.load(std::memory_order_relaxed); }

engine_status active_clusters(const void* func, int block, size_t dyn_smem, int cluster, int* out) {
  int dev = 0;
  ENGINE_CHECK_CUDA(cudaGetDevice(&dev));
  if (lookup_occ(dev, func, block, dyn_smem, cluster, out)) return ENGINE_SUCCESS;
  int per_sm = 0;
  ENGINE_TRY(blocks_per_sm(func, block, dyn_smem, &per_sm)); /* raises the smem limit if needed */
  if (cluster > 8) { /* 16 (sm_90) is a non-portable size: the kernel must opt in before use */
    ENGINE_CHECK_CUDA(cudaFuncSetAttribute(func, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
  }
  cudaLaunchAttribute attr;
  const cudaLaunchConfig_t cfg = cluster_launch_config(cluster, block, dyn_smem, cluster, 0, &attr);
  int n = 0;
  ENGINE_CHECK_CUDA(cudaOccupancyMaxActiveClusters(&n, func, &cfg));
  if (n < 1) {
    return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                     "no cluster of %d CTAs of %d threads (%zu bytes of dynamic shared memory) "
                     "can be resident on this device",
                     cluster, block, dyn_smem);
  }
  {
    std::lock_guard<std::mutex> lock(g_occ_mutex);
    g_occ.push_back(OccEntry{dev, func, block, dyn_smem, cluster, n});
  }
  *out = n;
  return ENGINE_SUCCESS;
}

engine_status blocks_per_sm(const void* func, int block, size_t dyn_smem, int* out) {
  int dev = 0;
  ENGINE_CHECK_CUDA(cudaGetDevice(&dev));
  if (lookup_occ(dev, func, block, dyn_smem, 0, out)) return ENGINE_SUCCESS;
  cudaFuncAttributes attr;
  ENGINE_CHECK_CUDA(cudaFuncGetAttributes(&attr, func));
  /* Past 48 KB of static + dynamic shared memory a kernel must opt in: the test is on the sum
   * (49152 dynamic bytes beside 528 static ones, the RMSNorm backward at 98304, were refused when
   * it looked at the dynamic bytes alone). */
  if (dyn_smem + attr.sharedSizeBytes > 48 * 1024) {
    bool raised = false;
    {
      std::lock_guard<std::mutex> lock(g_occ_mutex);
      for (const auto& p : g_smem_raised) raised = raised || (p.first == dev && p.second == func);
    }
    if (!raised) {
      DeviceInfo info;
      ENGINE_TRY(current_device_info(&info));
      if (dyn_smem > (size_t)info.max_smem_per_block_optin) {
        return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                         "kernel needs %zu bytes of shared memory, the device allows %d", dyn_smem,
                         info.max_smem_per_block_optin);
      }
      /* The opt-in limit covers static + dynamic shared memory: raise the dynamic part to what
       * the static part leaves (asking for the whole opt-in limit is an invalid argument). */
      const size_t dyn_max = (size_t)info.max_smem_per_block_optin - attr.sharedSizeBytes;
      if (dyn_smem > dyn_max) {
        return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                         "kernel needs %zu bytes of dynamic shared memory, the device leaves %zu "
                         "beside its %zu static bytes",
                         dyn_smem, dyn_max, (size_t)attr.sharedSizeBytes);
      }
      ENGINE_CHECK_CUDA(cudaFuncSetAttribute(func, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                             (int)dyn_max));
      std::lock_guard<std::mutex> lock(g_occ_mutex);
      g_smem_raised.emplace_back(dev, func);
    }
  }
  int blocks = 0;
  ENGINE_CHECK_CUDA(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&blocks, func, block, dyn_smem));
  if (blocks < 1) {
    return set_error(ENGINE_ERROR_INVALID_ARGUMENT,
                     "a block of %d threads with %zu bytes of dynamic shared memory cannot be "
                     "resident on this device",
                     block, dyn_smem);
  }
  {
    std::lock_guard<std::mutex> lock(g_occ_mutex);
    g_occ.push_back(OccEntry{dev, func, block, dyn_smem, 0, blocks});
  }
  *out = blocks;
  return ENGINE_SUCCESS;
}

}  // namespace engine

extern "C" {

const char* engine_status_string(engine_status status) {
  switch (status) {
    case ENGINE_SUCCESS: return "ENGINE_SUCCESS";
    case ENGINE_ERROR_INVALID_ARGUMENT: return "ENGINE_ERROR_INVALID_ARGUMENT";
    case ENGINE_ERROR_CUDA: return "ENGINE_ERROR_CUDA";
  }
  return "ENGINE_ERROR_UNKNOWN";
}

const char* engine_last_error(void) { return engine::g_last_error.c_str(); }

int engine_set_max_cluster_size(int n) {
  if (n != 0 && n != 1 && n != 2 && n != 4 && n != 8 && n != 16) return -1;
  return engine::g_max_cluster.exchange(n);
}

int engine_set_norm_bwd_elems(int n) {
  if (n != 0 && n != 16 && n != 32) return -1;
  return engine::g_norm_bwd_elems.exchange(n);
}

int engine_set_norm_bwd_reduce_vec(int n) {
  if (n != 0 && n != 1 && n != 4) return -1;
  return engine::g_norm_bwd_reduce_vec.exchange(n);
}

int engine_set_norm_bwd_cta_threads(int n) {
  if (n != 0 && n != 256 && n != 512 && n != 1024) return -1;
  return engine::g_norm_bwd_cta_threads.exchange(n);
}

int engine_set_norm_fwd_vectors(int n) {
  if (n != 0 && n != 4 && n != 8) return -1;
  return engine::g_norm_fwd_vectors.exchange(n);
}

int engine_set_norm_fwd_general_loop(int n) {
  if (n != 0 && n != 1) return -1;
  return engine::g_norm_fwd_general_loop.exchange(n);
}

int engine_set_norm_fwd_blocked_from(int n) {
  if (n < 0) return -1;
  return engine::g_norm_fwd_blocked_from.exchange(n);
}

int engine_set_norm_fwd_grid_per_sm(int n) {
  if (n < 0 || n > 64) return -1;
  return engine::g_norm_fwd_grid_per_sm.exchange(n);
}

int engine_set_norm_bwd_stream_from(int n) {
  if (n < 0) return -1;
  return engine::g_norm_bwd_stream_from.exchange(n);
}

int engine_set_norm_bwd_stream_threads(int n) {
  if (n != 0 && n != 128 && n != 256 && n != 512) return -1;
  return engine::g_norm_bwd_stream_threads.exchange(n);
}

int engine_set_norm_fwd_stream_from(int n) {
  if (n < 0) return -1;
  return engine::g_norm_fwd_stream_from.exchange(n);
}

int engine_set_norm_fwd_stream_threads(int n) {
  if (n != 0 && n != 128 && n != 256 && n != 512) return -1;
  return engine::g_norm_fwd_stream_threads.exchange(n);
}

int engine_set_norm_fwd_band(int n) {
  if (n < 0 || n > 4) return -1;
  return engine::g_norm_fwd_band.exchange(n);
}

int engine_set_norm_fwd_blocked_shape(int n) {
  if (n < 0 || n > 4) return -1;
  return engine::g_norm_fwd_blocked_shape.exchange(n);
}

int engine_set_norm_fwd_lean(int n) {
  if (n < 0 || n > 3) return -1;
  return engine::g_norm_fwd_lean.exchange(n);
}

int engine_set_norm_fwd_fp8_lean(int n) {
  if (n < 0 || n > 2) return -1;
  return engine::g_norm_fwd_fp8_lean.exchange(n);
}

int engine_set_fp8_transpose_order(int n) {
  if (n < 0 || n > 2) return -1;
  return engine::g_fp8_transpose_order.exchange(n);
}

int engine_set_dram_class(int n) {
  if (n < 0 || n > 2) return -1;
  return engine::g_dram_class.exchange(n);
}

int engine_dram_class(void) {
  engine::clear_error();
  engine::DeviceInfo info;
  if (engine::current_device_info(&info) != ENGINE_SUCCESS) return -1;
  return engine::lean_dram(info) ? 1 : 2;
}

}  // extern "C"
