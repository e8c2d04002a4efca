/*
 * Transposed store of a byte tile staged in shared memory (FP8 data), used by the norm's in-kernel
 * transposed output, cast_transpose and fp8_transpose.
 *
 * A thread takes a work item (h, q): rows [16h, 16h + 16) and columns [4q, 4q + 4) of the tile. It
 * reads 16 32-bit words (one per row; consecutive lanes take consecutive q, so a warp reads 32
 * consecutive words of one tile row: no bank conflicts whatever the pitch), transposes the 16x4
 * bytes in registers with __byte_perm, and writes four 16-byte runs, one per column, each a
 * contiguous piece of an output row. With a 32-row tile two lanes complete one 32-byte sector.
 * Tails (fewer than 16 valid rows) and an output whose runs are not 16-byte aligned (ld, the
 * copy's row length M, not a multiple of 16) fall back to byte stores of the valid bytes only,
 * except with kNarrow (the tiled transposes' kernels for such an output): there the tile goes out
 * in pieces of the widest width g that divides every run's address (8, 4 or 2 bytes, the lowest
 * set bit of the output's address, ld and r0; run_align), a warp's lanes taking consecutive pieces
 * of the same output rows (store_tile_pieces), bytes where M is odd.
 */
#ifndef ENGINE_CSRC_COMMON_TILE_CUH_
#define ENGINE_CSRC_COMMON_TILE_CUH_

#include <stdint.h>

namespace engine {

/* 4x4 byte transpose: o_j holds byte j of a0..a3 (a0's in the low byte). */
__device__ __forceinline__ void transpose4x4_bytes(uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                                   uint32_t& o0, uint32_t& o1, uint32_t& o2,
                                                   uint32_t& o3) {
  const uint32_t t0 = __byte_perm(a0, a1, 0x5140); /* a0.b0 a1.b0 a0.b1 a1.b1 */
  const uint32_t t1 = __byte_perm(a0, a1, 0x7362); /* a0.b2 a1.b2 a0.b3 a1.b3 */
  const uint32_t t2 = __byte_perm(a2, a3, 0x5140);
  const uint32_t t3 = __byte_perm(a2, a3, 0x7362);
  o0 = __byte_perm(t0, t2, 0x5410); /* a0.b0 a1.b0 a2.b0 a3.b0 */
  o1 = __byte_perm(t0, t2, 0x7632);
  o2 = __byte_perm(t1, t3, 0x5410);
  o3 = __byte_perm(t1, t3, 0x7632);
}

/* One store of v at p, streaming (st.global.cs) with kStream. */
template <bool kStream, typename T>
__device__ __forceinline__ void store_as(T* p, T v) {
  if constexpr (kStream) {
    __stcs(p, v);
  } else {
    *p = v;
  }
}

/* The alignment of every 16-row run that store_tile_transposed writes at dst (row length ld, first
 * row r0): the lowest set bit of the three and 16, so 1, 2, 4, 8 or 16. */
__host__ __device__ __forceinline__ int run_align(const void* dst, int64_t ld, int64_t r0) {
  const uint64_t bits =
      (uint64_t)reinterpret_cast<uintptr_t>(dst) | (uint64_t)ld | (uint64_t)r0 | 16u;
  return (int)(bits & (~bits + 1u));
}

/* Whether a transposed copy at dst of ld bytes per row takes the tiled transposes' kNarrow form:
 * its runs are not 16-byte aligned but at least 2-byte aligned (run_align; every tile starts at a
 * multiple of 16 rows). The norm forward sends such a copy to the tiled transpose after the norm
 * under out_t_auto (NOTES P135): the in-kernel copies write it in bytes. */
inline bool narrow_runs(const void* dst, int64_t ld) {
  const int g = run_align(dst, ld, 0);
  return dst != nullptr && g > 1 && g < 16;
}

/*
 * kNarrow's form of store_tile_transposed for runs aligned to G = 2, 4 or 8 bytes (NOTES P136):
 * an item is the G x W block of tile rows [G p, G p + G) and columns [W v, W v + W), W = 32 / G
 * (every item loads 8 words: two 16-byte, four 8-byte or eight 4-byte loads of shared memory),
 * and writes W pieces of G bytes, one per column. p varies fastest across threads, so the lanes of
 * a warp write consecutive pieces of the same output rows: one store instruction covers 64
 * contiguous bytes of one row (G = 2), of two (G = 4) or of four (G = 8), where the 16-row runs'
 * stores in g-byte parts (P134) had a warp write g bytes in each of 32 runs of 8 rows. Needs
 * nr % G == 0 (G divides M and r0), pitch % 16 == 0 and pitch >= round_up(nc, W).
 */
template <bool kStream, int G>
__device__ __forceinline__ void store_tile_pieces(const uint8_t* tile, int pitch, int nr, int nc,
                                                  uint8_t* dst, int64_t ld, int64_t r0, int64_t c0,
                                                  int tid, int nthreads) {
  static_assert(G == 2 || G == 4 || G == 8, "pieces of 2, 4 or 8 bytes");
  constexpr int W = 32 / G;  /* columns per item */
  constexpr int WW = W / 4;  /* words per tile row and item */
  const int np = nr / G;     /* pieces per output row */
  const int items = np * ((nc + W - 1) / W);
  for (int item = tid; item < items; item += nthreads) {
    const int v = item / np;
    const int p = item - v * np;
    uint32_t w[G][WW]; /* w[k][u]: tile row G p + k, columns W v + 4 u .. + 3 */
#pragma unroll
    for (int k = 0; k < G; ++k) {
      const uint8_t* src = tile + (G * p + k) * pitch + W * v;
      if constexpr (WW == 4) {
        const uint4 t = *reinterpret_cast<const uint4*>(src);
        w[k][0] = t.x; w[k][1] = t.y; w[k][2] = t.z; w[k][3] = t.w;
      } else if constexpr (WW == 2) {
        const uint2 t = *reinterpret_cast<const uint2*>(src);
        w[k][0] = t.x; w[k][1] = t.y;
      } else {
        w[k][0] = *reinterpret_cast<const uint32_t*>(src);
      }
    }
    uint8_t* d = dst + (c0 + W * v) * ld + r0 + G * p;
#pragma unroll
    for (int u = 0; u < WW; ++u) {
      uint32_t o[4], o2[4]; /* o[j]: column W v + 4 u + j, rows G p .. (o2: the next 4 at G = 8) */
      if constexpr (G == 2) {
#pragma unroll
        for (int j = 0; j < 4; ++j) o[j] = __byte_perm(w[0][u], w[1][u], j | ((4 + j) << 4));
      } else {
        transpose4x4_bytes(w[0][u], w[1][u], w[2][u], w[3][u], o[0], o[1], o[2], o[3]);
        if constexpr (G == 8) {
          transpose4x4_bytes(w[4][u], w[5][u], w[6][u], w[7][u], o2[0], o2[1], o2[2], o2[3]);
        }
      }
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int c = W * v + 4 * u + j;
        if (c < nc) {
          uint8_t* e = d + (int64_t)(4 * u + j) * ld;
          if constexpr (G == 2) {
            store_as<kStream>(reinterpret_cast<unsigned short*>(e),
                              (unsigned short)(o[j] & 0xFFFFu));
          } else if constexpr (G == 4) {
            store_as<kStream>(reinterpret_cast<unsigned int*>(e), o[j]);
          } else {
            store_as<kStream>(reinterpret_cast<uint2*>(e), make_uint2(o[j], o2[j]));
          }
        }
      }
    }
  }
}

/*
 * dst[(c0 + c) * ld + r0 + r] = tile[r * pitch + c] for r < nr, c < nc.
 * tile: shared memory with at least round_up(nr, 16) rows of `pitch` bytes (pitch % 4 == 0,
 * pitch >= round_up(nc, 4)); bytes outside [0, nr) x [0, nc) may hold anything (never stored).
 * vec16: dst + c0 * ld + r0 is 16-byte aligned and ld % 16 == 0 (then every full run is one
 * 16-byte store). kNarrow: the tile in store_tile_pieces' pieces of run_align(dst, ld, r0) bytes
 * where that is 2, 4 or 8 (vec16 unused; pitch % 16 == 0); a separate instantiation, so that the
 * kernels of 16-byte runs keep their code. Work is spread over `nthreads` threads starting at
 * `tid`; no barrier inside.
 * kStream: the stores are streaming (st.global.cs: evict first in L2), for a copy nothing reads
 * soon that should not push out what is read next (NOTES P114).
 */
template <bool kStream = false, bool kNarrow = false>
__device__ __forceinline__ void store_tile_transposed(const uint8_t* tile, int pitch, int nr, int nc,
                                                      uint8_t* dst, int64_t ld, int64_t r0,
                                                      int64_t c0, bool vec16, int tid,
                                                      int nthreads) {
  if constexpr (kNarrow) {
    switch (run_align(dst, ld, r0)) { /* every run's alignment; nr is a multiple of it */
      case 2:
        return store_tile_pieces<kStream, 2>(tile, pitch, nr, nc, dst, ld, r0, c0, tid, nthreads);
      case 4:
        return store_tile_pieces<kStream, 4>(tile, pitch, nr, nc, dst, ld, r0, c0, tid, nthreads);
      case 8:
        return store_tile_pieces<kStream, 8>(tile, pitch, nr, nc, dst, ld, r0, c0, tid, nthreads);
      default:
        break; /* odd: the byte stores below */
    }
  }
  const int nq = (nc + 3) >> 2;
  const int nh = (nr + 15) >> 4;
  const int items = nq * nh;
  for (int item = tid; item < items; item += nthreads) {
    /* h (the 16-row group) varies fastest across threads: the nh threads of one q write whole
     * 16 * nh-byte runs of the same output rows in one store instruction (a warp covers 32 / nh
     * column quads with full 32-byte sectors), where q fastest had a warp write 32 half sectors
     * of 32 different rows. The shared-memory reads then meet nh-way bank conflicts. */
    const int q = item / nh;
    const int h = item - q * nh;
    const int nvalid = min(16, nr - 16 * h);
    uint32_t w[16];
#pragma unroll
    for (int k = 0; k < 16; ++k) {
      w[k] = *reinterpret_cast<const uint32_t*>(tile + (16 * h + k) * pitch + 4 * q);
    }
    uint32_t o[4][4]; /* o[j][m]: column 4q + j, rows 16h + 4m .. 16h + 4m + 3 */
#pragma unroll
    for (int m = 0; m < 4; ++m) {
      transpose4x4_bytes(w[4 * m], w[4 * m + 1], w[4 * m + 2], w[4 * m + 3], o[0][m], o[1][m],
                         o[2][m], o[3][m]);
    }
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int c = 4 * q + j;
      if (c < nc) {
        uint8_t* d = dst + (c0 + c) * ld + r0 + 16 * h;
        if (vec16 && nvalid == 16 && !kNarrow) {
          store_as<kStream>(reinterpret_cast<uint4*>(d),
                            make_uint4(o[j][0], o[j][1], o[j][2], o[j][3]));
        } else {
#pragma unroll
          for (int k = 0; k < 16; ++k) {
            if (k < nvalid) {
              store_as<kStream>(reinterpret_cast<unsigned char*>(d + k),
                                (unsigned char)(o[j][k >> 2] >> (8 * (k & 3))));
            }
          }
        }
      }
    }
  }
}

}  // namespace engine

#endif  // ENGINE_CSRC_COMMON_TILE_CUH_
