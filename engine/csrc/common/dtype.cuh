/*
 * Element types and conversions (device side).
 *
 * Kernels are templated on the C++ storage types float, __half and __nv_bfloat16, plus the tag
 * `fp8` for FP8 outputs whose format (e4m3 or e5m2) is a run-time flag: the conversion is one
 * `cvt.rn.satfinite.{e4m3,e5m2}x2.f32` either way, so one instantiation serves both formats.
 * All conversions are explicit intrinsics (the torch build defines __CUDA_NO_HALF_CONVERSIONS__
 * and friends). Rounding: float -> half / bfloat16 round to nearest even; float -> FP8 rounds to
 * nearest even and saturates to the format's finite range (__NV_SATFINITE), NaN stays NaN.
 */
#ifndef ENGINE_CSRC_COMMON_DTYPE_CUH_
#define ENGINE_CSRC_COMMON_DTYPE_CUH_

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <stdint.h>

#include "engine/common.h"

namespace engine {

/* Tag type for FP8 storage (1 byte); the format travels as a run-time flag. */
struct fp8 {
  uint8_t bits;
};

template <typename T>
struct TypeInfo;
template <>
struct TypeInfo<float> {
  static constexpr engine_dtype dtype = ENGINE_DTYPE_FLOAT32;
};
template <>
struct TypeInfo<__half> {
  static constexpr engine_dtype dtype = ENGINE_DTYPE_FLOAT16;
};
template <>
struct TypeInfo<__nv_bfloat16> {
  static constexpr engine_dtype dtype = ENGINE_DTYPE_BFLOAT16;
};
template <>
struct TypeInfo<fp8> {
  static constexpr engine_dtype dtype = ENGINE_DTYPE_FLOAT8_E4M3; /* or E5M2, run-time */
};

template <typename T>
constexpr bool is_fp8_v = false;
template <>
constexpr bool is_fp8_v<fp8> = true;

inline int dtype_size(engine_dtype t) {
  switch (t) {
    case ENGINE_DTYPE_FLOAT32: return 4;
    case ENGINE_DTYPE_FLOAT16:
    case ENGINE_DTYPE_BFLOAT16: return 2;
    case ENGINE_DTYPE_FLOAT8_E4M3:
    case ENGINE_DTYPE_FLOAT8_E5M2: return 1;
  }
  return 0;
}
inline bool is_high_precision(engine_dtype t) {
  return t == ENGINE_DTYPE_FLOAT32 || t == ENGINE_DTYPE_FLOAT16 || t == ENGINE_DTYPE_BFLOAT16;
}
inline bool is_fp8_dtype(engine_dtype t) {
  return t == ENGINE_DTYPE_FLOAT8_E4M3 || t == ENGINE_DTYPE_FLOAT8_E5M2;
}
inline float fp8_max_of(engine_dtype t) { return t == ENGINE_DTYPE_FLOAT8_E5M2 ? 57344.0f : 448.0f; }

/* ---- scalar conversions ------------------------------------------------------------------- */

__device__ __forceinline__ float to_float(float v) { return v; }
__device__ __forceinline__ float to_float(__half v) { return __half2float(v); }
__device__ __forceinline__ float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <typename T>
__device__ __forceinline__ T from_float(float v);
template <>
__device__ __forceinline__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __forceinline__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __forceinline__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

/* v rounded to T and back: the value a T store followed by a load would give. */
template <typename T>
__device__ __forceinline__ float round_to(float v) {
  return to_float(from_float<T>(v));
}

__device__ __forceinline__ uint8_t fp8_from_float(float v, bool e5m2) {
  return (uint8_t)__nv_cvt_float_to_fp8(v, __NV_SATFINITE, e5m2 ? __NV_E5M2 : __NV_E4M3);
}
/* Two values into one 16-bit word: `a` in the low byte. */
__device__ __forceinline__ uint32_t fp8x2_from_float(float a, float b, bool e5m2) {
  return (uint32_t)__nv_cvt_float2_to_fp8x2(make_float2(a, b), __NV_SATFINITE,
                                            e5m2 ? __NV_E5M2 : __NV_E4M3);
}

/* ---- 32-bit word <-> pairs of 16-bit values (little-endian: element 0 in the low half) ------ */

template <typename T>
__device__ __forceinline__ float2 word_to_float2(uint32_t w);
template <>
__device__ __forceinline__ float2 word_to_float2<__half>(uint32_t w) {
  __half2 h = *reinterpret_cast<const __half2*>(&w);
  return __half22float2(h);
}
template <>
__device__ __forceinline__ float2 word_to_float2<__nv_bfloat16>(uint32_t w) {
  return make_float2(__uint_as_float(w << 16), __uint_as_float(w & 0xffff0000u));
}

template <typename T>
__device__ __forceinline__ uint32_t float2_to_word(float a, float b);
template <>
__device__ __forceinline__ uint32_t float2_to_word<__half>(float a, float b) {
  __half2 h = __floats2half2_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}
template <>
__device__ __forceinline__ uint32_t float2_to_word<__nv_bfloat16>(float a, float b) {
  __nv_bfloat162 h = __floats2bfloat162_rn(a, b);
  return *reinterpret_cast<const uint32_t*>(&h);
}

/* ---- FP8 scaling helpers -------------------------------------------------------------------- */

/* Current-scaling scale: fp8_max / max(amax, eps), or 1 when that is not a positive finite number
 * (amax NaN stays NaN through the clamp, as torch.clamp does, and then yields 1). One correctly
 * rounded fp32 division (nvcc's default -prec-div=true), as the Triton kernels and
 * engine.reference.compute_scale do. */
__host__ __device__ __forceinline__ float compute_scale(float amax, float fp8_max, float amax_eps) {
  const float a = (amax < amax_eps) ? amax_eps : amax;
  const float s = fp8_max / a;
  bool ok = (a > 0.0f) && (s > 0.0f) && (s <= 3.402823466e38f); /* false for NaN / inf */
  return ok ? s : 1.0f;
}

/* |y| as an int for max-reductions and atomicMax on a non-negative float's bits: monotone for
 * non-negative floats, and NaN (sign cleared) compares above +inf, so a NaN propagates. */
__device__ __forceinline__ int abs_bits(float y) { return (int)(__float_as_uint(y) & 0x7fffffffu); }

/* max(m, |y|) for a running amax m >= 0 (or NaN) that propagates NaN as abs_bits does: one
 * FMNMX.NAN with an |y| operand on sm_80+ (max.NaN.f32), where the int form takes a LOP3 and half
 * a 3-way IMNMX per value. The running value then feeds block_amax_atomic. */
__device__ __forceinline__ float amax_update(float m, float y) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  float r;
  asm("max.NaN.f32 %0, %1, %2;" : "=f"(r) : "f"(m), "f"(fabsf(y)));
  return r;
#else
  return __int_as_float(max(abs_bits(m), abs_bits(y)));
#endif
}

}  // namespace engine

#endif  // ENGINE_CSRC_COMMON_DTYPE_CUH_
