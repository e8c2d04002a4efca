// PyTorch binding of the engine C API (engine/csrc/include/engine/*.h). This file only adapts:
// it checks tensors (device, dtype, shape, unit last-dim stride), takes the current stream under a
// device guard, reads the SM count (cached per device), allocates the backward workspace from the
// caching allocator (no cudaMalloc, no sync: CUDA-graph capturable), releases the GIL around the
// call, and reports every failure -- a bad argument or a failing engine_status with
// engine_last_error() -- as a returned message ("" on success) that engine/cuda_backend.py raises as
// a Python exception. No C++ exception crosses this boundary (on the GPU machine an exception thrown
// out of a binding under pytest-xdist crashed the process; see tests/test_norm_api.py).
// Every function mirrors the op contract of engine/reference.py (outputs passed in, returns None);
// engine/cuda_backend.py adds the keyword-only Python signature on top. The *_alloc entries
// (norm_fwd_alloc, norm_bwd_alloc, cast_transpose_alloc) allocate those outputs here from the
// caching allocator and call the same functions: one host call per op for the Python wrappers of
// engine/_norm_ops.py and engine/transpose.py (small shapes are host-bound; benchmarks/NOTES.md
// P139, P140).

#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#include <torch/extension.h>

#include <atomic>
#include <optional>
#include <stdexcept>
#include <string>
#include <tuple>
#include <type_traits>
#include <utility>

#include "engine/common.h"
#include "engine/normalization.h"
#include "engine/transpose.h"

namespace {

using at::Tensor;
using Msg = std::string;  // "" = success, else the error message

// Messages are assembled without std::ostream: on the GPU machine, inserting an integer into an
// ostream from this extension crashed inside libstdc++ (num_put via a facet of another libstdc++
// build: g++ 13 headers against the loaded runtime), so numbers go through std::to_string and
// torch types through their own string functions.
inline void app(std::string& s, const char* v) { s += v; }
inline void app(std::string& s, const std::string& v) { s += v; }
template <typename T, typename std::enable_if<std::is_integral<T>::value, int>::type = 0>
inline void app(std::string& s, T v) { s += std::to_string(v); }
inline void app(std::string& s, at::ScalarType t) { s += c10::toString(t); }
inline void app(std::string& s, const at::Device& d) { s += d.str(); }
inline void app(std::string& s, c10::IntArrayRef a) {
  s += "[";
  for (size_t i = 0; i < a.size(); ++i) s += (i ? ", " : "") + std::to_string(a[i]);
  s += "]";
}
template <typename... A>
std::string cat(const A&... a) {
  std::string s;
  (app(s, a), ...);
  return s;
}

#define BCHECK(cond, ...)                                   \
  do {                                                      \
    if (!(cond)) return cat(__VA_ARGS__);                   \
  } while (0)
#define BTRY(expr)                                          \
  do {                                                      \
    Msg bind_err_ = (expr);                                 \
    if (!bind_err_.empty()) return bind_err_;               \
  } while (0)
using OptTensor = std::optional<Tensor>;

bool is_fp8(at::ScalarType t) {
  return t == at::kFloat8_e4m3fn || t == at::kFloat8_e5m2;
}

bool is_high_precision(at::ScalarType t) {
  return t == at::kFloat || t == at::kHalf || t == at::kBFloat16;
}

engine_dtype to_engine(at::ScalarType t, const char* name) {
  switch (t) {
    case at::kFloat: return ENGINE_DTYPE_FLOAT32;
    case at::kHalf: return ENGINE_DTYPE_FLOAT16;
    case at::kBFloat16: return ENGINE_DTYPE_BFLOAT16;
    case at::kFloat8_e4m3fn: return ENGINE_DTYPE_FLOAT8_E4M3;
    case at::kFloat8_e5m2: return ENGINE_DTYPE_FLOAT8_E5M2;
    default: break;
  }
  (void)name;  // unreachable: every caller checks the dtype first
  return ENGINE_DTYPE_FLOAT32;
}

// Multiprocessor count of a device, read once.
int sm_count(int device) {
  static std::atomic<int> cache[128];
  if (device < 0 || device >= 128) return 0;
  int v = cache[device].load(std::memory_order_relaxed);
  if (v > 0) return v;
  int n = 0;
  if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device) != cudaSuccess || n < 1) {
    (void)cudaGetLastError();
    return 0;  // callers report it
  }
  cache[device].store(n, std::memory_order_relaxed);
  return n;
}

Msg check_on(const Tensor& t, const char* name, const at::Device& dev) {
  BCHECK(t.is_cuda(), "engine: ", name, " must be a CUDA tensor, got a tensor on ", t.device(),
              " (the CUDA backend runs on CUDA tensors only)");
  BCHECK(t.device() == dev, "engine: ", name, " is on ", t.device(), " but x is on ", dev,
              "; put all tensors on one device");
  return {};
}

// A [rows, cols] operand with unit stride in the last dim. Inputs may have any row stride (0 for an
// expanded tensor); outputs must not overlap (row stride >= cols).
Msg check_2d(const Tensor& t, const char* name, const at::Device& dev, int64_t rows, int64_t cols,
              bool output) {
  BTRY(check_on(t, name, dev));
  BCHECK(t.dim() == 2, "engine: ", name, " must be 2-D [rows, cols], got shape ", t.sizes());
  BCHECK(t.size(0) == rows && t.size(1) == cols, "engine: ", name, " must have shape [", rows,
              ", ", cols, "], got ", t.sizes());
  BCHECK(cols <= 1 || t.stride(1) == 1, "engine: ", name,
              " must have unit stride in its last dim, got strides ", t.strides(),
              "; call .contiguous() first");
  BCHECK(!output || rows <= 1 || t.stride(0) >= cols, "engine: output ", name,
              " has row stride ", t.stride(0), " < cols ", cols, "; output rows must not overlap");
  return {};
}

int64_t row_stride(const Tensor& t) {
  return t.size(0) <= 1 ? t.size(1) : t.stride(0);
}

// A contiguous 1-D [n] tensor.
Msg check_1d(const Tensor& t, const char* name, const at::Device& dev, int64_t n) {
  BTRY(check_on(t, name, dev));
  BCHECK(t.dim() == 1 && t.size(0) == n, "engine: ", name, " must have shape [", n, "], got ",
              t.sizes());
  BCHECK(t.is_contiguous(), "engine: ", name, " must be contiguous");
  return {};
}

Msg check_stats(const Tensor& t, const char* name, const at::Device& dev, int64_t rows) {
  BTRY(check_1d(t, name, dev, rows));
  BCHECK(t.scalar_type() == at::kFloat, "engine: ", name, " must be float32, got ",
              t.scalar_type());
  return {};
}

Msg check_meta(const OptTensor& t, const char* name, const at::Device& dev) {
  BCHECK(t.has_value(), "engine: FP8 output needs ", name, " (a float32 tensor of one element)");
  BTRY(check_on(*t, name, dev));
  BCHECK(t->scalar_type() == at::kFloat && t->numel() == 1, "engine: ", name,
         " must be a float32 tensor of one element, got ", t->scalar_type(), " ", t->sizes());
  return {};
}

Msg engine_failure(engine_status st, const char* what) {
  return std::string("engine: ") + what + " failed (" + engine_status_string(st) + "): " +
         engine_last_error();
}

Msg norm_fwd(const Tensor& x, const Tensor& weight, const OptTensor& bias, const OptTensor& residual,
              double eps, const Tensor& out, const OptTensor& residual_out, const OptTensor& mu,
              const Tensor& rsigma, const OptTensor& scale, const OptTensor& amax,
              const OptTensor& scale_inv, const OptTensor& out_t, bool is_rms_norm,
              bool zero_centered_gamma, bool current_scaling, double amax_epsilon,
              int64_t sm_margin, bool out_t_auto, bool out_t_after) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  const at::Device dev = x.device();
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  const int64_t rows = x.size(0), cols = x.size(1);
  BCHECK(cols >= 1, "engine: x must have at least one column");
  BTRY(check_2d(x, "x", dev, rows, cols, false));
  BCHECK(is_high_precision(x.scalar_type()), "engine: x must be float32, float16 or bfloat16, got ",
              x.scalar_type());
  BTRY(check_1d(weight, "weight", dev, cols));
  BCHECK(weight.scalar_type() == x.scalar_type() || weight.scalar_type() == at::kFloat,
              "engine: weight must be float32 or x's dtype (", x.scalar_type(), "), got ",
              weight.scalar_type());
  if (bias) {
    BTRY(check_1d(*bias, "bias", dev, cols));
    BCHECK(bias->scalar_type() == weight.scalar_type(), "engine: bias dtype ",
                bias->scalar_type(), " must match weight's (", weight.scalar_type(), ")");
  }
  BTRY(check_2d(out, "out", dev, rows, cols, true));
  BCHECK(residual.has_value() == residual_out.has_value(),
              "engine: residual and residual_out must be given together");
  if (residual) {
    BTRY(check_2d(*residual, "residual", dev, rows, cols, false));
    BTRY(check_2d(*residual_out, "residual_out", dev, rows, cols, true));
    BCHECK(residual->scalar_type() == x.scalar_type() || residual->scalar_type() == at::kFloat,
                "engine: residual must be float32 or x's dtype (", x.scalar_type(), "), got ",
                residual->scalar_type());
    BCHECK(residual_out->scalar_type() == residual->scalar_type(), "engine: residual_out dtype ",
                residual_out->scalar_type(), " must match residual's (", residual->scalar_type(), ")");
  }
  if (!is_rms_norm) {
    BCHECK(mu.has_value(), "engine: LayerNorm needs mu (float32 [rows])");
    BTRY(check_stats(*mu, "mu", dev, rows));
  }
  BTRY(check_stats(rsigma, "rsigma", dev, rows));
  const bool fp8 = is_fp8(out.scalar_type());
  BCHECK(fp8 || is_high_precision(out.scalar_type()), "engine: out has unsupported dtype ",
              out.scalar_type());
  BCHECK(sm_margin >= 0, "engine: sm_margin must be >= 0, got ", sm_margin);

  engine_norm_fwd_params p{};
  p.rows = rows;
  p.cols = cols;
  p.x = x.data_ptr();
  p.x_dtype = to_engine(x.scalar_type(), "x");
  p.x_row_stride = row_stride(x);
  p.residual = residual ? residual->data_ptr() : nullptr;
  p.residual_dtype = residual ? to_engine(residual->scalar_type(), "residual") : p.x_dtype;
  p.residual_row_stride = residual ? row_stride(*residual) : cols;
  p.weight = weight.data_ptr();
  p.weight_dtype = to_engine(weight.scalar_type(), "weight");
  p.bias = bias ? bias->data_ptr() : nullptr;
  p.out = out.data_ptr();
  p.out_dtype = to_engine(out.scalar_type(), "out");
  p.out_row_stride = row_stride(out);
  p.residual_out = residual_out ? residual_out->data_ptr() : nullptr;
  p.residual_out_row_stride = residual_out ? row_stride(*residual_out) : cols;
  p.mu = is_rms_norm ? nullptr : mu->data_ptr<float>();
  p.rsigma = rsigma.data_ptr<float>();
  if (fp8) {
    BTRY(check_meta(scale, "scale", dev));
    BTRY(check_meta(amax, "amax", dev));
    BTRY(check_meta(scale_inv, "scale_inv", dev));
    p.scale = scale->data_ptr<float>();
    p.amax = amax->data_ptr<float>();
    p.scale_inv = scale_inv->data_ptr<float>();
    if (out_t) {
      BTRY(check_on(*out_t, "out_t", dev));
      BCHECK(out_t->scalar_type() == out.scalar_type(), "engine: out_t dtype ",
                  out_t->scalar_type(), " must match out's (", out.scalar_type(), ")");
      BCHECK(out_t->dim() == 2 && out_t->size(0) == cols && out_t->size(1) == rows &&
                      out_t->is_contiguous(),
                  "engine: out_t must be a contiguous [", cols, ", ", rows, "] tensor, got ",
                  out_t->sizes(), " with strides ", out_t->strides());
      p.out_t = out_t->data_ptr();
    }
  } else {
    BCHECK(!out_t.has_value(), "engine: out_t is only supported for FP8 outputs");
  }
  p.eps = static_cast<float>(eps);
  p.amax_epsilon = static_cast<float>(amax_epsilon);
  p.is_rms_norm = is_rms_norm ? 1 : 0;
  p.zero_centered_gamma = zero_centered_gamma ? 1 : 0;
  p.current_scaling = current_scaling ? 1 : 0;
  BCHECK(!(out_t_auto && out_t_after), "engine: out_t_auto and out_t_after exclude each other");
  p.out_t_auto = out_t_after ? 2 : (out_t_auto ? 1 : 0);

  const c10::cuda::CUDAGuard guard(dev);
  const int sms = sm_count(dev.index());
  BCHECK(sms > 0, "engine: cannot read the multiprocessor count of device ", dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const engine_status st = engine_norm_fwd(&p, sms, static_cast<int>(sm_margin), stream);
  if (st != ENGINE_SUCCESS) return engine_failure(st, "norm_fwd");
  return {};
}

// An output from the caching allocator. A failed allocation becomes a message (no exception
// crosses the binding); an out-of-memory one starts with kOom, which engine/cuda_backend.py raises
// as torch.OutOfMemoryError, the type torch.empty raises.
constexpr const char* kOom = "engine: out of memory: ";

Msg alloc(Tensor& t, c10::IntArrayRef shape, const at::TensorOptions& opts) {
  try {
    t = at::empty(shape, opts);
  } catch (const c10::OutOfMemoryError& e) {
    return cat(kOom, e.what_without_backtrace());
  } catch (const std::exception& e) {
    return cat("engine: could not allocate an output: ", e.what());
  }
  return {};
}

Msg alloc(OptTensor& t, bool wanted, c10::IntArrayRef shape, const at::TensorOptions& opts) {
  if (!wanted) return {};
  Tensor a;
  BTRY(alloc(a, shape, opts));
  t = std::move(a);
  return {};
}

// norm_fwd with its outputs allocated here: out in out_dtype (x's dtype where it is None; an FP8
// dtype takes scale and amax, and makes scale_inv and, with columnwise, the transposed copy
// out_t [cols, rows]), residual_out in the residual's dtype, mu for LayerNorm, rsigma. One call
// from Python where allocating there took one per output (engine/_norm_ops.py: norm_fwd,
// norm_fwd_fp8; small shapes are host-bound). Returns (message, out, out_t, scale_inv,
// residual_out, mu, rsigma): "" and the outputs on success, the message and undefined tensors
// (None in Python) otherwise.
using FwdAlloc = std::tuple<Msg, Tensor, OptTensor, OptTensor, OptTensor, OptTensor, Tensor>;

Msg norm_fwd_alloc_into(FwdAlloc& r, const Tensor& x, const Tensor& weight, const OptTensor& bias,
                        const OptTensor& residual, double eps,
                        const std::optional<at::ScalarType>& out_dtype, const OptTensor& scale,
                        const OptTensor& amax, bool columnwise, bool is_rms_norm,
                        bool zero_centered_gamma, bool current_scaling, double amax_epsilon,
                        int64_t sm_margin, bool out_t_auto, bool out_t_after) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  const at::ScalarType odt = out_dtype.value_or(x.scalar_type());
  const bool fp8 = is_fp8(odt);
  BCHECK(fp8 || is_high_precision(odt), "engine: out_dtype must be float32, float16, bfloat16, "
         "float8_e4m3fn or float8_e5m2, got ", odt);
  BCHECK(fp8 || !columnwise, "engine: a transposed copy (columnwise) needs an FP8 out_dtype");
  const int64_t rows = x.size(0), cols = x.size(1);
  const at::TensorOptions opts = x.options();
  auto& [msg, out, out_t, scale_inv, res_out, mu, rsigma] = r;
  BTRY(alloc(out, {rows, cols}, opts.dtype(odt)));
  BTRY(alloc(out_t, columnwise, {cols, rows}, opts.dtype(odt)));
  BTRY(alloc(scale_inv, fp8, {1}, opts.dtype(at::kFloat)));
  BTRY(alloc(res_out, residual.has_value(), {rows, cols},
             opts.dtype(residual ? residual->scalar_type() : odt)));
  BTRY(alloc(mu, !is_rms_norm, {rows}, opts.dtype(at::kFloat)));
  BTRY(alloc(rsigma, {rows}, opts.dtype(at::kFloat)));
  return norm_fwd(x, weight, bias, residual, eps, out, res_out, mu, rsigma, scale, amax, scale_inv,
                  out_t, is_rms_norm, zero_centered_gamma, current_scaling, amax_epsilon, sm_margin,
                  out_t_auto, out_t_after);
}

FwdAlloc norm_fwd_alloc(const Tensor& x, const Tensor& weight, const OptTensor& bias,
                        const OptTensor& residual, double eps,
                        const std::optional<at::ScalarType>& out_dtype, const OptTensor& scale,
                        const OptTensor& amax, bool columnwise, bool is_rms_norm,
                        bool zero_centered_gamma, bool current_scaling, double amax_epsilon,
                        int64_t sm_margin, bool out_t_auto, bool out_t_after) {
  FwdAlloc r;
  Msg err = norm_fwd_alloc_into(r, x, weight, bias, residual, eps, out_dtype, scale, amax,
                                columnwise, is_rms_norm, zero_centered_gamma, current_scaling,
                                amax_epsilon, sm_margin, out_t_auto, out_t_after);
  if (!err.empty()) return FwdAlloc{std::move(err), Tensor(), {}, {}, {}, {}, Tensor()};
  return r;
}

Msg norm_bwd(const Tensor& dy, const Tensor& x, const OptTensor& mu, const Tensor& rsigma,
              const Tensor& weight, const OptTensor& dresidual, const Tensor& dx, const OptTensor& dres,
              const Tensor& dweight, const OptTensor& dbias, bool is_rms_norm,
              bool zero_centered_gamma, int64_t sm_margin) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  const at::Device dev = x.device();
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  const int64_t rows = x.size(0), cols = x.size(1);
  BCHECK(cols >= 1, "engine: x must have at least one column");
  BTRY(check_2d(x, "x", dev, rows, cols, false));
  BTRY(check_2d(dy, "dy", dev, rows, cols, false));
  BTRY(check_2d(dx, "dx", dev, rows, cols, true));
  BCHECK(is_high_precision(x.scalar_type()) && is_high_precision(dy.scalar_type()) &&
                  is_high_precision(dx.scalar_type()),
              "engine: x, dy and dx must be float32, float16 or bfloat16, got ", x.scalar_type(), ", ",
              dy.scalar_type(), ", ", dx.scalar_type());
  if (!is_rms_norm) {
    BCHECK(mu.has_value(), "engine: LayerNorm backward needs mu (float32 [rows])");
    BTRY(check_stats(*mu, "mu", dev, rows));
  }
  BTRY(check_stats(rsigma, "rsigma", dev, rows));
  BTRY(check_1d(weight, "weight", dev, cols));
  BTRY(check_1d(dweight, "dweight", dev, cols));
  BCHECK(is_high_precision(weight.scalar_type()), "engine: weight must be float32, float16 or "
              "bfloat16, got ", weight.scalar_type());
  BCHECK(dweight.scalar_type() == weight.scalar_type(), "engine: dweight dtype ",
              dweight.scalar_type(), " must match weight's (", weight.scalar_type(), ")");
  if (dbias) {
    BTRY(check_1d(*dbias, "dbias", dev, cols));
    BCHECK(dbias->scalar_type() == weight.scalar_type(), "engine: dbias dtype ",
                dbias->scalar_type(), " must match weight's (", weight.scalar_type(), ")");
  }
  at::ScalarType dres_type = x.scalar_type();
  if (dresidual) {
    BTRY(check_2d(*dresidual, "dresidual", dev, rows, cols, false));
    dres_type = dresidual->scalar_type();
  }
  if (dres) {
    BTRY(check_2d(*dres, "dres", dev, rows, cols, true));
    BCHECK(!dresidual || dres->scalar_type() == dresidual->scalar_type(), "engine: dres dtype ",
                dres->scalar_type(), " must match dresidual's (", dresidual->scalar_type(), ")");
    dres_type = dres->scalar_type();
  }
  BCHECK(is_high_precision(dres_type), "engine: dresidual / dres must be float32, float16 or "
              "bfloat16, got ", dres_type);
  BCHECK(sm_margin >= 0, "engine: sm_margin must be >= 0, got ", sm_margin);

  engine_norm_bwd_params p{};
  p.rows = rows;
  p.cols = cols;
  p.dy = dy.data_ptr();
  p.dy_dtype = to_engine(dy.scalar_type(), "dy");
  p.dy_row_stride = row_stride(dy);
  p.x = x.data_ptr();
  p.x_dtype = to_engine(x.scalar_type(), "x");
  p.x_row_stride = row_stride(x);
  p.mu = is_rms_norm ? nullptr : mu->data_ptr<float>();
  p.rsigma = rsigma.data_ptr<float>();
  p.weight = weight.data_ptr();
  p.weight_dtype = to_engine(weight.scalar_type(), "weight");
  p.dresidual = dresidual ? dresidual->data_ptr() : nullptr;
  p.dresidual_row_stride = dresidual ? row_stride(*dresidual) : cols;
  p.dx = dx.data_ptr();
  p.dx_dtype = to_engine(dx.scalar_type(), "dx");
  p.dx_row_stride = row_stride(dx);
  p.dres = dres ? dres->data_ptr() : nullptr;
  p.dres_dtype = to_engine(dres_type, "dres");
  p.dres_row_stride = dres ? row_stride(*dres) : cols;
  p.dweight = dweight.data_ptr();
  p.dbias = dbias ? dbias->data_ptr() : nullptr;
  p.is_rms_norm = is_rms_norm ? 1 : 0;
  p.zero_centered_gamma = zero_centered_gamma ? 1 : 0;

  const c10::cuda::CUDAGuard guard(dev);
  const int sms = sm_count(dev.index());
  BCHECK(sms > 0, "engine: cannot read the multiprocessor count of device ", dev.index());
  const int margin = static_cast<int>(sm_margin);
  const size_t ws_bytes =
      engine_norm_bwd_workspace_bytes(rows, cols, dbias ? 1 : 0, sms, margin);
  // Caching-allocator workspace: stream-ordered, no sync, capturable in a CUDA graph.
  Tensor ws;
  void* ws_ptr = nullptr;
  if (ws_bytes > 0) {
    try {  // the caching allocator may throw (out of memory): report, do not propagate
      ws = at::empty({static_cast<int64_t>(ws_bytes)}, x.options().dtype(at::kByte));
    } catch (const std::exception& e) {
      return std::string("engine: norm_bwd could not allocate its workspace: ") + e.what();
    }
    ws_ptr = ws.data_ptr();
  }
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const engine_status st = engine_norm_bwd(&p, sms, margin, ws_ptr, ws_bytes, stream);
  if (st != ENGINE_SUCCESS) return engine_failure(st, "norm_bwd");
  return {};
}

// norm_bwd with its outputs allocated here (dx in dx_dtype; dres in dres_dtype where it is given
// and differs from dx_dtype; dweight, and dbias with has_bias, in weight's dtype): one call from
// Python, as norm_fwd_alloc. Returns (message, dx, dres, dweight, dbias).
using BwdAlloc = std::tuple<Msg, Tensor, OptTensor, Tensor, OptTensor>;

Msg norm_bwd_alloc_into(BwdAlloc& r, const Tensor& dy, const Tensor& x, const OptTensor& mu,
                        const Tensor& rsigma, const Tensor& weight, const OptTensor& dresidual,
                        bool has_bias, at::ScalarType dx_dtype,
                        const std::optional<at::ScalarType>& dres_dtype, bool is_rms_norm,
                        bool zero_centered_gamma, int64_t sm_margin) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  BCHECK(is_high_precision(dx_dtype), "engine: dx must be float32, float16 or bfloat16, got ",
         dx_dtype);
  const int64_t rows = x.size(0), cols = x.size(1);
  const at::TensorOptions opts = x.options();
  auto& [msg, dx, dres, dweight, dbias] = r;
  BTRY(alloc(dx, {rows, cols}, opts.dtype(dx_dtype)));
  const bool two = dres_dtype.has_value() && *dres_dtype != dx_dtype;
  BTRY(alloc(dres, two, {rows, cols}, opts.dtype(dres_dtype.value_or(dx_dtype))));
  BTRY(alloc(dweight, {cols}, opts.dtype(weight.scalar_type())));
  BTRY(alloc(dbias, has_bias, {cols}, opts.dtype(weight.scalar_type())));
  return norm_bwd(dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias, is_rms_norm,
                  zero_centered_gamma, sm_margin);
}

BwdAlloc norm_bwd_alloc(const Tensor& dy, const Tensor& x, const OptTensor& mu,
                        const Tensor& rsigma, const Tensor& weight, const OptTensor& dresidual,
                        bool has_bias, at::ScalarType dx_dtype,
                        const std::optional<at::ScalarType>& dres_dtype, bool is_rms_norm,
                        bool zero_centered_gamma, int64_t sm_margin) {
  BwdAlloc r;
  Msg err = norm_bwd_alloc_into(r, dy, x, mu, rsigma, weight, dresidual, has_bias, dx_dtype,
                                dres_dtype, is_rms_norm, zero_centered_gamma, sm_margin);
  if (!err.empty()) return BwdAlloc{std::move(err), Tensor(), {}, Tensor(), {}};
  return r;
}

Msg cast_transpose(const Tensor& x, const Tensor& scale, const Tensor& amax, const Tensor& scale_inv,
                    const OptTensor& out, const OptTensor& out_t, bool current_scaling,
                    double amax_epsilon) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  const at::Device dev = x.device();
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  const int64_t rows = x.size(0), cols = x.size(1);
  BTRY(check_2d(x, "x", dev, rows, cols, false));
  BCHECK(is_high_precision(x.scalar_type()), "engine: x must be float32, float16 or bfloat16, got ",
              x.scalar_type());
  BCHECK(out.has_value() || out_t.has_value(), "engine: cast_transpose needs out, out_t or both");
  at::ScalarType fp8_type = out ? out->scalar_type() : out_t->scalar_type();
  BCHECK(is_fp8(fp8_type), "engine: cast_transpose outputs must be float8_e4m3fn or "
              "float8_e5m2, got ", fp8_type);
  engine_cast_transpose_params p{};
  if (out) {
    BTRY(check_2d(*out, "out", dev, rows, cols, true));
    p.out = out->data_ptr();
    p.out_row_stride = row_stride(*out);
  }
  if (out_t) {
    BTRY(check_on(*out_t, "out_t", dev));
    BCHECK(out_t->scalar_type() == fp8_type, "engine: out_t dtype ", out_t->scalar_type(),
                " must match out's (", fp8_type, ")");
    BCHECK(out_t->dim() == 2 && out_t->size(0) == cols && out_t->size(1) == rows &&
                    out_t->is_contiguous(),
                "engine: out_t must be a contiguous [", cols, ", ", rows, "] tensor, got ",
                out_t->sizes(), " with strides ", out_t->strides());
    p.out_t = out_t->data_ptr();
  }
  const OptTensor s(scale), a(amax), si(scale_inv);
  BTRY(check_meta(s, "scale", dev));
  BTRY(check_meta(a, "amax", dev));
  BTRY(check_meta(si, "scale_inv", dev));
  p.scale = scale.data_ptr<float>();
  p.amax = amax.data_ptr<float>();
  p.scale_inv = scale_inv.data_ptr<float>();
  // An empty input still does the scale bookkeeping: rows = 0 is the C API's no-data case.
  p.rows = cols == 0 ? 0 : rows;
  p.cols = cols == 0 ? 1 : cols;
  p.x = x.data_ptr();
  p.x_dtype = to_engine(x.scalar_type(), "x");
  p.x_row_stride = rows <= 1 ? p.cols : x.stride(0);
  p.out_dtype = to_engine(fp8_type, "out");
  p.amax_epsilon = static_cast<float>(amax_epsilon);
  p.current_scaling = current_scaling ? 1 : 0;

  const c10::cuda::CUDAGuard guard(dev);
  const int sms = sm_count(dev.index());
  BCHECK(sms > 0, "engine: cannot read the multiprocessor count of device ", dev.index());
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const engine_status st = engine_cast_transpose(&p, sms, stream);
  if (st != ENGINE_SUCCESS) return engine_failure(st, "cast_transpose");
  return {};
}

// cast_transpose with its outputs allocated here: out [rows, cols] with rowwise, out_t [cols,
// rows] with columnwise, both in fp8_dtype, and scale_inv. Returns (message, out, out_t,
// scale_inv), as norm_fwd_alloc.
using CastAlloc = std::tuple<Msg, OptTensor, OptTensor, Tensor>;

Msg cast_transpose_alloc_into(CastAlloc& r, const Tensor& x, const Tensor& scale,
                              const Tensor& amax, at::ScalarType fp8_dtype, bool rowwise,
                              bool columnwise, bool current_scaling, double amax_epsilon) {
  BCHECK(x.is_cuda(), "engine: x must be a CUDA tensor, got a tensor on ", x.device());
  BCHECK(x.dim() == 2, "engine: x must be 2-D [rows, cols], got shape ", x.sizes());
  BCHECK(is_fp8(fp8_dtype), "engine: cast_transpose outputs must be float8_e4m3fn or "
         "float8_e5m2, got ", fp8_dtype);
  const int64_t rows = x.size(0), cols = x.size(1);
  const at::TensorOptions opts = x.options();
  auto& [msg, out, out_t, scale_inv] = r;
  BTRY(alloc(out, rowwise, {rows, cols}, opts.dtype(fp8_dtype)));
  BTRY(alloc(out_t, columnwise, {cols, rows}, opts.dtype(fp8_dtype)));
  BTRY(alloc(scale_inv, {1}, opts.dtype(at::kFloat)));
  return cast_transpose(x, scale, amax, scale_inv, out, out_t, current_scaling, amax_epsilon);
}

CastAlloc cast_transpose_alloc(const Tensor& x, const Tensor& scale, const Tensor& amax,
                               at::ScalarType fp8_dtype, bool rowwise, bool columnwise,
                               bool current_scaling, double amax_epsilon) {
  CastAlloc r;
  Msg err = cast_transpose_alloc_into(r, x, scale, amax, fp8_dtype, rowwise, columnwise,
                                      current_scaling, amax_epsilon);
  if (!err.empty()) return CastAlloc{std::move(err), {}, {}, Tensor()};
  return r;
}

Msg fp8_transpose(const Tensor& data, const Tensor& out_t) {
  BCHECK(data.is_cuda(), "engine: data must be a CUDA tensor, got a tensor on ", data.device());
  const at::Device dev = data.device();
  BCHECK(data.dim() == 2, "engine: data must be 2-D [rows, cols], got shape ", data.sizes());
  const int64_t rows = data.size(0), cols = data.size(1);
  BTRY(check_2d(data, "data", dev, rows, cols, false));
  BCHECK(data.element_size() == 1, "engine: fp8_transpose needs a 1-byte dtype, got ",
              data.scalar_type());
  BTRY(check_on(out_t, "out_t", dev));
  BCHECK(out_t.scalar_type() == data.scalar_type(), "engine: out_t dtype ", out_t.scalar_type(),
              " must match data's (", data.scalar_type(), ")");
  BCHECK(out_t.dim() == 2 && out_t.size(0) == cols && out_t.size(1) == rows &&
                  out_t.is_contiguous(),
              "engine: out_t must be a contiguous [", cols, ", ", rows, "] tensor, got ",
              out_t.sizes(), " with strides ", out_t.strides());
  if (rows == 0 || cols == 0) return {};
  const c10::cuda::CUDAGuard guard(dev);
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream(dev.index()).stream();
  const engine_status st =
      engine_fp8_transpose(data.data_ptr(), rows, cols, row_stride(data), out_t.data_ptr(), stream);
  if (st != ENGINE_SUCCESS) return engine_failure(st, "fp8_transpose");
  return {};
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "engine CUDA kernels (norms with FP8 epilogue, cast-transpose); see engine/cuda_backend.py";
  namespace py = pybind11;
  using guard = py::call_guard<py::gil_scoped_release>;
  m.def("norm_fwd", &norm_fwd, "RMSNorm / LayerNorm forward (engine/reference.py:norm_fwd)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("residual"), py::arg("eps"),
        py::arg("out"), py::arg("residual_out"), py::arg("mu"), py::arg("rsigma"), py::arg("scale"),
        py::arg("amax"), py::arg("scale_inv"), py::arg("out_t"), py::arg("is_rms_norm"),
        py::arg("zero_centered_gamma"), py::arg("current_scaling"), py::arg("amax_epsilon"),
        py::arg("sm_margin"), py::arg("out_t_auto") = false, py::arg("out_t_after") = false,
        guard());
  m.def("norm_bwd", &norm_bwd, "RMSNorm / LayerNorm backward (engine/reference.py:norm_bwd)",
        py::arg("dy"), py::arg("x"), py::arg("mu"), py::arg("rsigma"), py::arg("weight"),
        py::arg("dresidual"), py::arg("dx"), py::arg("dres"), py::arg("dweight"), py::arg("dbias"),
        py::arg("is_rms_norm"), py::arg("zero_centered_gamma"), py::arg("sm_margin"), guard());
  m.def("norm_fwd_alloc", &norm_fwd_alloc,
        "norm_fwd with its outputs allocated: (message, out, out_t, scale_inv, residual_out, mu, "
        "rsigma)",
        py::arg("x"), py::arg("weight"), py::arg("bias"), py::arg("residual"), py::arg("eps"),
        py::arg("out_dtype"), py::arg("scale"), py::arg("amax"), py::arg("columnwise"),
        py::arg("is_rms_norm"), py::arg("zero_centered_gamma"), py::arg("current_scaling"),
        py::arg("amax_epsilon"), py::arg("sm_margin"), py::arg("out_t_auto"),
        py::arg("out_t_after"), guard());
  m.def("norm_bwd_alloc", &norm_bwd_alloc,
        "norm_bwd with its outputs allocated: (message, dx, dres, dweight, dbias)",
        py::arg("dy"), py::arg("x"), py::arg("mu"), py::arg("rsigma"), py::arg("weight"),
        py::arg("dresidual"), py::arg("has_bias"), py::arg("dx_dtype"), py::arg("dres_dtype"),
        py::arg("is_rms_norm"), py::arg("zero_centered_gamma"), py::arg("sm_margin"), guard());
  m.def("cast_transpose", &cast_transpose,
        "FP8 cast with fused amax and optional transpose (engine/reference.py:cast_transpose)",
        py::arg("x"), py::arg("scale"), py::arg("amax"), py::arg("scale_inv"), py::arg("out"),
        py::arg("out_t"), py::arg("current_scaling"), py::arg("amax_epsilon"), guard());
  m.def("cast_transpose_alloc", &cast_transpose_alloc,
        "cast_transpose with its outputs allocated: (message, out, out_t, scale_inv)",
        py::arg("x"), py::arg("scale"), py::arg("amax"), py::arg("fp8_dtype"), py::arg("rowwise"),
        py::arg("columnwise"), py::arg("current_scaling"), py::arg("amax_epsilon"), guard());
  m.def("fp8_transpose", &fp8_transpose, "Tiled byte transpose (engine/reference.py:fp8_transpose)",
        py::arg("data"), py::arg("out_t"), guard());
  m.def("set_max_cluster_size", &engine_set_max_cluster_size,
        "Largest thread-block cluster a row may be split over (engine/csrc/include/engine/common.h); "
        "returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_bwd_elems", &engine_set_norm_bwd_elems,
        "Values per thread of the norm backward's register path, 0 for the default "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_bwd_reduce_vec", &engine_set_norm_bwd_reduce_vec,
        "Columns per thread of the norm backward's dweight / dbias reduction (1 or 4), 0 for the "
        "default (engine/csrc/include/engine/common.h); returns the previous value, -1 for an "
        "invalid n",
        py::arg("n"));
  m.def("set_norm_bwd_cta_threads", &engine_set_norm_bwd_cta_threads,
        "One-CTA layouts of the norm backward's register path for 16-bit rows (1024, 512, 256: "
        "none), 0 for the default (engine/csrc/include/engine/common.h); returns the previous "
        "value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_vectors", &engine_set_norm_fwd_vectors,
        "Vectors of x per thread of the norm forward's register path, 0 for the default "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_blocked_from", &engine_set_norm_fwd_blocked_from,
        "Row width from which the norm forward takes its blocked kernel (0: the default; "
        "engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_grid_per_sm", &engine_set_norm_fwd_grid_per_sm,
        "CTAs per SM of the norm forward's register path without a cluster (1..64), 0 for the "
        "default (engine/csrc/include/engine/common.h); returns the previous value, -1 for an "
        "invalid n",
        py::arg("n"));
  m.def("set_norm_bwd_stream_from", &engine_set_norm_bwd_stream_from,
        "Row width from which the norm backward takes its streamed cluster kernel (0: the "
        "default; engine/csrc/include/engine/common.h); returns the previous value, -1 for an "
        "invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_stream_from", &engine_set_norm_fwd_stream_from,
        "Row width from which the norm forward takes its streamed cluster kernel (0: the "
        "default; engine/csrc/include/engine/common.h); returns the previous value, -1 for an "
        "invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_stream_threads", &engine_set_norm_fwd_stream_threads,
        "Largest CTA of the norm forward's streamed kernel (128, 256, 512), 0 for the default "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_band", &engine_set_norm_fwd_band,
        "The norm forward's band kernel for an FP8 output with its transposed copy: 1 never, 2-4 "
        "one configuration wherever its cluster fits (2 / 3: 32 x 512 per CTA, tiles of their own "
        "/ the tile in the stage; 4: 32 x 1024), 0 for the default "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_blocked_shape", &engine_set_norm_fwd_blocked_shape,
        "The norm forward's blocked kernel on residual rows of a 16-bit x to a non-FP8 output: 1 "
        "four vectors per thread on the resident grid, 2 two vectors per thread, 3 the same on 32 "
        "CTAs per SM, 4 four vectors on 32 CTAs per SM, 0 for the default, by width "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_lean", &engine_set_norm_fwd_lean,
        "The norm forward's lean kernel (16-bit x, no residual, non-FP8 output, rows of 8192 or "
        "16384 columns): 1 never, 0 for the default, wherever it applies "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_fp8_lean", &engine_set_norm_fwd_fp8_lean,
        "The norm forward's lean FP8 kernel (16-bit x, no residual, FP8 output in delayed scaling): "
        "0 (the default) at its measured widths, 1 never, 2 every width it fits "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_fp8_transpose_order", &engine_set_fp8_transpose_order,
        "The tile order of the tiled FP8 transpose: 1 first rows first, 2 last rows first with "
        "streaming stores, 0 for the default (engine/csrc/include/engine/common.h); returns the "
        "previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_dram_class", &engine_set_dram_class,
        "The card class whose launch defaults the norm launchers take: 1 lean DRAM bandwidth per "
        "SM (the H100), 2 wide (the H200), 0 for the device's own (engine/csrc/include/engine/"
        "common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("dram_class", []() {
          const int c = engine_dram_class();
          if (c < 0) throw std::runtime_error(std::string("dram_class: ") + engine_last_error());
          return c;
        },
        "The card class the current device's launches take now: 1 lean, 2 wide");
  m.def("set_norm_bwd_stream_threads", &engine_set_norm_bwd_stream_threads,
        "Largest CTA of the norm backward's streamed kernel (128, 256, 512), 0 for the default "
        "(engine/csrc/include/engine/common.h); returns the previous value, -1 for an invalid n",
        py::arg("n"));
  m.def("set_norm_fwd_general_loop", &engine_set_norm_fwd_general_loop,
        "1: the norm forward's register kernels run their general row loop for every launch, 0 "
        "(the default): the fast FP8 loop where it applies (engine/csrc/include/engine/common.h); "
        "returns the previous value, -1 for an invalid n",
        py::arg("n"));
}
