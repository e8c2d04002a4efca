"""GPU diagnosis of the Triton in-kernel transposed FP8 store (run by hand on the device machine).

The norm kernel's transposed store wrote wrong bytes on triton 3.6 when N % 16 == 0 (N=1000 and odd
N were right: ci/diag.py). This compiles variants of the kernel (other specialisations, stage counts,
warps, tiles) and prints, per variant, the mismatches of the rowwise data against the rowwise-only
launch and of transpose_data against data.T over a grid of (M, N). On the H200
(benchmarks/results/h200_diag_transpose*.log) only the variants that do not specialise N were right
(bounding the store by an unspecialised copy of N was not enough), so the transposed path runs
``norms._norm_fwd_kernel_t``, compiled with ``do_not_specialize=["N"]`` ("shipped" below).
The rowwise mismatches are expected to be small and nonzero: the transposed path reduces the
statistics over column chunks, another summation order than the rowwise-only launch.
"""

import sys

import torch
import triton

import engine
from engine.triton_kernels import norms as nm
from engine.triton_kernels import norms_common as nc
from engine.triton_kernels.launch import Launcher

DEV = "cuda" if torch.cuda.is_available() else "cpu"
BASE = nm._norm_fwd_kernel
BASE_LAUNCH = nm._FWD_T
SHAPES = [(m, n) for n in (1000, 1024, 4096, 8208, 17389) for m in (1, 33, 64, 200)]
if DEV == "cpu":  # a dry run of the script under TRITON_INTERPRET=1
    SHAPES = [(33, 1024), (5, 17)]


def variants():
    fn = BASE.fn
    yield "shipped", nm._norm_fwd_kernel_t, None
    yield "specialised", BASE, None  # the default JIT specialisation: the miscompile
    yield "nospec-M", triton.jit(fn, do_not_specialize=["M"]), None
    yield "nospec-MN", triton.jit(fn, do_not_specialize=["M", "N"]), None
    yield "stages1", BASE, dict(num_stages=1)
    yield "warps8", BASE, dict(num_warps=8)
    yield "tile32", BASE, dict(block_m=32, block_n=32)


def run(name, kernel, over):
    nm._FWD_T = Launcher(kernel)
    bad_t = bad_row = 0
    for m, n in SHAPES:
        base = nc.fwd_config(n, torch.bfloat16, True)
        kw = dict(block_m=base.block_m, block_n=min(base.block_n, triton.next_power_of_2(n)),
                  num_warps=base.num_warps, programs_per_sm=base.programs_per_sm, num_stages=base.num_stages)
        kw.update(over or {})
        kw["block_n"] = min(kw["block_n"], triton.next_power_of_2(n))
        cfg = nc.NormConfig(kw["block_m"], kw["block_n"], n > kw["block_n"], kw["num_warps"],
                            kw["programs_per_sm"], kw["num_stages"])
        x = torch.randn(m, n, device=DEV, dtype=torch.bfloat16)
        w = torch.randn(n, device=DEV, dtype=torch.bfloat16)
        rs = torch.empty(m, device=DEV)
        out = torch.full((m, n), 0x7F, device=DEV, dtype=torch.uint8).view(torch.float8_e4m3fn)
        out_t = torch.full((n, m), 0x7F, device=DEV, dtype=torch.uint8).view(torch.float8_e4m3fn)
        scale, amax, sinv = torch.ones(1, device=DEV), torch.zeros(1, device=DEV), torch.empty(1, device=DEV)
        nm.launch_fwd(x, w, None, None, 1e-6, out, None, None, rs, scale, amax, sinv, out_t,
                      is_rms_norm=True, zero_centered_gamma=False, current_scaling=False,
                      amax_epsilon=0.0, sm_margin=0, config=cfg)
        ref = torch.empty_like(out)
        nm._FWD_T = BASE_LAUNCH
        nm.launch_fwd(x, w, None, None, 1e-6, ref, None, None, rs, scale, torch.zeros(1, device=DEV),
                      sinv, None, is_rms_norm=True, zero_centered_gamma=False, current_scaling=False,
                      amax_epsilon=0.0, sm_margin=0)
        nm._FWD_T = Launcher(kernel)
        u, r, ut = out.view(torch.uint8), ref.view(torch.uint8), out_t.view(torch.uint8)
        bad_row += int((u != r).sum())
        d = int((ut != u.t()).sum())
        bad_t += d
        if d and "-v" in sys.argv:
            print(f"   {name} M={m} N={n}: transposed {d}", flush=True)
    nm._FWD_T = BASE_LAUNCH
    print(f"variant {name:12s} rowwise mismatches {bad_row:8d}  transposed mismatches {bad_t:8d}", flush=True)


if __name__ == "__main__":
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1"})
    for name, kernel, over in variants():
        try:
            run(name, kernel, over)
        except Exception as e:  # a variant that does not compile is a result too
            print(f"variant {name:12s} failed: {type(e).__name__}: {str(e)[:200]}", flush=True)
