"""Q43 (benchmarks/NOTES.md): the lean forwards of ``ci/fwd_lab.cu`` beside engine's CUDA and
Triton forwards, in the tables' measure (profile_kernels: summed kernel time per call, the median
of 15 calls; % of the copy bandwidth of ``benchmarks/harness.copy_bandwidth`` at the minimum bytes
of ``harness.bytes_norm_fwd``), bf16 in and out, M * N = 64M, one process.

    nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -DFWD_LAB_LIB -o /tmp/fwd_lab.so ci/fwd_lab.cu
    PYTHONPATH=$PWD python3 ci/fwd_lab.py --so /tmp/fwd_lab.so [--n 4096 8192 16384] [--norms rms ln]

Each lab variant's output is checked against a float64 norm of the same x, gamma (and beta) at
the lab's eps (1e-6): the largest error in bf16 steps of the reference (<= 1 expected).
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

MODES = {"copy": 0, "scale": 1, "rms": 2, "ln": 3}


def max_err_steps(y: torch.Tensor, ref: torch.Tensor) -> float:
    """Largest |y - ref| in bf16 steps (2^-7 relative) of max(|ref|, 1), over the whole output:
    LayerNorm's y = t * gamma + beta crosses zero, where a step of |ref| itself is meaningless."""
    step = ref.abs().clamp_min(1.0) * 2.0 ** -7
    return float(((y.double() - ref) / step).abs().max())


def reference(kind: str, x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    xd, gd, bd = x.double(), g.double(), b.double()
    if kind == "rms":
        return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + 1e-6) * gd
    mean = xd.mean(-1, keepdim=True)
    var = (xd - mean).pow(2).mean(-1, keepdim=True)
    return (xd - mean) * torch.rsqrt(var + 1e-6) * gd + bd


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--so", required=True, help="the library form of ci/fwd_lab.cu")
    ap.add_argument("--n", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument("--norms", nargs="*", default=["rms", "ln"], choices=["rms", "ln"])
    ap.add_argument("--nv", type=int, nargs="*", default=[8, 4], choices=[4, 8])
    ap.add_argument("--flags", action="store_true",
                    help="Q44: only the rms / ln variants at NV = 8, 2 CTAs per SM, with engine's per-CTA "
                         "gamma fill (flag 1), its per-row statistics store and IEEE 1 / sqrt (flag 2), both (3)")
    ap.add_argument("--grids", nargs="*", default=["resident", "16", "all"],
                    help="'resident' (the resident CTAs), an int k (k CTAs per SM), 'all' (a CTA per row block)")
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("fwd_lab: needs a GPU")
        return 0
    import engine

    lib = ctypes.CDLL(os.path.abspath(args.so))
    lib.lab_launch.restype = ctypes.c_longlong
    lib.lab_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong,
                               ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                               ctypes.c_void_p]
    lib.lab_regs.restype = ctypes.c_int
    lib.lab_launch_fl.restype = ctypes.c_longlong
    lib.lab_launch_fl.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_longlong, ctypes.c_void_p,
                                  ctypes.c_void_p, ctypes.c_void_p, ctypes.c_void_p, ctypes.c_longlong, ctypes.c_int,
                                  ctypes.c_void_p]
    copy = H.copy_bandwidth()["gbps"]
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy:.0f} GB/s; kernel time, % of copy")

    def pct(nbytes: int, us: float) -> float:
        return 100.0 * nbytes / (us * 1e3) / copy

    for n in args.n:
        m = (64 << 20) // n
        torch.manual_seed(n)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        gb = (torch.rand(2 * n, device="cuda") + 0.5).to(torch.bfloat16)
        g, b = gb[:n], gb[n:]
        y = torch.empty_like(x)
        stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
        for kind in args.norms:
            is_rms = kind == "rms"
            nbytes = H.bytes_norm_fwd(m, n, bias=not is_rms)
            for impl in ("cuda", "triton"):
                flag = "1" if impl == "triton" else "0"
                engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag, "ENGINE_USE_LAYERNORM_TRITON": flag})
                fn = (lambda: engine.rmsnorm(x, g, 1e-6)) if is_rms else (lambda: engine.layernorm(x, g, b, 1e-6))
                fn()
                us = device_us_per_call(fn)
                print(f"N={n:6d} {kind:3s} engine {impl:6s} {us:8.2f} us {pct(nbytes, us):6.1f} %")
            engine.backend.reset_for_tests()
            ref = reference(kind, x, g, b)
            stats = torch.empty(2 * m, device="cuda", dtype=torch.float32)
            if args.flags:  # Q44: engine's per-CTA / per-row work on the lab's rms / ln at NV = 8
                variants = [(8, kind, pf, 0, fl) for pf in (0, 1) for fl in (0, 1, 2, 3)]
            else:
                variants = [(nv, mode, pf, cap, 0) for nv in args.nv
                            for mode, pf, cap in ([("copy", 0, 0), ("copy", 1, 0), ("scale", 0, 0), ("scale", 1, 0)]
                                                  if is_rms else []) + [(kind, pf, cap) for cap in (0, 1)
                                                                        for pf in (0, 1)]]
            for nv, mode, pf, cap, fl in variants:
                regs = f"{lib.lab_regs(nv, MODES[mode], pf, cap):3d}" if not fl else "  -"  # flags: not listed
                label = f"{mode:5s} NV={nv} pf={pf} cap={cap} fl={fl} {regs} regs"
                for gname in args.grids:
                    grid = 0 if gname == "resident" else (1 << 40) if gname == "all" else int(gname) * sms

                    def launch():
                        if fl:
                            return lib.lab_launch_fl(MODES[mode], pf, fl, grid, x.data_ptr(), gb.data_ptr(),
                                                     y.data_ptr(), stats.data_ptr(), m, n, stream)
                        return lib.lab_launch(nv, MODES[mode], pf, cap, grid, x.data_ptr(), gb.data_ptr(),
                                              y.data_ptr(), m, n, stream)

                    y.fill_(float("nan"))
                    used = launch()
                    if used < 0:
                        print(f"N={n:6d} {kind:3s} lab {label}: not launched ({used})")
                        break
                    torch.cuda.synchronize()
                    check = (f"  err {max_err_steps(y, ref):.2f} steps" if mode in ("rms", "ln") else
                             f"  {int((y != x).sum())} values differ" if mode == "copy" else "")
                    us = device_us_per_call(launch)
                    print(f"N={n:6d} {kind:3s} lab {label} grid {gname:>8s} ({used:5d}) {us:8.2f} us "
                          f"{pct(nbytes, us):6.1f} %{check}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
