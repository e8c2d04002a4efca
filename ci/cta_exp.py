"""P86 experiment: Triton's forward of a wide row held whole in registers by one program spread over
a thread-block cluster (``num_ctas``), so that the row is read once (the blocked kernel re-reads
each chunk in pass 2 from L2, or DRAM where the rows in flight overflow it). Whether the GPU's
Triton lowers a row reduction across the CTAs of a cluster at all, then its kernel time against
engine's Triton forward in the same call (RMSNorm, bf16 in / out, M * N = 64M, % of copy at 4
bytes per value), with a float64 check.

    PYTHONPATH=$PWD python3 ci/cta_exp.py [--n 32768 65536 131072]
"""

from __future__ import annotations

import argparse
import itertools
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import engine  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402


@triton.jit
def _row_kernel(X, W, Y, M, N, eps, BLOCK_N: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)[None, :]  # a [1, N] tile (triton 3.6's CTA planner fails on 1-D)
    g = tl.load(W + cols).to(tl.float32)
    for r in range(pid, M, nprog):
        x = tl.load(X + tl.cast(r, tl.int64) * N + cols, eviction_policy="evict_first").to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
        tl.store(Y + tl.cast(r, tl.int64) * N + cols, (x * rstd[:, None] * g).to(Y.dtype.element_ty))


CTAS = [2, 4, 8, 16]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="*", default=[32768, 65536, 131072])
    ap.add_argument("--ctas", type=int, nargs="*", default=[2, 4, 8, 16])
    args = ap.parse_args()
    global CTAS
    CTAS = args.ctas
    print("triton", triton.__version__, flush=True)
    copy = H.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1"})
    for n in args.n:
        m = (64 << 20) // n
        torch.manual_seed(0)
        x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
        w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        gb = m * n * 4 / 1e9
        ref = engine.rmsnorm(x, w)
        us = device_us_per_call(lambda: engine.rmsnorm(x, w))
        print(f"N={n}: engine triton {100 * gb / (us * 1e-6) / copy:5.1f} %", flush=True)
        xd = x[:64].double()
        exact = (xd * torch.rsqrt((xd * xd).mean(1, keepdim=True) + 1e-6) * w.double())
        for ctas, warps, per_sm in itertools.product(CTAS, [16, 32], [1, 2]):
            if n // (ctas * warps * 32) > 128 or n // (ctas * warps * 32) < 8:
                continue
            grid = max(1, min(m, sms * per_sm // ctas))
            y = torch.full_like(x, float("nan"))

            def f():
                _row_kernel[(grid,)](x, w, y, m, n, 1e-6, BLOCK_N=n, num_warps=warps, num_ctas=ctas)
            try:
                f()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                msg = [ln for ln in str(e).splitlines() if "error" in ln.lower()][:2]
                print(f"  ctas {ctas} warps {warps}: ERROR {type(e).__name__}: {msg}", flush=True)
                continue
            err = (y[:64].double() - exact).abs().max().item()
            same = torch.equal(y, ref)
            us = device_us_per_call(f)
            print(f"  ctas {ctas} warps {warps} clusters/SM {per_sm / ctas:.2f}: "
                  f"{100 * gb / (us * 1e-6) / copy:5.1f} %  max err vs float64 {err:.3g}  "
                  f"== engine {same}", flush=True)
        del x, y, ref
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
