"""Sweep the Triton transpose kernels' tile, warps and programs per SM (H100 / H200).

    python benchmarks/tune_transpose.py [--n 1024 8192] [--max-seconds 120]

Times ``engine.triton_kernels.transpose.cast_transpose`` (bf16 -> e4m3, delayed scaling, rowwise +
transposed) and ``fp8_transpose`` (the byte transpose behind the external ``+T`` path) at
M * N = 64M for each candidate (BLOCK_M, BLOCK_N, num_warps, programs per SM), set through the
module's ``CAST_CONFIG`` / ``COPY_CONFIG``, and prints GB/s from the minimum bytes as % of the copy
bandwidth measured in the same run, best first, beside the shipped configuration and, where the
extension loads, the CUDA backend's kernels for the same two ops.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from engine.triton_kernels import transpose as T  # noqa: E402

TILES = [(64, 64), (64, 128), (128, 64), (128, 128), (32, 128), (32, 256)]
WARPS = [4, 8]
PPS = [2, 4, 8]


def _set(name, cfg):
    if name == "castT":
        T.CAST_CONFIG = cfg
    else:
        T.COPY_CONFIG = cfg


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 8192])
    ap.add_argument("--max-seconds", type=float, default=120)
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("tune_transpose: needs a GPU")
        return 0
    copy = H.copy_bandwidth()["gbps"]
    shipped = {"castT": T.CAST_CONFIG, "fp8T": T.COPY_CONFIG}
    print(f"copy bandwidth {copy:.0f} GB/s; shipped (BLOCK_M, BLOCK_N, warps, programs/SM): {shipped}")
    t0 = time.perf_counter()
    dev = H.device()
    for n in args.n:
        m, n = H.large_shape(n)
        x = torch.randn(m, n, device=dev, dtype=torch.bfloat16)
        scale, amax, sinv = (torch.ones(1, device=dev), torch.zeros(1, device=dev), torch.ones(1, device=dev))
        q = torch.empty(m, n, device=dev, dtype=torch.float8_e4m3fn)
        qt = torch.empty(n, m, device=dev, dtype=torch.float8_e4m3fn)
        ops = {
            "castT": (lambda: T.cast_transpose(x, scale, amax, sinv, q, qt, current_scaling=False, amax_epsilon=0.0),
                      H.bytes_cast_transpose(m, n)),
            "fp8T": (lambda: T.fp8_transpose(q, qt), 2 * m * n),
        }
        for name, (fn, nbytes) in ops.items():
            res = []
            for tile, w, p in itertools.product(TILES, WARPS, PPS):
                if time.perf_counter() - t0 > args.max_seconds:
                    break
                cfg = (*tile, w, p)
                _set(name, cfg)
                try:
                    ms = H.bench(fn)
                except Exception as e:  # noqa: BLE001 - a config that fails is reported
                    print(f"  {name} N={n} {cfg}: {H.short_error(e)}")
                    continue
                res.append((100 * H.gbps(nbytes, ms) / copy, cfg))
            _set(name, shipped[name])
            base = 100 * H.gbps(nbytes, H.bench(fn)) / copy
            res.sort(reverse=True)
            print(f"{name} N={n}: shipped {base:.1f} %; best " +
                  ", ".join(f"{pct:.1f} % {c[0]}x{c[1]} w{c[2]} p{c[3]}" for pct, c in res[:5]), flush=True)
        cuda = _cuda_ops(x, scale, amax, sinv, q, qt)
        for name, fn in cuda.items():  # the CUDA backend's kernels for the same ops, beside them
            nbytes = H.bytes_cast_transpose(m, n) if name == "castT" else 2 * m * n
            print(f"{name} N={n}: cuda {100 * H.gbps(nbytes, H.bench(fn)) / copy:.1f} %", flush=True)
    return 0


def _cuda_ops(x, scale, amax, sinv, q, qt) -> dict:
    """The CUDA extension's cast_transpose and fp8_transpose on the same tensors, where the
    extension loads (else none)."""
    try:
        from engine import cuda_backend

        cuda_backend.ensure_available()
    except Exception as e:  # noqa: BLE001 - reported, the Triton sweep stands alone
        print(f"  cuda: not available ({H.short_error(e)})")
        return {}
    return {"castT": lambda: cuda_backend.cast_transpose(x, scale, amax, sinv, q, qt, current_scaling=False,
                                                         amax_epsilon=0.0),
            "fp8T": lambda: cuda_backend.fp8_transpose(q, qt)}


if __name__ == "__main__":
    sys.exit(main())
