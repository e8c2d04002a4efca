"""P78 experiment: the FP8 + transposed norm output as row chunks (the norm's rowwise FP8 of a chunk,
then the tiled transpose of that chunk while its bytes are still in L2), against the one-shot external
path. Kernel time (summed device time of every kernel one call launches), % of copy at 4 bytes per
value (bf16 in, FP8 rowwise + transposed out), M * N = 64M, H200.

    PYTHONPATH=$PWD python3 ci/chunk_exp.py [--impls cuda triton] [--chunk-mb 8 16 32]
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
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--impls", nargs="*", default=["cuda", "triton"])
    ap.add_argument("--norms", nargs="*", default=["rms", "ln"])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072])
    ap.add_argument("--chunk-mb", type=float, nargs="*", default=[8, 16, 32])
    args = ap.parse_args()
    copy = H.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:.0f} GB/s")
    for impl in args.impls:
        flag = "1" if impl == "triton" else "0"
        engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag, "ENGINE_USE_LAYERNORM_TRITON": flag,
                                        "ENGINE_USE_CAST_TRANSPOSE_TRITON": flag,
                                        "ENGINE_NORM_EXTERNAL_TRANSPOSE": "1"})
        for norm in args.norms:
            for n in args.n:
                m = (64 << 20) // n
                x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
                w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
                b = None if norm == "rms" else torch.randn(n, device="cuda", dtype=torch.bfloat16)

                def q(col):
                    return Float8Quantizer(torch.full((1,), 8.0, device="cuda"), torch.zeros(1, device="cuda"),
                                           torch.float8_e4m3fn, columnwise=col)

                def call(xx, quant):
                    with torch.no_grad():
                        if norm == "rms":
                            return engine.rmsnorm(xx, w, quantizer=quant)
                        return engine.layernorm(xx, w, b, quantizer=quant)

                qf, qr = q(True), q(False)
                full = lambda: call(x, qf)  # noqa: E731
                gb = m * n * 4 / 1e9
                us = device_us_per_call(full)
                line = f"{norm:3s} {impl:6s} N={n:6d}: one-shot {100 * gb / (us * 1e-6) / copy:5.1f} %"
                ref = full()
                for mb in args.chunk_mb:
                    mc = max(32, int(mb * 2**20) // n // 32 * 32)

                    def chunked():
                        outs = []
                        for r0 in range(0, m, mc):
                            t = call(x[r0:r0 + mc], qr)
                            engine.fp8_transpose(t)
                            outs.append(t)
                        return outs

                    us_c = device_us_per_call(chunked)
                    line += f" | {mb:g} MB chunks ({(m + mc - 1) // mc}) {100 * gb / (us_c * 1e-6) / copy:5.1f} %"
                    outs = chunked()
                    tt = torch.cat([o.transpose_data.view(torch.uint8) for o in outs], dim=1)
                    assert torch.equal(tt, ref.transpose_data.view(torch.uint8)), "chunked transpose differs"
                print(line, flush=True)
                del x, w, b, ref
                torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
