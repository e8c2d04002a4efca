"""Q77 (benchmarks/NOTES.md): builds of engine's lean bf16 forward (``ci/lean_lab_engine.cu``, one per
tree's header) timed in one process, the tables' measure (profile_kernels: summed kernel time per
call, the median of 15 calls; % of the copy bandwidth at ``harness.bytes_norm_fwd``'s minimum bytes),
bf16 x, y and weights, M * N = 64M, the builds alternated ``--reps`` times.

    PYTHONPATH=$PWD python3 ci/lean_lab.py --so /tmp/lean_old.so /tmp/lean_new.so [--n 4096 8192 16384]
        [--per-sm 16 0]

``--per-sm``: the grids timed, CTAs per SM (16: the launcher's; 0: the resident CTAs, a persistent
grid whose row loop runs the next row's prefetch), each build at each.

Every launch writes into a NaN-poisoned output; the first build's y, rsigma (and mu) are checked
against float64 (bf16 rounding of y: within 2 bf16 ulps where |y| > 1e-2; rsigma / mu to 1e-5
relative), and every other build's must equal them bit for bit (a change of loop order or of
where the stats are stored keeps every value). ``--other-bits``: the builds after the first may
sum in another order (P185, branch p185-lean1-16bit: ``-DLEAN_LAB_ONE_CTA``); each is then
checked against float64 itself, and whether its bits are the first build's is only reported.
A failed check prints FAIL and exits 1.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402
from ci.fp8_lab import copy_header, lab_inputs  # noqa: E402

EPS = 1e-5


def reference(ln: bool, x, g, b):
    """float64 (y, rsigma, mu)"""
    xd = x.double()
    mean = xd.mean(-1, keepdim=True) if ln else torch.zeros_like(xd[:, :1])
    var = (xd - mean).pow(2).mean(-1, keepdim=True)
    rs = torch.rsqrt(var + EPS) if ln else torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS)
    y = (xd - mean) * rs * g.double() + (b.double() if ln else 0.0)
    return y, rs.squeeze(-1), mean.squeeze(-1)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--so", nargs="+", required=True, help="builds of ci/lean_lab_engine.cu (the first: reference)")
    ap.add_argument("--n", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument("--norms", nargs="*", default=["ln", "rms"], choices=["rms", "ln"])
    ap.add_argument("--reps", type=int, default=2)
    ap.add_argument("--per-sm", type=int, nargs="*", default=[16])
    ap.add_argument("--other-bits", action="store_true",
                    help="check every build against float64; bit equality with the first only reported")
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("lean_lab: needs a GPU")
        return 0
    libs = []
    for path in args.so:
        lib = ctypes.CDLL(os.path.abspath(path))
        lib.lean_engine_launch.restype = ctypes.c_longlong
        lib.lean_engine_launch.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 5 + [
            ctypes.c_longlong, ctypes.c_int, ctypes.c_int, ctypes.c_void_p]
        libs += [(f"{Path(path).stem}/{p}", lib, p) for p in args.per_sm]
    copy = copy_header()
    failed = 0
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    for n in args.n:
        m, x, gb = lab_inputs(n)
        y = torch.empty(m, n, device="cuda", dtype=torch.bfloat16)
        stats = torch.empty(2 * m, device="cuda")
        for kind in args.norms:
            ln = kind == "ln"
            nbytes = H.bytes_norm_fwd(m, n, bias=ln)
            first = ref = None
            for rep in range(args.reps):
                for tag, lib, per_sm in libs:
                    def launch():
                        return lib.lean_engine_launch(int(ln), x.data_ptr(), gb.data_ptr(), y.data_ptr(),
                                                      stats[m:].data_ptr(), stats[:m].data_ptr(), m, n, per_sm,
                                                      stream)

                    y.fill_(float("nan"))
                    stats.fill_(float("nan"))
                    grid = launch()
                    if grid < 0:
                        print(f"N={n:6d} {kind:3s} {tag}: {'not its width' if grid == -1 else 'launch error'}")
                        failed += grid == -2
                        continue
                    torch.cuda.synchronize()
                    msg, ok = "", True
                    if rep == 0 and (first is None or args.other_bits):
                        if ref is None:
                            ref = reference(ln, x, gb[:n], gb[n:])
                        yr, rsr, mur = ref
                        big = yr.abs() > 1e-2
                        ulp = torch.exp2(torch.floor(torch.log2(yr.abs().clamp_min(1e-30))) - 7)
                        worst = float(((y.double() - yr).abs() / ulp)[big].max())
                        rs_err = float(((stats[:m].double() - rsr).abs() / rsr).max())
                        mu_err = float((stats[m:].double() - mur).abs().max()) if ln else 0.0
                        ok = worst <= 2.0 and rs_err < 1e-5 and mu_err < 1e-5 and not torch.isnan(y).any()
                        msg = f"vs float64: worst {worst:.2f} bf16 ulps, rsigma rel {rs_err:.1e}, mu {mu_err:.1e}"
                    if rep == 0 and first is None:
                        first = (y.clone(), stats[:m].clone(), stats[m:].clone() if ln else None)
                    elif rep == 0:
                        same = (torch.equal(y.view(torch.int16), first[0].view(torch.int16))
                                and torch.equal(stats[:m].view(torch.int32), first[1].view(torch.int32))
                                and (not ln or torch.equal(stats[m:].view(torch.int32), first[2].view(torch.int32))))
                        ok = ok and (same or args.other_bits)
                        tail = "bit for bit the first build's" if same else "DIFFERS from the first build"
                        msg = f"{msg}; {tail}" if msg else tail
                    failed += not ok
                    us = device_us_per_call(launch)
                    pct = 100.0 * nbytes / (us * 1e3) / copy
                    print(f"N={n:6d} {kind:3s} rep {rep} {tag:15s} grid {grid:5d} {us:8.2f} us {pct:6.1f} %"
                          f"{'  ' + msg if msg else ''}{'  FAIL' if not ok else ''}")
    print(f"lean_lab: {failed} failed checks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
