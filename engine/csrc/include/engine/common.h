/*
 * engine C API: common types. Framework-free: raw device pointers, a dtype enum, a CUDA stream.
 * Every output is passed in by the caller; no function allocates device memory or synchronises.
 */
#ifndef ENGINE_COMMON_H_
#define ENGINE_COMMON_H_

#include <cuda_runtime_api.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types. Values are stable: bindings map framework dtypes onto them. */
typedef enum {
  ENGINE_DTYPE_FLOAT32 = 0,
  ENGINE_DTYPE_FLOAT16 = 1,
  ENGINE_DTYPE_BFLOAT16 = 2,
  ENGINE_DTYPE_FLOAT8_E4M3 = 3, /* e4m3 "fn": max 448, no inf */
  ENGINE_DTYPE_FLOAT8_E5M2 = 4, /* max 57344 */
} engine_dtype;

typedef enum {
  ENGINE_SUCCESS = 0,
  ENGINE_ERROR_INVALID_ARGUMENT = 1, /* unsupported dtype combination, bad size or pointer */
  ENGINE_ERROR_CUDA = 2,             /* a CUDA call or launch failed */
} engine_status;

/* A static string naming the status. */
const char* engine_status_string(engine_status status);

/* Detail of the last failure on the calling host thread ("" if none). Valid until the next call. */
const char* engine_last_error(void);

/* Largest thread-block cluster (CTAs) the row kernels may split one row over on sm_90 devices:
 * 1, 2, 4, 8 or 16, or 0 (the default): 16 where the device holds a 16-CTA cluster at one CTA per
 * SM (a non-portable size; the H100 and H200 do), else 8. 1 keeps every row inside one CTA (the
 * pre-cluster paths), so tests and benchmarks can run both paths on one device; an explicit 16 on
 * a device that cannot hold such a cluster makes the launch fail. Process-wide; returns the
 * previous value, or -1 (and changes nothing) for any other n. */
int engine_set_max_cluster_size(int n);

/* 16-byte vectors of x per thread of the norm forward's register path (one row over one CTA) for
 * 16-bit x and residual stream: 4 or 8, or 0 (the default) for the launcher's choice per row
 * width (4 for bf16 rows of 520-1024 elements, 8 otherwise). For A/B runs of the thread layouts on one device; rows that would need more than 256
 * threads at the requested count keep the default layout. Process-wide; returns the previous value,
 * or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_vectors(int n);

/* Values per thread of the norm backward's register path for 16-bit x and dy: 16 or 32, or 0 (the
 * default) for the launcher's choice (32 in one CTA at 4K-8K, 16 to 32K, 32 / 64 past). At 32,
 * rows past 4K hold 32 values per thread (a row in one CTA to 8K, clusters of half the size
 * beyond), with the dweight / dbias partials in shared memory; at 16, rows past what 16-value
 * clusters hold take the blocked kernel. For A/B runs of the layouts on one device. Process-wide;
 * returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_bwd_elems(int n);

/* The norm backward's dweight / dbias reduction (the sum of the per-CTA partial rows): the sliced
 * kernel at 1 column per thread (32 columns per CTA) or 4 (one 16-byte load per partial row, 128
 * columns per CTA), the CTAs striding over the column blocks; or 0 (the default) for the
 * launcher's choice: the flat kernel (a thread sums its 4 columns over every partial row) where
 * there are at most 16 partial rows and the 128-column blocks outnumber the sliced kernel's grid
 * (4 CTAs per SM and set), else 4 where the 128-column blocks of dweight and dbias cover
 * the SMs and 1 otherwise (benchmarks/NOTES.md P171, P172). Every form sums a column's partials
 * in the same order (the same bits). For A/B runs on one device. Process-wide; returns the
 * previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_bwd_reduce_vec(int n);

/* The norm backward's register path over 16-bit z and dy, 16 values per thread in one CTA per row
 * without a thread-block cluster: n = 1024, rows that need 513-1024 threads (bf16 8K-16K) in one
 * CTA of up to 1024 threads (LayerNorm's partials in shared memory there); n = 512, rows of
 * 257-512 threads (4K-8K), both norms, in one CTA of up to 512 (slower than the default's 32
 * values per thread in 256 threads); n = 256,
 * neither (the layouts before this setting); 0, the default, as 1024. For A/B runs of the layouts
 * on one device. Process-wide; returns the previous value, or -1 (and changes nothing) for any
 * other n. */
int engine_set_norm_bwd_cta_threads(int n);

/* The norm forward's register kernels have a fast row loop for FP8 outputs with delayed scaling
 * (no run-time test per slot) beside the general one (every mode and output); both compute the
 * same bits. 1 runs the general loop for every launch, 0 (the default) the fast one where it
 * applies. For tests and A/B runs on one device. Process-wide; returns the previous value, or -1
 * (and changes nothing) for any other n. */
int engine_set_norm_fwd_general_loop(int n);

/* Row width from which the norm forward takes its blocked kernel (two passes over the row, the
 * second re-reading it from L2; CTAs sized to the row, at most 512 threads) where x and the
 * residual stream share a dtype and allow 16-byte vectors, instead of the register path or a
 * thread-block cluster: n > 0 from n columns (a width past every row, e.g. 1 << 30: never, the
 * paths before session 15), 0 (the default) the launcher's choice (norm_fwd_launch.cuh:
 * fwd_take_blocked: the fused residual add of a 16-bit x to a non-FP8 output at 2K-8K, an FP8
 * output of RMSNorm of a 16-bit x without a residual at 4K-16K (NOTES P100), and
 * from 32K where the streamed kernel does not take it, which by default leaves it a residual of
 * x's dtype at 32K-64K, NOTES P96 / P103). For A/B runs
 * of the paths on one device. Process-wide; returns the previous value, or -1 (and changes
 * nothing) for n < 0. */
int engine_set_norm_fwd_blocked_from(int n);

/* CTAs per SM of the norm forward's register path without a cluster: n in 1..64 launches n CTAs
 * per SM (capped at the row blocks; more than fit an SM at once queue for the block scheduler,
 * each still looping over its share of row blocks), 0 (the default) the launcher's choice
 * (norm_fwd_launch.cuh: fwd_grid_per_sm: 16 for a non-FP8 output without a residual, both
 * norms, 32 for rows of up to 1K; the resident CTAs otherwise); under an sm_margin at
 * most the resident CTAs. The grid
 * changes no row's arithmetic: every output bit is the same. For A/B runs on one device.
 * Process-wide; returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_grid_per_sm(int n);

/* Row width from which the norm backward takes its streamed cluster kernel (16-bit x and dy with
 * 16-byte vectors, on a device with thread-block clusters): the row split over a cluster, each CTA
 * copying its slice of the next two rows into shared memory (cp.async) while it reduces one and
 * writes the previous one's dx (norm_bwd_stream.cuh). n > 0 from n columns (e.g. 1 << 30: never,
 * the paths before session 17), 0 (the default) the launcher's choice (bwd_take_stream: from 4096
 * columns). For A/B runs of the paths on one device. Process-wide; returns the previous value, or
 * -1 (and changes nothing) for n < 0. */
int engine_set_norm_bwd_stream_from(int n);

/* Largest CTA of the streamed backward (above): n = 128, 256 or 512 threads (the cluster is the
 * smallest power of two whose CTAs of at most n threads hold the row at 16 values per thread), 0
 * (the default) 512. For A/B runs. Process-wide; returns the previous value, or -1 (and changes
 * nothing) for any other n. */
int engine_set_norm_bwd_stream_threads(int n);

/* Row width from which the norm forward takes its streamed cluster kernel (a 16-bit x without a
 * residual or with one of x's dtype, with 16-byte vectors, on a device with thread-block
 * clusters; delayed scaling, high precision outputs and current scaling's statistics pass): the
 * row split over a cluster, each CTA copying its slice of the next two rows into shared memory
 * (cp.async) while it reduces one and writes an earlier one (norm_fwd_stream.cuh). n > 0 from n
 * columns for every output dtype (e.g. 1 << 30: never, the paths before session 18), 0 (the
 * default) the launcher's choice (fwd_take_stream: from 32K, both norms, NOTES P101 / P102; a
 * residual of x's dtype from 16K, NOTES P89 / P90, but not at 32K-64K (fwd_take_stream, NOTES
 * P96 / P103); RMSNorm's FP8 outputs, both scalings, past 16K, below which the
 * blocked kernel takes them from 4K (NOTES P59/P67/P68, P100), where an FP8 output is then
 * within one FP8 step of the fp32 output's cast instead of its exact cast). For A/B runs of the
 * paths on one device. Process-wide; returns the previous value, or -1 (and changes nothing) for
 * n < 0. */
int engine_set_norm_fwd_stream_from(int n);

/* Largest CTA of the streamed forward (above): n = 128, 256 or 512 threads (the cluster is the
 * smallest power of two whose CTAs of at most n threads hold the row at 32 values per thread), 0
 * (the default) the launcher's choice (norm_fwd_stream.cuh: fwd_stream_threads_default, by the
 * card: engine_set_dram_class). For A/B
 * runs. Process-wide; returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_stream_threads(int n);

/* The norm forward's band kernel (normalization/norm_fwd_band.cuh: an FP8 output with its
 * transposed copy in one kernel, delayed scaling, a 16-bit x without a residual, rows spread over
 * a cluster in bands of 32): n = 1 never; 2-4 configuration n - 1 at every width whose cluster
 * of at most 16 CTAs fits: 2 bands of 32 rows x 512 columns per CTA with FP8 tiles of their own
 * (one CTA per SM; rows of up to 8192), 3 the same with the tile written over its band's stage
 * (two CTAs per SM), 4 32 x 1024 columns, the tile in the stage (one CTA per SM; rows of up to
 * 16384); 0 (the default) the launcher's choice (norm_fwd_band.cuh:
 * fwd_band_cfg, by the width and the card: engine_set_dram_class). For tests and A/B runs.
 * Process-wide; returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_band(int n);

/* The norm forward's lean kernel (normalization/norm_fwd_lean.cuh: a 16-bit x without a residual
 * to a non-FP8 output, rows of 4096-16384 columns, and 32768 on one card per norm, at 8 vectors
 * per thread; the register
 * kernel's bits, at 2 CTAs per SM with no per-CTA prologue): n = 1 never (the register kernel
 * runs those rows), 0 (the default) wherever it applies, 2 at 32768 columns for both norms on
 * any card (the default takes one per card: benchmarks/NOTES.md P154) as one 512-thread CTA per
 * row, 3 the same over a cluster of two 256-thread CTAs (the default's form for RMSNorm on a card
 * that is not lean: P155). For tests and A/B runs. Process-wide;
 * returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_lean(int n);

/* The norm forward's lean FP8 kernel (normalization/norm_fwd_fp8_lean.cuh: a 16-bit x without a
 * residual, weights of x's dtype, to an FP8 output in delayed scaling, no in-kernel transposed
 * copy; one 512-thread CTA per SM, the next row prefetched, gamma held in registers at 4 vectors
 * per thread): n = 0 (the default) where it measured faster than the other kernels on the H200
 * (benchmarks/NOTES.md P181b), on a card that is not lean: RMSNorm's rows of 4096, 8192 and 16384
 * columns, LayerNorm's of 4096 and 8192; n = 1 never; n = 2 at every width whose row groups it
 * fills (rows of a multiple of 1024 columns up to 16384), on either card. For tests and A/B runs.
 * Process-wide; returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_fp8_lean(int n);

/* The norm forward's blocked kernel on the rows with a fused residual add of a 16-bit x to a
 * non-FP8 output (its default rows at 2K-16K; benchmarks/NOTES.md P162): n = 1 four 16-byte
 * vectors per thread per chunk on the resident grid (the shape before P162), 2 two vectors per
 * thread (CTAs of twice the threads, up to 512: rows of up to 8192 columns), 3 the same on a grid
 * of 32 CTAs per SM, 4 four vectors per thread on a grid of 32 CTAs per SM; 0 (the default) the
 * shape by width (norm_fwd_launch.cuh, fwd_blocked_res_shape: 2 to 2K, 3 to 4K and at RMSNorm 8K,
 * 4 at LayerNorm 8K and at 16K). For tests and A/B runs. Process-wide; returns the previous
 * value, or -1 (and changes nothing) for any other n. */
int engine_set_norm_fwd_blocked_shape(int n);

/* The order in which engine_fp8_transpose (the tiled transpose after a norm's rowwise FP8 output,
 * and engine.fp8_transpose) walks its tiles: n = 1 from the first rows to the last, its stores of
 * the transposed copy plain; 2 from the last rows to the first, those stores streaming (evict
 * first), so that it reads first the rows written last, the likeliest still in L2, and its own
 * stores do not push them out (benchmarks/NOTES.md P114); 0 (the default) the launcher's choice,
 * 1 (the reverse order measured -1.5 to +2 points on the H100's + T rows). The bytes are the same
 * either way. For tests and A/B runs. Process-wide; returns the previous
 * value, or -1 (and changes nothing) for any other n. */
int engine_set_fp8_transpose_order(int n);

/* Which card's launch defaults the norm launchers take where the two cards measured apart
 * (benchmarks/NOTES.md P109): n = 1 those of a card of lean DRAM bandwidth per SM (under
 * kLeanDramGbpsPerSm, 30 GB/s per SM: the H100 SXM's 3.35 TB/s over 132 SMs, 25), 2 those of a
 * wide one (the H200's 4.9 TB/s, 37), 0 (the default) the current device's class from its peak
 * DRAM bandwidth (memory clock x bus width x 2). For A/B runs of the two sets on one device.
 * Process-wide; returns the previous value, or -1 (and changes nothing) for any other n. */
int engine_set_dram_class(int n);

/* The class engine_set_dram_class describes that the current device's launches take now: 1
 * lean, 2 wide (the knob's value where set); -1 where the device cannot be queried (the error's
 * detail in engine_last_error). */
int engine_dram_class(void);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* ENGINE_COMMON_H_ */
