"""One norm forward (or backward) call for an ncu profile (run by hand on the device machine):

    ncu --kernel-name regex:norm_fwd -c 1 python3 ci/ncu_case.py cuda 4096 fp8 [ln]
    ncu --kernel-name regex:norm_bwd -c 1 python3 ci/ncu_case.py triton 16384 bwd ln
    ncu ... python3 ci/ncu_case.py cuda 8192 fp8 norm_fwd_grid_per_sm=16
    args: backend (cuda | triton), N, output (bf16 | fp8 | fp8T: e4m3 with the transposed copy
    written by the norm kernel, ENGINE_NORM_EXTERNAL_TRANSPOSE=0; res: bf16 with the fused add of
    a bf16 residual; bwd: a bf16 forward, then its backward), optionally the norm (rms, the default, or ln: LayerNorm with a bias);
    M * N = 64M (M = $NCU_CASE_ROWS where that is set, e.g. 32 for the small shapes), bf16 input.
    Any argument NAME=VALUE sets the engine.cuda_backend knob NAME to the int VALUE for the run
    (e.g. norm_fwd_grid_per_sm=16).
"""

import contextlib
import os
import sys

import torch

import engine
from engine.fp8 import Float8Quantizer

pos = [a for a in sys.argv[1:] if "=" not in a]
knobs = [a.split("=", 1) for a in sys.argv[1:] if "=" in a]
backend, n, out = pos[0], int(pos[1]), pos[2]
if backend not in ("cuda", "triton") or out not in ("bf16", "fp8", "fp8T", "res", "bwd") \
        or (len(pos) > 3 and pos[3] not in ("rms", "ln")):
    sys.exit(f"ncu_case.py: bad arguments {pos} (see the docstring)")  # e.g. "e4m3" is "fp8" here
ln = len(pos) > 3 and pos[3] == "ln"
stack = contextlib.ExitStack()
if knobs:
    from engine import cuda_backend

    for name, value in knobs:
        stack.enter_context(getattr(cuda_backend, name)(int(value)))
flag = "1" if backend == "triton" else "0"
engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag, "ENGINE_USE_LAYERNORM_TRITON": flag,
                                "ENGINE_NORM_EXTERNAL_TRANSPOSE": "0" if out == "fp8T" else "1"})
m = int(os.environ.get("NCU_CASE_ROWS", "0")) or (64 << 20) // n
x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
b = torch.randn(n, device="cuda", dtype=torch.bfloat16)
r = torch.randn(m, n, device="cuda", dtype=torch.bfloat16) if out == "res" else None
q = None
if out in ("fp8", "fp8T"):
    q = Float8Quantizer(torch.full((1,), 32.0, device="cuda"), torch.zeros(1, device="cuda"),
                        torch.float8_e4m3fn, columnwise=out == "fp8T")
if out == "bwd":
    for p in (x, w, b):
        p.requires_grad_()
    dy = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(3):
        y = engine.layernorm(x, w, b) if ln else engine.rmsnorm(x, w)
        torch.autograd.grad(y, (x, w, b) if ln else (x, w), dy)
else:
    with torch.no_grad():
        for _ in range(3):
            if ln:
                engine.layernorm(x, w, b, quantizer=q, residual=r)
            else:
                engine.rmsnorm(x, w, quantizer=q, residual=r)
torch.cuda.synchronize()
