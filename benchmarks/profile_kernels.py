"""Device time against timed time: which benchmark rows are bound by their kernels, which by the host?

For each (norm, mode, impl, N) at M*N = 64M this prints the benchmark's own time (``harness.bench``:
do_bench median, L2 flushed) beside the summed device time of every kernel one call launches (torch
profiler, the median over 15 calls), both as % of the copy bandwidth measured in the same run.
Where the two differ the row is host-bound: the GPU waits for Python between kernels. With
``--graph`` also the time of one replay of the call captured as a CUDA graph (``harness.bench_graph``:
the host's launch cost removed, the kernels' gaps on the GPU kept), as a user who captures the step
sees it.

    python benchmarks/profile_kernels.py [--n 1024 8192] [--modes fwd fwd+bwd] [--impls triton]
                                         [--jit-launch] [--max-cluster 1] [--json out.json]
"""

from __future__ import annotations

import argparse
import contextlib
import re
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
from torch.profiler import ProfilerActivity, profile  # noqa: E402

from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402


def median_per_call(kernels, calls: int) -> float:
    """The median over ``calls`` calls of the summed device time (µs) of each call's kernels:
    ``kernels`` are profiler device events (``time_range.start``, ``time_range.elapsed_us()``) of
    ``calls`` back-to-back calls, split into calls by their order on the stream, so every call
    must have launched the same number of them; otherwise RuntimeError."""
    kernels = sorted(kernels, key=lambda e: e.time_range.start)
    per_call, rem = divmod(len(kernels), calls)
    if rem or not per_call:
        raise RuntimeError(f"median_per_call: {len(kernels)} device events over {calls} calls")
    return statistics.median(sum(e.time_range.elapsed_us() for e in kernels[i:i + per_call])
                             for i in range(0, len(kernels), per_call))


def device_events(fn, calls: int) -> list:
    """The profiler's device events of ``calls`` back-to-back calls of ``fn``, in stream order."""
    H.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        H.sync()
    events = [e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    return sorted(events, key=lambda e: e.time_range.start)


def device_profile(fn, calls: int = 15) -> tuple[float, list[str]]:
    """Summed device time of all kernels one call launches (profiler): the median over ``calls``
    back-to-back calls (:func:`median_per_call`), and the names of the kernels the first call
    launched, in stream order (so that a table's cell says which kernel it measured: the dispatch
    picks among several per width, card and mode), from one profiler session. The median, not the
    mean of 5 as before session 28: cells of unchanged kernels moved by up to 5 points between
    runs with the mean (benchmarks/NOTES.md, P89's outcome and M1)."""
    events = device_events(fn, calls)
    us = median_per_call(events, calls)  # raises unless every call launched the same count
    return us, [e.name for e in events[:len(events) // calls]]


def device_us_per_call(fn, calls: int = 15) -> float:
    """:func:`device_profile`'s device time alone."""
    return device_profile(fn, calls)[0]


def short_kernel_name(name: str) -> str:
    """A kernel's demangled name without its return type, namespaces and argument list, template
    arguments kept: ``void engine::norm::k<int, 8>(engine::norm::FwdArgs)`` -> ``k<int, 8>``."""
    name = re.sub(r"^void\s+", "", name)
    depth, cut = 0, len(name)
    for i, ch in enumerate(name):  # the argument list: the first "(" outside template brackets
        depth += {"<": 1, ">": -1}.get(ch, 0)
        if ch == "(" and depth == 0:
            cut = i
            break
    return re.sub(r"\b\w+::", "", name[:cut])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 8192, 32768, 131072])
    ap.add_argument("--modes", nargs="*", default=["fwd", "fwd+bwd", "fp8-delayed", "fp8-T", "cast-T"])
    ap.add_argument("--norms", nargs="*", default=["rmsnorm", "layernorm"])
    ap.add_argument("--impls", nargs="*", default=["cuda", "triton"])
    ap.add_argument("--json", type=Path)
    ap.add_argument("--names", action="store_true",
                    help="print the kernels each row launches (the JSON rows carry them always, as 'kernels')")
    ap.add_argument("--graph", action="store_true",
                    help="also time one replay of the call captured as a CUDA graph (harness.bench_graph)")
    ap.add_argument("--jit-launch", action="store_true",
                    help="launch Triton kernels through kernel[grid] instead of engine's Launcher")
    ap.add_argument("--max-cluster", type=int, choices=[0, 1, 2, 4, 8, 16],
                    help="CUDA: largest thread-block cluster a row may be split over (0: the "
                         "default, 16 on the H100 / H200; 1: none; engine.cuda_backend."
                         "max_cluster_size), for A/B runs of the cluster paths")
    ap.add_argument("--fwd-vectors", type=int, choices=[0, 4, 8],
                    help="CUDA: 16-byte vectors per thread of the forward's register path (0: the "
                         "default; engine.cuda_backend.norm_fwd_vectors), for A/B runs of the layouts")
    ap.add_argument("--bwd-elems", type=int, choices=[0, 16, 32],
                    help="CUDA: values per thread of the backward's register path (0: the default; "
                         "engine.cuda_backend.norm_bwd_elems), for A/B runs of the layouts")
    ap.add_argument("--bwd-reduce-vec", type=int, choices=[0, 1, 4],
                    help="CUDA: the backward's dweight / dbias reduction on its sliced kernel at 1 or 4 "
                         "columns per thread, or 0: the default (the flat kernel for at most 16 partial "
                         "rows where the 128-column blocks outnumber the sliced grid; "
                         "engine.cuda_backend.norm_bwd_reduce_vec), for A/B runs")
    ap.add_argument("--bwd-cta-threads", type=int, choices=[0, 256, 512, 1024],
                    help="CUDA: the backward's one-CTA layouts of a 16-bit row at 16 values per "
                         "thread (1024: 8K-16K, 512: 4K-8K, 256: none, 0: the default; "
                         "engine.cuda_backend.norm_bwd_cta_threads), for A/B runs of the layouts")
    ap.add_argument("--fwd-general", type=int, choices=[0, 1],
                    help="CUDA: 1 runs the forward's general row loop for every launch (0: the "
                         "default, the fast FP8 loop where it applies; engine.cuda_backend."
                         "norm_fwd_general_loop), for A/B runs of the two loops")
    ap.add_argument("--fwd-blocked-from", type=int,
                    help="CUDA: row width from which the forward runs its blocked kernel (0: the "
                         "default, 1073741824: never; engine.cuda_backend.norm_fwd_blocked_from), "
                         "for A/B runs of the paths")
    ap.add_argument("--fwd-grid-per-sm", type=int,
                    help="CUDA: CTAs per SM of the forward's register path without a cluster (0: "
                         "the default; engine.cuda_backend.norm_fwd_grid_per_sm), for A/B runs")
    ap.add_argument("--bwd-stream-from", type=int,
                    help="CUDA: row width from which the backward runs its streamed cluster kernel "
                         "(0: the default, 1073741824: never; engine.cuda_backend."
                         "norm_bwd_stream_from), for A/B runs of the paths")
    ap.add_argument("--bwd-stream-threads", type=int, choices=[0, 128, 256, 512],
                    help="CUDA: largest CTA of the backward's streamed kernel (0: the default; "
                         "engine.cuda_backend.norm_bwd_stream_threads), for A/B runs")
    ap.add_argument("--m-adjust", type=int, default=0,
                    help="rows per cell: M = 2^26 // N + this (default 0; e.g. -12 gives M %% 16 = 4 "
                         "and -14 M %% 16 = 2 at power-of-two widths: transposed copies whose runs "
                         "are not 16-byte aligned, NOTES P134 / P135)")
    ap.add_argument("--m-align", type=int, default=1,
                    help="rows per cell rounded down to a multiple of this, after --m-adjust (default 1: "
                         "M = 2^26 // N as it is; e.g. 128 at widths between the powers of two, whose M "
                         "is otherwise odd or 2 mod 16, as a training job's batch x sequence is not)")
    ap.add_argument("--dtype", choices=["bf16", "fp16"], default="bf16",
                    help="the 16-bit type of x, weight, bias, residual and dy (fp16: the cases' bf16 "
                         "inputs converted; outputs follow x's type)")
    ap.add_argument("--rows", type=int, nargs="*",
                    help="rows per cell: each of these M at every N, in place of M = 2^26 // N + "
                         "--m-adjust (small shapes: the kernels of a few rows, e.g. 32 512)")
    ap.add_argument("--fwd-stream-from", type=int,
                    help="CUDA: row width from which the forward runs its streamed cluster kernel "
                         "(0: the default, 1073741824: never; engine.cuda_backend."
                         "norm_fwd_stream_from), for A/B runs of the paths")
    ap.add_argument("--fwd-stream-threads", type=int, choices=[0, 128, 256, 512],
                    help="CUDA: largest CTA of the forward's streamed kernel (0: the default; "
                         "engine.cuda_backend.norm_fwd_stream_threads), for A/B runs")
    ap.add_argument("--fwd-band", type=int, choices=range(5),
                    help="CUDA: the forward's band kernel for FP8 + transposed (0: the default, 1: "
                         "never, 2-4: one configuration wherever it fits, 2 / 3: 32 x 512 per CTA, "
                         "tiles of their own / the tile in the stage, 4: 32 x 1024; "
                         "engine.cuda_backend.norm_fwd_band), for A/B runs")
    ap.add_argument("--fwd-blocked-shape", type=int, choices=[0, 1, 2, 3, 4],
                    help="CUDA: the forward's blocked kernel on 16-bit residual rows: 1 four vectors "
                         "per thread on the resident grid (before P162), 2 two vectors per thread, 3 "
                         "the same at 32 CTAs per SM, 4 four vectors at 32 CTAs per SM (0: the "
                         "default, by width; engine.cuda_backend.norm_fwd_blocked_shape), for A/B runs")
    ap.add_argument("--fwd-lean", type=int, choices=[0, 1, 2, 3],
                    help="CUDA: 1 keeps the forward's register kernel where its lean kernel runs by "
                         "default, 2 runs it at 32K for both norms, 3 there over 2-CTA clusters "
                         "(0: the default; engine.cuda_backend.norm_fwd_lean), for A/B runs")
    ap.add_argument("--fwd-fp8-lean", type=int, choices=[0, 1, 2],
                    help="CUDA: the forward's lean FP8 kernel at its default widths (0), never (1) or at "
                         "every width it fits (2) (engine.cuda_backend.norm_fwd_fp8_lean), for A/B runs")
    ap.add_argument("--sm-margin", type=int, default=0,
                    help="Both backends: the forward calls' sm_margin (SMs left out of the "
                         "persistent grids; benchmarks.cases.Spec.sm_margin), for runs of the grid "
                         "size")
    ap.add_argument("--dram-class", type=int, choices=[0, 1, 2],
                    help="Both backends: the card class whose launch defaults they take (0: the "
                         "device's, 1: lean DRAM bandwidth per SM, the H100's, 2: wide, the H200's; "
                         "engine.cuda_backend.dram_class, engine.triton_kernels.utils.DRAM_CLASS), "
                         "for A/B runs of the two sets")
    ap.add_argument("--triton-band", type=int, choices=[0, 16, 32],
                    help="Triton: rows per band of the in-kernel transposed FP8 copy (engine."
                         "triton_kernels.norms.BAND_ROWS; 0: the tile's own transposed stores), for "
                         "A/B runs of triton-int")
    ap.add_argument("--triton-band-cols", type=int, choices=[64, 128, 256, 512, 1024, 2048],
                    help="Triton: columns per chunk of a band's transposition (engine.triton_kernels."
                         "norms.BAND_COLS), for A/B runs of triton-int")
    ap.add_argument("--triton-chunk-fill", type=float,
                    help="Triton: the least share of a blocked forward tile's lanes a row must fill, "
                         "else the chunk halves and the tile takes twice the rows (0: off; "
                         "engine.triton_kernels.norms_common.FWD_CHUNK_FILL), for A/B runs")
    ap.add_argument("--triton-bwd-tail", type=int, choices=[0, 1],
                    help="Triton: the backward's head + tail tiles at widths between the powers of "
                         "two (1) or the next power of two's config (0) (engine.triton_kernels."
                         "norms_common.BWD_TAIL), for A/B runs of the fwd+bwd rows")
    ap.add_argument("--triton-bwd-row-phases", type=int, choices=[0, 1],
                    help="Triton: the backward's tiles of several rows as whole tiles with their rows "
                         "unmasked, then the last (1), or every tile masked (0) (engine.triton_kernels."
                         "norms.BWD_ROW_PHASES), for A/B runs at M %% 16 != 0")
    ap.add_argument("--triton-fp8-between", type=int, choices=[0, 1],
                    help="Triton: the FP8 forward's entry at widths between 16K and 32K (1) or the 32K "
                         "entry (0) (engine.triton_kernels.norms_common.FWD_FP8_BETWEEN), for A/B runs")
    ap.add_argument("--triton-pass2-reverse", type=int, choices=[0, 1],
                    help="Triton: the blocked forward's pass 2 from the last chunk to the first (1) or "
                         "in column order (0) (engine.triton_kernels.norms.PASS2_REVERSE), for A/B runs")
    ap.add_argument("--triton-reduce-spread", type=int, choices=[0, 1, 2],
                    help="Triton: the dW / dB partials' reduction tile rule (engine.triton_kernels."
                         "norms_common.REDUCE_SPREAD: 0 the fixed 128 x 32 tile, 1 P168's, 2 P170's), "
                         "for A/B runs of the fwd+bwd rows")
    ap.add_argument("--fp8-transpose-order", type=int, choices=[0, 1, 2],
                    help="Both backends: the tiled FP8 transpose's tile order (1 first rows first, 2 "
                         "last rows first with streaming stores, 0 the default; engine.cuda_backend."
                         "fp8_transpose_order, engine.triton_kernels.transpose.FP8_TRANSPOSE_ORDER), "
                         "for A/B runs of the + T rows")
    args = ap.parse_args(argv)
    if args.m_align < 1:
        ap.error(f"--m-align must be at least 1, got {args.m_align}")
    from engine.triton_kernels import norms as triton_norms

    if args.dram_class is not None:
        from engine.triton_kernels import utils as triton_utils

        triton_utils.DRAM_CLASS = args.dram_class
    if args.triton_band is not None:
        triton_norms.BAND_ROWS = args.triton_band
    if args.triton_band_cols is not None:
        triton_norms.BAND_COLS = args.triton_band_cols
    if args.triton_reduce_spread is not None:
        from engine.triton_kernels import norms_common as triton_norms_common

        triton_norms_common.REDUCE_SPREAD = args.triton_reduce_spread
    if args.triton_chunk_fill is not None:
        from engine.triton_kernels import norms_common as triton_nc

        triton_nc.FWD_CHUNK_FILL = args.triton_chunk_fill
        triton_nc.fwd_config.cache_clear()
    if args.triton_bwd_tail is not None:
        from engine.triton_kernels import norms_common as triton_nc

        triton_nc.BWD_TAIL = bool(args.triton_bwd_tail)
        triton_nc.bwd_config.cache_clear()
    if args.triton_bwd_row_phases is not None:
        triton_norms.BWD_ROW_PHASES = bool(args.triton_bwd_row_phases)
        triton_norms.BWD_PLANS.clear()
    if args.triton_fp8_between == 0:
        from engine.triton_kernels import norms_common as triton_nc

        triton_nc.FWD_FP8_BETWEEN = {}
        triton_nc.fwd_config.cache_clear()
        triton_norms.FWD_PLANS.clear()
    if args.triton_pass2_reverse is not None:
        triton_norms.PASS2_REVERSE = bool(args.triton_pass2_reverse)
    if args.fp8_transpose_order is not None:
        from engine.triton_kernels import transpose as triton_transpose

        triton_transpose.FP8_TRANSPOSE_ORDER = args.fp8_transpose_order
    # (argument, engine.cuda_backend knob): each set for the whole run when given
    knobs = (("max_cluster", "max_cluster_size"), ("fwd_vectors", "norm_fwd_vectors"),
             ("bwd_elems", "norm_bwd_elems"), ("bwd_cta_threads", "norm_bwd_cta_threads"),
             ("bwd_reduce_vec", "norm_bwd_reduce_vec"),
             ("fwd_general", "norm_fwd_general_loop"), ("fwd_blocked_from", "norm_fwd_blocked_from"),
             ("fwd_grid_per_sm", "norm_fwd_grid_per_sm"), ("bwd_stream_from", "norm_bwd_stream_from"),
             ("bwd_stream_threads", "norm_bwd_stream_threads"), ("fwd_stream_from", "norm_fwd_stream_from"),
             ("fwd_stream_threads", "norm_fwd_stream_threads"), ("fwd_band", "norm_fwd_band"),
             ("fwd_lean", "norm_fwd_lean"), ("fwd_fp8_lean", "norm_fwd_fp8_lean"),
             ("fwd_blocked_shape", "norm_fwd_blocked_shape"),
             ("dram_class", "dram_class"), ("fp8_transpose_order", "fp8_transpose_order"))
    with contextlib.ExitStack() as stack:
        for arg, knob in knobs:
            if getattr(args, arg) is not None and H.on_gpu():
                from engine import cuda_backend

                stack.enter_context(getattr(cuda_backend, knob)(getattr(args, arg)))
        return run(args)


def run(args) -> int:
    if args.jit_launch:
        from engine.triton_kernels import launch

        launch.FORCE_JIT = True
    if not H.on_gpu():
        print("profile_kernels: needs a GPU (the profiler's device times)")
        return 0
    copy = H.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:.0f} GB/s; inputs {args.dtype}")
    from engine.triton_kernels import utils as triton_utils

    lean = triton_utils.lean_dram(H.device())
    cls = {True: "lean", False: "wide"}
    if "cuda" in args.impls:
        from engine import cuda_backend

        print(f"card class: cuda {cls[cuda_backend.device_dram_class() == 1]}, triton {cls[lean]}")
    else:
        print(f"card class: triton {cls[lean]}")
    rows = []
    env = H.environment() if args.json else None
    for norm in args.norms:
        for mode in args.modes:
            if mode == "cast-T" and norm != args.norms[0]:
                continue
            for impl in args.impls:
                for n, m_rows in [(n, r) for n in args.n for r in (args.rows or [None])]:
                    m, n = H.large_shape(n)
                    m = max(1, m + args.m_adjust) if m_rows is None else m_rows
                    m = max(args.m_align, m // args.m_align * args.m_align) if m_rows is None else m
                    spec = C.Spec(norm, mode, impl, args.sm_margin)
                    inp = C.make_inputs(norm, mode, m, n, H.device())
                    if args.dtype == "fp16":  # every bf16 input as fp16 (scale and amax stay fp32)
                        inp = {k: v.to(torch.float16) if v.dtype == torch.bfloat16 else v
                               for k, v in inp.items()}
                    try:
                        case = C.build(spec, inp)
                        ms = H.bench(case.fn)
                        dev_us, names = device_profile(case.fn)
                        g_ms = H.bench_graph(case.fn) if args.graph else None
                    except Exception as e:  # noqa: BLE001 - a row that fails is reported, not fatal
                        print(f"{spec.label:14s} {impl:7s} N={n:6d}: {H.short_error(e)}")
                        continue
                    finally:
                        H.reset_backend()
                    nb = C.nbytes(spec, m, n)
                    timed = 100 * H.gbps(nb, ms) / copy
                    kern = 100 * H.gbps(nb, dev_us / 1e3) / copy
                    graph = None if g_ms is None else 100 * H.gbps(nb, g_ms) / copy
                    rows.append(dict(norm=norm, mode=mode, impl=impl, n=n, m=m, timed_ms=ms, device_us=dev_us,
                                     timed_pct=timed, kernels_pct=kern, graph_ms=g_ms, graph_pct=graph,
                                     kernels=names))
                    g_txt = "" if not args.graph else (
                        "   graph      -" if g_ms is None else f"   graph {g_ms * 1e3:8.1f} us = {graph:5.1f} %")
                    m_txt = "" if not (args.m_adjust or args.rows or args.m_align > 1) else f" M={m:6d}"
                    print(f"{spec.label:14s} {impl:7s} N={n:6d}{m_txt}: timed {ms * 1e3:8.1f} us = {timed:5.1f} %   "
                          f"kernels {dev_us:8.1f} us = {kern:5.1f} %{g_txt}", flush=True)
                    if args.names:
                        print("    " + " ; ".join(short_kernel_name(k) for k in names), flush=True)
                    del inp, case
                    H.free_memory()
                    if args.json:  # after every row: a call cut off by its time limit keeps what it measured
                        H.write_json(args.json, {"environment": env, "copy_gbps": copy, "rows": rows})
    return 0


if __name__ == "__main__":
    sys.exit(main())
