"""Where the host time of one benchmark call goes (cProfile), for host-bound rows.

    python ci/host_profile.py [--norm rmsnorm] [--mode fwd+bwd] [--impl triton] [--n 1024] [--calls 200]

Builds the very case ``benchmarks/run.py`` times (``benchmarks.cases``), then profiles ``calls``
back-to-back calls and prints the host microseconds per call of the top functions by own time and
by cumulative time. Needs a GPU (the kernels run; the profile is of the Python around them).
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--norm", default="rmsnorm")
    ap.add_argument("--mode", default="fwd+bwd")
    ap.add_argument("--impl", nargs="*", default=["triton", "cuda"])
    ap.add_argument("--n", type=int, default=1024)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--top", type=int, default=25)
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("host_profile: needs a GPU")
        return 0
    for impl in args.impl:
        m, n = H.large_shape(args.n)
        spec = C.Spec(args.norm, args.mode, impl)
        case = C.build(spec, C.make_inputs(args.norm, args.mode, m, n, H.device()))
        for _ in range(20):
            case.fn()
        H.sync()
        t0 = time.perf_counter()
        for _ in range(args.calls):
            case.fn()
        host = (time.perf_counter() - t0) / args.calls * 1e6
        H.sync()
        wall = (time.perf_counter() - t0) / args.calls * 1e6
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            case.fn()
        prof.disable()
        H.sync()
        print(f"== {spec.label} {impl} N={n}: host {host:.1f} us per call issued, {wall:.1f} us with the GPU")
        st = pstats.Stats(prof)
        st.sort_stats("tottime")
        for key in st.fcn_list[: args.top]:
            cc, nc, tt, ct, _ = st.stats[key]
            print(f"  own {tt / args.calls * 1e6:8.1f} us  cum {ct / args.calls * 1e6:8.1f} us  "
                  f"{nc / args.calls:5.1f}x  {key[0].split('/')[-1]}:{key[1]} {key[2]}")
        H.reset_backend()
    return 0


if __name__ == "__main__":
    sys.exit(main())
