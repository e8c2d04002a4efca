"""GPU diagnostics for two open bugs (run by hand on the device machine; prints one line per case).

1. --transpose: the Triton in-kernel FP8 transpose over a grid of (M, N); prints the mismatch count
   of transpose_data vs data.T per case and whether it repeats.
2. --crash: the binding call that crashed a process (an expanded output tensor); run it under
   cuda-gdb for a native backtrace.
"""

import sys

import torch

import engine
from engine.fp8 import Float8Quantizer


def transpose_grid():
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1", "ENGINE_USE_CAST_TRANSPOSE_TRITON": "1",
                                    "ENGINE_NORM_EXTERNAL_TRANSPOSE": "0"})
    total = {"norm": 0, "cast": 0}
    for n in (1000, 1024, 4000, 4096, 8192, 17389):
        for m in (1, 16, 32, 33, 40, 48, 64, 96, 200):
            line = []
            for kind in ("norm", "cast"):
                x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                w = torch.ones(n, device="cuda", dtype=torch.bfloat16)
                q = Float8Quantizer(torch.ones(1, device="cuda"), torch.zeros(1, device="cuda"),
                                    torch.float8_e4m3fn, columnwise=True)
                with torch.no_grad():
                    t = engine.rmsnorm(x, w, quantizer=q) if kind == "norm" else engine.cast_transpose(x, q)
                d = int((t.transpose_data.view(torch.uint8) != t.data.view(torch.uint8).t()).sum())
                total[kind] += d
                line.append(f"{kind} {d}")
            print(f"transpose M={m} N={n}: " + ", ".join(line), flush=True)
    print("transpose mismatches in all:", total, flush=True)


def crash():
    from engine import cuda_backend

    x = torch.randn(4, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.ones(64, device="cuda", dtype=torch.bfloat16)
    rs = torch.ones(4, device="cuda")
    out = torch.empty(64, device="cuda", dtype=torch.bfloat16).expand(4, 64)
    print("calling norm_fwd with an expanded out", flush=True)
    try:
        cuda_backend.norm_fwd(x, w, None, None, 1e-5, out, None, None, rs, None, None, None, None,
                              is_rms_norm=True, zero_centered_gamma=False, current_scaling=False,
                              amax_epsilon=0.0, sm_margin=0)
    except RuntimeError as e:
        print("raised:", e, flush=True)


if __name__ == "__main__":
    if "--transpose" in sys.argv:
        transpose_grid()
    if "--crash" in sys.argv:
        crash()
