"""Kernel-level profile of fwd+bwd through autograd, per backend (where does the time go?)."""

import torch
from torch.profiler import ProfilerActivity, profile

import engine

for backend in ("triton", "cuda"):
    flag = "1" if backend == "triton" else "0"
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag})
    for m, n in ((65536, 1024), (8192, 8192)):
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        w = torch.ones(n, device="cuda", dtype=torch.bfloat16, requires_grad=True)
        dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        for _ in range(3):
            torch.autograd.grad(engine.rmsnorm(x, w), (x, w), dy)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                torch.autograd.grad(engine.rmsnorm(x, w), (x, w), dy)
            torch.cuda.synchronize()
        print(f"== {backend} {m}x{n}")
        for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:6]:
            print(f"  {e.key[:70]:70s} n={e.count:3d} avg={e.device_time_total / max(e.count, 1):8.1f} us")
