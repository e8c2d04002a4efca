/*
 * Vectorised global / shared memory access of N consecutive elements, converted to / from float.
 *
 * An access of N elements of T moves B = N * sizeof(T) bytes with the widest aligned instructions:
 * B >= 16 -> B / 16 x 128-bit (LDG.E.128 / STG.E.128), B = 8 -> 64-bit, B = 4 -> 32-bit; N = 1 is a
 * plain scalar access. The caller guarantees min(16, B)-byte alignment (the launchers check
 * pointers and row strides with vec_ok() and fall back to N = 1 otherwise).
 *
 * Plain (coherent) loads on purpose: some inputs are written earlier in the same kernel (the
 * blocked norm re-reads residual_out), and in-place use (out aliasing x) must stay correct, so
 * the non-coherent read-only path (ld.global.nc) is not used (but by load_words_nc, for the
 * operands it names).
 */
#ifndef ENGINE_CSRC_COMMON_VEC_CUH_
#define ENGINE_CSRC_COMMON_VEC_CUH_

#include <stdint.h>

#include <type_traits>

#include "common/dtype.cuh"

namespace engine {

/* ---- raw words ---------------------------------------------------------------------------- */

template <int B>
__device__ __forceinline__ void load_words(const void* p, uint32_t (&w)[B / 4]) {
  static_assert(B % 4 == 0 && B >= 4, "vector access must be a multiple of 4 bytes");
  if constexpr (B >= 16) {
    static_assert(B % 16 == 0, "wide vector access must be a multiple of 16 bytes");
#pragma unroll
    for (int k = 0; k < B / 16; ++k) {
      const uint4 v = reinterpret_cast<const uint4*>(p)[k];
      w[4 * k + 0] = v.x;
      w[4 * k + 1] = v.y;
      w[4 * k + 2] = v.z;
      w[4 * k + 3] = v.w;
    }
  } else if constexpr (B == 8) {
    const uint2 v = *reinterpret_cast<const uint2*>(p);
    w[0] = v.x;
    w[1] = v.y;
  } else {
    w[0] = *reinterpret_cast<const uint32_t*>(p);
  }
}

/* load_words of B = 16 k bytes through the non-coherent read-only path (ld.global.nc): only for
 * operands that no thread writes while the kernel runs and that no output of the kernel aliases
 * (the lean FP8 forward's 16-bit x, gamma and beta: its FP8 output cannot alias them). See the
 * header comment for why the others keep plain loads; NOTES Q75b for what the path changes. */
template <int B>
__device__ __forceinline__ void load_words_nc(const void* p, uint32_t (&w)[B / 4]) {
  static_assert(B % 16 == 0 && B >= 16, "read-only vector access of a multiple of 16 bytes");
#pragma unroll
  for (int k = 0; k < B / 16; ++k) {
    const uint4 v = __ldg(reinterpret_cast<const uint4*>(p) + k);
    w[4 * k + 0] = v.x;
    w[4 * k + 1] = v.y;
    w[4 * k + 2] = v.z;
    w[4 * k + 3] = v.w;
  }
}

/* d = w through opaque moves (one `mov.b32` each, inline PTX): a register prefetch's copy into
 * the registers the loop reads. ptxas gives the loop's loads and the loads before the loop one
 * scoreboard; where the loop read the loaded registers themselves, their first use in the loop
 * waited for the prefetch issued at its top as well (NOTES Q75c, Q76b). The copies keep separate
 * registers, so the wait stays at the copy, after the row's work. */
template <int K>
__device__ __forceinline__ void copy_words_opaque(uint32_t (&d)[K], const uint32_t (&w)[K]) {
#pragma unroll
  for (int k = 0; k < K; ++k) asm("mov.b32 %0, %1;" : "=r"(d[k]) : "r"(w[k]));
}

template <int B>
__device__ __forceinline__ void store_words(void* p, const uint32_t (&w)[B / 4]) {
  static_assert(B % 4 == 0 && B >= 4, "vector access must be a multiple of 4 bytes");
  if constexpr (B >= 16) {
    static_assert(B % 16 == 0, "wide vector access must be a multiple of 16 bytes");
#pragma unroll
    for (int k = 0; k < B / 16; ++k) {
      reinterpret_cast<uint4*>(p)[k] = make_uint4(w[4 * k], w[4 * k + 1], w[4 * k + 2], w[4 * k + 3]);
    }
  } else if constexpr (B == 8) {
    *reinterpret_cast<uint2*>(p) = make_uint2(w[0], w[1]);
  } else {
    *reinterpret_cast<uint32_t*>(p) = w[0];
  }
}

/* store_words as one vector store per 16 (or 8) bytes, whatever NVVM can prove of p's alignment
 * (the caller guarantees it, as for store_words): a plain (weak) st.global.v4.b32 / .v2.b32 in
 * inline PTX. The blocked forward's 16-bit y stored through store_words became four
 * st.global.u32 per 16 bytes: NVVM took the uint4 apart into its fields and, with p an O* of
 * 2-byte alignment, did not join them again (NOTES P124; ci/check_ptx_stores.py checks the PTX).
 * __builtin_assume_aligned did not join them either, and __stwb compiled to STG.E.128.STRONG.SM.
 * The asm has a memory clobber: the compiler moves no other memory access across it, as it moved
 * none across a store it could not tell apart from a later load anyway. */
template <int B>
__device__ __forceinline__ void store_words_v(void* p, const uint32_t (&w)[B / 4]) {
  static_assert(B == 8 || (B >= 16 && B % 16 == 0), "8 bytes or whole 16-byte vectors");
  if constexpr (B >= 16) {
#pragma unroll
    for (int k = 0; k < B / 16; ++k) {
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"(static_cast<uint4*>(p) + k),
                   "r"(w[4 * k]), "r"(w[4 * k + 1]), "r"(w[4 * k + 2]), "r"(w[4 * k + 3])
                   : "memory");
    }
  } else {
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]) : "memory");
  }
}

/* ---- typed vectors of N elements <-> float[N] --------------------------------------------- */

template <typename T, int N>
__device__ __forceinline__ void load_vec(const T* p, float (&f)[N]) {
  if constexpr (N == 1) {
    f[0] = to_float(p[0]);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t w[N];
    load_words<4 * N>(p, w);
#pragma unroll
    for (int i = 0; i < N; ++i) f[i] = __uint_as_float(w[i]);
  } else {
    static_assert(sizeof(T) == 2 && N % 2 == 0, "16-bit vectors hold an even number of elements");
    uint32_t w[N / 2];
    load_words<2 * N>(p, w);
#pragma unroll
    for (int i = 0; i < N / 2; ++i) {
      const float2 v = word_to_float2<T>(w[i]);
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

template <typename T, int N>
__device__ __forceinline__ void store_vec(T* p, const float (&f)[N]) {
  if constexpr (N == 1) {
    p[0] = from_float<T>(f[0]);
  } else if constexpr (sizeof(T) == 4) {
    uint32_t w[N];
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __float_as_uint(f[i]);
    store_words<4 * N>(p, w);
  } else {
    static_assert(sizeof(T) == 2 && N % 2 == 0, "16-bit vectors hold an even number of elements");
    uint32_t w[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = float2_to_word<T>(f[2 * i], f[2 * i + 1]);
    store_words<2 * N>(p, w);
  }
}

/* Packed register storage of N elements of T (16-bit values two to a word): halves the registers
 * a row keeps live for 16-bit data. pack_to rounds to T; unpack_at(j) needs a compile-time j
 * (inside unrolled loops) so that the words stay in registers. */
template <typename T, int N>
struct PackedWords {
  static constexpr int kWords = N * (int)sizeof(T) / 4;
  static_assert(N * sizeof(T) % 4 == 0, "packed storage needs whole 32-bit words");
};

template <typename T, int N>
__device__ __forceinline__ void pack_to(const float (&f)[N], uint32_t (&w)[PackedWords<T, N>::kWords]) {
  if constexpr (sizeof(T) == 4) {
#pragma unroll
    for (int i = 0; i < N; ++i) w[i] = __float_as_uint(f[i]);
  } else {
#pragma unroll
    for (int i = 0; i < N / 2; ++i) w[i] = float2_to_word<T>(f[2 * i], f[2 * i + 1]);
  }
}

template <typename T, int N>
__device__ __forceinline__ float unpack_at(const uint32_t (&w)[PackedWords<T, N>::kWords], int j) {
  if constexpr (sizeof(T) == 4) {
    return __uint_as_float(w[j]);
  } else if constexpr (std::is_same<T, __nv_bfloat16>::value) {
    const uint32_t v = w[j >> 1];
    return __uint_as_float((j & 1) ? (v & 0xffff0000u) : (v << 16));
  } else {
    const uint32_t v = w[j >> 1];
    return __half2float(__ushort_as_half((unsigned short)((j & 1) ? (v >> 16) : (v & 0xffffu))));
  }
}

/* N floats -> N FP8 bytes packed little-endian into words (N a multiple of 4), one format. */
template <int N, __nv_fp8_interpretation_t kFmt>
__device__ __forceinline__ void pack_fp8_fmt(const float (&f)[N], uint32_t (&w)[N / 4]) {
  static_assert(N % 4 == 0, "FP8 packing works on groups of 4");
#pragma unroll
  for (int i = 0; i < N / 4; ++i) {
    const uint32_t lo = __nv_cvt_float2_to_fp8x2(make_float2(f[4 * i], f[4 * i + 1]), __NV_SATFINITE, kFmt);
    const uint32_t hi = __nv_cvt_float2_to_fp8x2(make_float2(f[4 * i + 2], f[4 * i + 3]), __NV_SATFINITE, kFmt);
    w[i] = lo | (hi << 16);
  }
}

/* The same with the format a run-time flag: one uniform branch per call rather than one per pair
 * (the interpretation argument of the intrinsic is otherwise a run-time value per conversion). */
template <int N>
__device__ __forceinline__ void pack_fp8(const float (&f)[N], bool e5m2, uint32_t (&w)[N / 4]) {
  if (e5m2) {
    pack_fp8_fmt<N, __NV_E5M2>(f, w);
  } else {
    pack_fp8_fmt<N, __NV_E4M3>(f, w);
  }
}

/* Loads of a run-time dtype (weights, and the rarer streams whose dtype is a run-time switch):
 * one uniform branch per vector. */
template <int N>
__device__ __forceinline__ void load_vec_dt(const void* p, int64_t idx, engine_dtype dt,
                                            float (&f)[N]) {
  if (dt == ENGINE_DTYPE_FLOAT32) {
    load_vec<float, N>(static_cast<const float*>(p) + idx, f);
  } else if (dt == ENGINE_DTYPE_BFLOAT16) {
    load_vec<__nv_bfloat16, N>(static_cast<const __nv_bfloat16*>(p) + idx, f);
  } else {
    load_vec<__half, N>(static_cast<const __half*>(p) + idx, f);
  }
}

template <int N>
__device__ __forceinline__ void store_vec_dt(void* p, int64_t idx, engine_dtype dt,
                                             const float (&f)[N]) {
  if (dt == ENGINE_DTYPE_FLOAT32) {
    store_vec<float, N>(static_cast<float*>(p) + idx, f);
  } else if (dt == ENGINE_DTYPE_BFLOAT16) {
    store_vec<__nv_bfloat16, N>(static_cast<__nv_bfloat16*>(p) + idx, f);
  } else {
    store_vec<__half, N>(static_cast<__half*>(p) + idx, f);
  }
}

__device__ __forceinline__ float load_scalar_dt(const void* p, int64_t idx, engine_dtype dt) {
  if (dt == ENGINE_DTYPE_FLOAT32) return static_cast<const float*>(p)[idx];
  if (dt == ENGINE_DTYPE_BFLOAT16) return to_float(static_cast<const __nv_bfloat16*>(p)[idx]);
  return to_float(static_cast<const __half*>(p)[idx]);
}

/* ---- asynchronous copies global -> shared (cp.async, sm_80+) ------------------------------ */

/* Copy 16 bytes from global `src` to shared-memory address `dst` (a __cvta_generic_to_shared
 * value) without passing through registers; with full == false nothing is read (src need only be
 * a valid address) and the 16 bytes are zero-filled. Bypasses L1 (.cg). Completion is per thread:
 * cp_async_commit() closes a group of this thread's copies, cp_async_wait<N>() returns once at
 * most N of its groups are still in flight; a thread reading only what it copied itself needs no
 * other synchronisation. */
__device__ __forceinline__ void cp_async16(uint32_t dst, const void* src, bool full) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(src),
               "r"(full ? 16 : 0)
               : "memory");
#elif defined(__CUDA_ARCH__)
  __trap();
#endif
}
__device__ __forceinline__ void cp_async_commit() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.commit_group;" ::: "memory");
#endif
}
template <int N>
__device__ __forceinline__ void cp_async_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory");
#endif
}

/* Store B bytes of words to global `p` (min(16, B)-byte aligned) where `pred` holds: one
 * predicated instruction per 16 bytes. A store under a C++ `if` let the compiler sink the
 * address arithmetic into each branch, once per vector (NOTES P58). */
template <int B>
__device__ __forceinline__ void store_words_if(void* p, const uint32_t (&w)[B / 4], bool pred) {
  static_assert(B == 8 || B % 16 == 0, "predicated stores of 8 bytes or whole 16-byte vectors");
#if defined(__CUDA_ARCH__)
  if constexpr (B == 8) {
    asm volatile("{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %3, 0;\n\t@p st.global.v2.b32 [%0], {%1, %2};\n\t}"
                 ::"l"(p), "r"(w[0]), "r"(w[1]), "r"((int)pred));
  } else {
#pragma unroll
    for (int k = 0; k < B / 16; ++k) {
      asm volatile(
          "{\n\t.reg .pred p;\n\tsetp.ne.b32 p, %5, 0;\n\t@p st.global.v4.b32 [%0], {%1, %2, %3, %4};\n\t}"
          ::"l"(static_cast<uint8_t*>(p) + 16 * k), "r"(w[4 * k]), "r"(w[4 * k + 1]), "r"(w[4 * k + 2]),
          "r"(w[4 * k + 3]), "r"((int)pred));
    }
  }
#else
  (void)p, (void)w, (void)pred;
#endif
}

/* Eight 16-bit values (16 bytes) at shared-memory address `addr` (a __cvta_generic_to_shared
 * value, 16-byte aligned), as floats. The address is a 32-bit shared-window offset that the
 * caller keeps in a register, so a loop over a thread's slots costs one add per vector (a generic
 * pointer into dynamic shared memory was re-derived per access from the CTA's cluster id: 8-10
 * instructions per vector in the streamed kernels, NOTES P58). Volatile: it stays behind the
 * cp.async waits (volatile asm with a memory clobber) that make its bytes visible. */
template <typename T>
__device__ __forceinline__ void lds_vec8(uint32_t addr, float (&f)[8]) {
  static_assert(sizeof(T) == 2, "lds_vec8 reads 16-bit values");
#if defined(__CUDA_ARCH__)
  uint32_t w[4];
  asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
               : "=r"(w[0]), "=r"(w[1]), "=r"(w[2]), "=r"(w[3])
               : "r"(addr));
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    const float2 v = word_to_float2<T>(w[i]);
    f[2 * i] = v.x;
    f[2 * i + 1] = v.y;
  }
#else
  (void)addr, (void)f;
#endif
}

/* Store four words (16 bytes) to shared-memory address `addr` (as lds_vec8's, 16-byte aligned).
 * Volatile with a memory clobber, so that it stays ordered with lds_vec8's reads of the same
 * bytes and with the cp.async waits. */
__device__ __forceinline__ void sts_words16(uint32_t addr, const uint32_t (&w)[4]) {
#if defined(__CUDA_ARCH__)
  asm volatile("st.shared.v4.b32 [%0], {%1, %2, %3, %4};" ::"r"(addr), "r"(w[0]), "r"(w[1]), "r"(w[2]),
               "r"(w[3])
               : "memory");
#else
  (void)addr, (void)w;
#endif
}

}  // namespace engine

#endif  // ENGINE_CSRC_COMMON_VEC_CUH_
