"""Why the profiler's kernel time exceeds the timed (do_bench) time for some streamed kernels
(NOTES M1): one cell's device time four ways, in one process.

    python ci/prof_gap.py [--cells ln:res-fwd:16384 ln:fwd:16384 rms:fwd:8192] [--impl cuda]

For each cell: (a) ``harness.bench`` (do_bench: CUDA events around each call, L2 flushed before
each; the launch included); (b) the profiler's median of 15 back-to-back calls
(``profile_kernels.device_us_per_call``); (c) the profiler's median of 15 calls with do_bench's
L2 flush between them (the flush kernel's own time left out); (d) CUDA events around each of 15
back-to-back calls without the profiler (median). (b) > (a) with (c) ~ (a) points at the calls
running back to back (the previous call's dirty lines in the L2); (b) ~ (c) > (d) at the profiler.
"""

from __future__ import annotations

import argparse
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
from benchmarks.profile_kernels import device_us_per_call, median_per_call  # noqa: E402

NORMS = {"rms": "rmsnorm", "ln": "layernorm"}


def flushed_profile_us(fn, flush, calls: int = 15) -> float:
    """Median per-call device time of ``fn``'s kernels under the profiler, ``flush`` run (and its
    fill kernel dropped by name: the cells measured here launch no fill of their own) before each
    call."""
    H.sync()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            flush()
            torch.cuda.synchronize()
            with torch.profiler.record_function("call"):
                fn()
            torch.cuda.synchronize()
    return median_per_call([e for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA
                            and "fill" not in e.name.lower()], calls)


def event_us(fn, calls: int = 15) -> float:
    """Median of CUDA-event times around each of ``calls`` back-to-back calls (no profiler)."""
    H.sync()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(calls)]
    for s, e in ev:
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) * 1e3 for s, e in ev)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", nargs="*", default=["ln:res-fwd:16384", "ln:fwd:16384", "rms:fwd:8192"])
    ap.add_argument("--impl", default="cuda")
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("prof_gap: needs a GPU")
        return 0
    cache = torch.empty(256 << 20, dtype=torch.int8, device="cuda")
    flush = cache.zero_
    copy = H.copy_bandwidth()["gbps"]
    print(f"{torch.cuda.get_device_name()}: copy {copy:.0f} GB/s")
    for cell in args.cells:
        norm, mode, n = cell.split(":")
        m, n = H.large_shape(int(n))
        spec = C.Spec(NORMS[norm], mode, args.impl)
        inp = C.make_inputs(NORMS[norm], mode, m, n, H.device())
        case = C.build(spec, inp)
        nb = C.nbytes(spec, m, n)
        for _ in range(2):
            us = {"a do_bench": H.bench(case.fn) * 1e3, "b prof b2b": device_us_per_call(case.fn),
                  "c prof flushed": flushed_profile_us(case.fn, flush), "d events b2b": event_us(case.fn)}
            print(f"{spec.label:14s} {args.impl} N={n:6d}: " + "  ".join(
                f"{k} {v:7.1f} us = {100 * H.gbps(nb, v / 1e3) / copy:5.1f} %" for k, v in us.items()), flush=True)
        H.reset_backend()
        del inp, case
        H.free_memory()
    return 0


if __name__ == "__main__":
    sys.exit(main())
