"""Kernel-level profile of fwd+bwd through autograd, per backend and norm (where does the time go?).

    python3 ci/profile_fwd_bwd.py [--n 1024 8192] [--norms rms ln] [--backends triton cuda]
        [--reduce-spread 0|1|2]

Rows of N bf16 elements, M * N = 64M (the benchmarks' shape), LayerNorm with a bf16 bias; each
kernel's mean device time per fwd+bwd, most expensive first.
"""

import argparse

import torch
from torch.profiler import ProfilerActivity, profile

import engine

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--n", type=int, nargs="*", default=[1024, 8192])
ap.add_argument("--norms", nargs="*", default=["rms"], choices=["rms", "ln"])
ap.add_argument("--backends", nargs="*", default=["triton", "cuda"], choices=["triton", "cuda"])
ap.add_argument("--reduce-spread", type=int, choices=[0, 1, 2],
                help="Triton's partials reduction tile rule (engine.triton_kernels.norms_common."
                     "REDUCE_SPREAD: 0 the fixed 128 x 32 tile, 1 P168's, 2 P170's)")
args = ap.parse_args()
if args.reduce_spread is not None:
    from engine.triton_kernels import norms_common

    norms_common.REDUCE_SPREAD = args.reduce_spread

for backend in args.backends:
    flag = "1" if backend == "triton" else "0"
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag, "ENGINE_USE_LAYERNORM_TRITON": flag})
    for norm in args.norms:
        for n in args.n:
            m = (64 << 20) // n
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            w = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            b = torch.randn(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
            dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            params = (x, w) if norm == "rms" else (x, w, b)

            def step():
                y = engine.rmsnorm(x, w) if norm == "rms" else engine.layernorm(x, w, b)
                return torch.autograd.grad(y, params, dy)

            for _ in range(3):
                step()
            torch.cuda.synchronize()
            reps = 5
            with profile(activities=[ProfilerActivity.CUDA]) as prof:
                for _ in range(reps):
                    step()
                torch.cuda.synchronize()
            print(f"== {backend} {norm} {m}x{n}")
            total = 0.0
            for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
                total += e.device_time_total / reps
                print(f"  {e.key[:70]:70s} n={e.count:3d} per fwd+bwd {e.device_time_total / reps:8.1f} us")
            print(f"  {'(these kernels)':70s}       per fwd+bwd {total:8.1f} us")
            del x, w, b, dy
