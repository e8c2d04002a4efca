"""P85 experiment: the FP8 + transposed norm output from one Triton kernel whose programs own bands
of BAND rows: each band's rows are normalised and written rowwise (FP8), then, after a barrier,
the same program reads the band's rowwise bytes back (from L2, where they were just written) in
BAND x TN tiles and writes them transposed (BAND-byte runs per column). DRAM sees the minimum 4
bytes per value if the read-back hits L2, against the external path's 5. Timed against engine's
external path (both backends) in the same call; kernel time (summed device time per call), % of
copy at 4 bytes per value, M * N = 64M, bf16 in, e4m3 out, delayed scaling. Checks: transposed ==
rowwise.T bit for bit, and the rowwise bytes against engine's (the share of equal bytes, the
largest step apart).

    PYTHONPATH=$PWD python3 ci/band_exp.py [--n 1024 2048 ...] [--norms rms ln]
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

import engine  # noqa: E402
from engine.fp8 import Float8Quantizer  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402


@triton.jit
def _band_kernel(X, W, B, Y, Y8, YT, SCALE, AMAX, M, N, stride_x, eps,
                 IS_RMS: tl.constexpr, BLOCK_N: tl.constexpr, RB: tl.constexpr, BAND: tl.constexpr,
                 TN: tl.constexpr, X_POLICY: tl.constexpr, Y_POLICY: tl.constexpr, RB_POLICY: tl.constexpr,
                 RB_CACHE: tl.constexpr):
    pid = tl.program_id(0)
    nprog = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    g = tl.load(W + cols).to(tl.float32)
    if not IS_RMS:
        b = tl.load(B + cols).to(tl.float32)
    scale = tl.load(SCALE)
    amax = 0.0
    nbands = tl.cdiv(M, BAND)
    for band in range(pid, nbands, nprog):
        r0 = band * BAND
        for i in range(0, BAND, RB):
            rows = tl.cast(r0 + i + tl.arange(0, RB), tl.int64)
            x = tl.load(X + rows[:, None] * stride_x + cols[None, :], eviction_policy=X_POLICY).to(tl.float32)
            if IS_RMS:
                rstd = tl.rsqrt(tl.sum(x * x, 1) / N + eps)
                y = x * rstd[:, None] * g[None, :]
            else:
                mean = tl.sum(x, 1) / N
                xc = x - mean[:, None]
                rstd = tl.rsqrt(tl.sum(xc * xc, 1) / N + eps)
                y = xc * rstd[:, None] * g[None, :] + b[None, :]
            amax = tl.maximum(amax, tl.max(tl.max(tl.abs(y), 1), 0))
            q = (y * scale).to(Y.dtype.element_ty)
            tl.store(Y + rows[:, None] * N + cols[None, :], q, eviction_policy=Y_POLICY)
        tl.debug_barrier()
        rws = r0 + tl.arange(0, BAND)
        for c0 in range(0, N, TN):
            cc = c0 + tl.arange(0, TN)
            t = tl.load(Y8 + tl.cast(rws, tl.int64)[:, None] * N + cc[None, :], cache_modifier=RB_CACHE,
                        eviction_policy=RB_POLICY)
            tl.store(YT + tl.cast(cc, tl.int64)[:, None] * M + rws[None, :], tl.trans(t))
    bits = amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.atomic_max(AMAX.to(tl.pointer_type(tl.int32)), bits)


def external_baseline(norm: str, n: int, copy: float):
    """The inputs of one width (M * N = 64M, bf16, a delayed scale of 8) and engine's external
    FP8 + transposed path on both backends, printed as % of ``copy`` at 4 bytes per value (kernel
    time); returns (m, x, w, b, scale, gb, the CUDA backend's rowwise bytes). Shared by the
    in-kernel experiments (this file, ci/pc_exp.py)."""
    m = (64 << 20) // n
    torch.manual_seed(0)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.rand(n, device="cuda", dtype=torch.bfloat16) + 0.5
    b = torch.randn(n, device="cuda", dtype=torch.bfloat16) if norm == "ln" else w
    gb = m * n * 4 / 1e9
    scale = torch.full((1,), 8.0, device="cuda")
    line = f"{norm:3s} N={n:6d}:"
    ref = None
    for impl in ("cuda", "triton"):
        flag = "1" if impl == "triton" else "0"
        engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag,
                                        "ENGINE_USE_LAYERNORM_TRITON": flag,
                                        "ENGINE_USE_CAST_TRANSPOSE_TRITON": flag,
                                        "ENGINE_NORM_EXTERNAL_TRANSPOSE": "1"})
        qz = Float8Quantizer(scale, torch.zeros(1, device="cuda"), torch.float8_e4m3fn, columnwise=True)

        def call():
            with torch.no_grad():
                if norm == "rms":
                    return engine.rmsnorm(x, w, quantizer=qz)
                return engine.layernorm(x, w, b, quantizer=qz)

        us = device_us_per_call(call)
        line += f" {impl}-ext {100 * gb / (us * 1e-6) / copy:5.1f}"
        if impl == "cuda":
            ref = call().data.view(torch.uint8).clone()
    print(line, flush=True)
    return m, x, w, b, scale, gb, ref


def check_bytes(y, yt, ref):
    """(transposed == rowwise.T bit for bit, the share of rowwise bytes equal to ``ref``, the
    largest byte distance from it) of an FP8 + transposed output. Shared with ci/pc_exp.py."""
    yu = y.view(torch.uint8)
    t_ok = torch.equal(yt.view(torch.uint8), yu.t())
    eq = (yu == ref).float().mean().item()
    step = (yu.to(torch.int16) - ref.to(torch.int16)).abs().max().item()
    return t_ok, eq, step


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--norms", nargs="*", default=["rms", "ln"])
    ap.add_argument("--n", type=int, nargs="*", default=[1024, 2048, 4096, 8192, 16384])
    ap.add_argument("--quick", action="store_true", help="fewer variants")
    ap.add_argument("--seconds", type=float, default=1e9, help="stop after this many seconds")
    args = ap.parse_args()
    deadline = time.time() + args.seconds
    copy = H.copy_bandwidth()["gbps"]
    print(f"copy bandwidth {copy:.0f} GB/s", flush=True)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    for norm, n in itertools.product(args.norms, args.n):
        if n > 16384 or n & (n - 1):
            print(f"N={n}: skipped (powers of two up to 16K only)")
            continue
        m, x, w, b, scale, gb, ref = external_baseline(norm, n, copy)
        y = torch.empty(m, n, device="cuda", dtype=torch.float8_e4m3fn)
        yt = torch.empty(n, m, device="cuda", dtype=torch.float8_e4m3fn)
        amax = torch.zeros(1, device="cuda")
        rbs = [1, 2, 4] if n <= 2048 else ([1, 2] if n <= 4096 else [1])
        warps = [4, 8] if n <= 4096 else ([8, 16] if n <= 16384 else [16, 32])
        variants = []
        for rb, nw, pps, band, tn, pol in itertools.product(rbs, warps, [1, 2, 4], [32, 64], [64, 128],
                                                            ["hint", "hint-ef", "none"]):
            if rb * n > 16384 or (args.quick and (pol == "hint-ef" or tn == 64)):
                continue
            variants.append((rb, nw, pps, band, tn, pol))
        best = None
        for rb, nw, pps, band, tn, pol in variants:
            grid = min(sms * pps, -(-m // band))
            # x's loads evict_first, the rowwise stores evict_last; the read-back .cg (L2 only) or
            # evict_first (ptxas refuses both on one load)
            pols = {"hint": ("evict_first", "evict_last", "", ".cg"),
                    "hint-ef": ("evict_first", "evict_last", "evict_first", ""),
                    "none": ("", "", "", "")}[pol]
            y.view(torch.uint8).fill_(0xFF)
            yt.view(torch.uint8).fill_(0xFF)

            def f():
                _band_kernel[(grid,)](x, w, b, y, y.view(torch.uint8), yt.view(torch.uint8), scale, amax, m, n,
                                      x.stride(0), 1e-5 if norm == "ln" else 1e-6, IS_RMS=norm == "rms",
                                      BLOCK_N=n, RB=rb, BAND=band, TN=tn,
                                      X_POLICY=pols[0], Y_POLICY=pols[1], RB_POLICY=pols[2], RB_CACHE=pols[3],
                                      num_warps=nw)
            try:
                f()
                torch.cuda.synchronize()
            except Exception as e:  # noqa: BLE001
                print(f"  rb{rb} w{nw} p{pps} band{band} tn{tn} {pol}: ERROR {str(e)[:160]}", flush=True)
                continue
            t_ok, eq, step = check_bytes(y, yt, ref)
            us = device_us_per_call(f)
            pct = 100 * gb / (us * 1e-6) / copy
            print(f"  rb{rb} w{nw} p{pps} band{band} tn{tn} {pol}: {pct:5.1f} %  T==rowwise.T {t_ok}  "
                  f"bytes equal to cuda {100 * eq:.3f} %  max step {step}", flush=True)
            if best is None or pct > best[0]:
                best = (pct, rb, nw, pps, band, tn, pol)
        print(f"  best {best}", flush=True)
        if time.time() > deadline:
            print("time limit reached", flush=True)
            break
        del x, y, yt
        torch.cuda.empty_cache()
    return 0


if __name__ == "__main__":
    sys.exit(main())
