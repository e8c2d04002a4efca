"""Q54 experiment: the tiled transpose of a norm's rowwise FP8 output, read right after the norm wrote
it (its bytes still in L2) against the same transpose after an L2 flush. The premise of a norm that
makes the transposed copy from its own rowwise bytes while they are in L2 (4 bytes per value moved
instead of the external path's 5) is that the transpose's reads then cost little.

For each width and rowwise size this times, by the torch profiler (median of 15), the norm kernel(s)
and the transpose kernel in two sequences: norm, transpose (hot) and norm, flush, transpose (cold).
GB/s of the transpose counts its 2 bytes per value (1 read, 1 written).

    PYTHONPATH=$PWD python3 ci/l2_hot_exp.py [--n 4096 16384 131072] [--mb 8 16 64]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import engine  # noqa: E402
from engine.fp8 import Float8Quantizer  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_events, median_per_call  # noqa: E402


def per_kernel_us(events, calls: int, key) -> float:
    """profile_kernels.median_per_call over the events whose kernel name satisfies ``key``."""
    return median_per_call([e for e in events if key(e.name)], calls)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, nargs="*", default=[4096, 16384, 131072])
    ap.add_argument("--mb", type=float, nargs="*", default=[8, 16, 32, 64])
    args = ap.parse_args()
    copy = H.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:.0f} GB/s")
    flush_buf = torch.empty(512 << 20, dtype=torch.uint8, device="cuda")
    is_t = lambda name: "transpose" in name  # noqa: E731
    is_norm = lambda name: "norm_fwd" in name  # noqa: E731
    for n in args.n:
        w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
        for mb in args.mb:
            m = max(16, int(mb * 2**20) // n // 16 * 16)
            x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
            q = Float8Quantizer(torch.full((1,), 8.0, device="cuda"), torch.zeros(1, device="cuda"),
                                torch.float8_e4m3fn)
            with torch.no_grad():
                ref = engine.rmsnorm(x, w, quantizer=q)
            t_ref = ref.data.view(torch.uint8).t().contiguous()
            res = {}
            for label, flush in (("hot", False), ("cold", True)):
                def step():
                    with torch.no_grad():
                        t = engine.rmsnorm(x, w, quantizer=q)
                    if flush:
                        flush_buf.zero_()
                    engine.fp8_transpose(t)
                    return t
                t = step()
                assert torch.equal(t.transpose_data.view(torch.uint8), t_ref), "transpose differs"
                ev = device_events(step, 15)
                res[label] = (per_kernel_us(ev, 15, is_norm), per_kernel_us(ev, 15, is_t))
            gb_t = m * n * 2 / 1e9
            gb_n = m * n * 3 / 1e9
            line = f"N={n:6d} M={m:6d} ({m * n / 2**20:5.1f} MB fp8):"
            for label, (un, ut) in res.items():
                line += (f" | {label}: norm {un:7.1f} us ({100 * gb_n / (un * 1e-6) / copy:5.1f} %),"
                         f" transpose {ut:7.1f} us ({100 * gb_t / (ut * 1e-6) / copy:5.1f} % at 2 B)")
            line += f" | hot/cold transpose {res['hot'][1] / res['cold'][1]:.2f}"
            print(line, flush=True)
            del x, ref, t_ref
    return 0


if __name__ == "__main__":
    sys.exit(main())
