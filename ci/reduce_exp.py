"""Triton's dW / dB partials reduction alone, over its tile rules (NOTES P168 / P169 / P170): each
variant checked against a float64 sum and timed (kernel time under torch.profiler, the mean of 20
launches; the partials hot in L2, as after the backward that wrote them), at the partial shapes
the backward leaves on an H200 at M * N = 64M.

    python3 ci/reduce_exp.py      # on the GPU machine, repository root
"""
import sys

import torch
import triton
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, ".")
from engine.triton_kernels import norms_common as nc  # noqa: E402
from engine.triton_kernels.utils import sm_count  # noqa: E402

SMS = sm_count(torch.device("cuda"))
# (label, K, P, N): the base table's programs per SM (1K / 2K: 4 / 2; RMSNorm 4K-16K: 1; LayerNorm
# 4K: 2, 8K: 1), the split backward's row groups (SMs / G, G = N / 8192) from 16K (LayerNorm) /
# 32K (RMSNorm)
SHAPES = [("rms 1K", 1, 4 * SMS, 1024), ("ln 1K", 2, 4 * SMS, 1024), ("rms 2K", 1, 2 * SMS, 2048),
          ("ln 2K", 2, 2 * SMS, 2048), ("rms 4K", 1, SMS, 4096), ("ln 4K", 2, 2 * SMS, 4096),
          ("rms 8K", 1, SMS, 8192), ("ln 8K", 2, SMS, 8192), ("rms 16K", 1, SMS, 16384),
          ("ln 16K", 2, SMS // 2, 16384), ("ln 32K", 2, SMS // 4, 32768), ("rms 32K", 1, SMS // 4, 32768),
          ("ln 128K", 2, SMS // 16, 131072)]


def tile(k, p, n, values, min_bn, cover, max_bn=128, min_bp=32):
    """P168's rule with its constants as arguments: the widest column block from max_bn down to
    min_bn whose grid covers cover x SMs, BLOCK_P = values / BLOCK_N within [min_bp, next power of
    two of P] (P170's "wide" forms: max_bn 1024, min_bp 1)."""
    bn = max_bn
    while bn > min_bn and -(-n // bn) * k < cover * SMS:
        bn //= 2
    return bn, max(min_bp, min(values // bn, triton.next_power_of_2(p)))


# (name, values per step, narrowest block, grid cover in SMs, warps[, widest block, fewest rows per
# step]); "fixed" is the tile before P168
VARIANTS = [("fixed", None, None, None, 4), ("P168", 4096, 16, 1, 4), ("cover2", 4096, 16, 2, 4),
            ("min8", 4096, 8, 1, 4), ("wide", 4096, 16, 1, 4, 1024, 1),
            ("wide-c2", 4096, 16, 2, 4, 1024, 1), ("wide-c4", 4096, 16, 4, 4, 1024, 1),
            ("wide-c2-2048", 2048, 16, 2, 4, 1024, 1), ("wide-c2-8192", 8192, 16, 2, 4, 1024, 1),
            ("wide-c2-w8", 8192, 16, 2, 8, 1024, 1), ("c2-bp8", 4096, 16, 2, 4, 128, 8)]

for label, k, p, n in SHAPES:
    torch.manual_seed(0)
    part = torch.randn(k, p, n, device="cuda")
    want = part.double().sum(1)
    outs = [torch.empty(n, device="cuda", dtype=torch.bfloat16) for _ in range(k)]
    line = []
    for name, values, min_bn, cover, warps, *wide in VARIANTS:
        bn, bp = (128, 32) if values is None else tile(k, p, n, values, min_bn, cover, *wide)
        const = nc._REDUCE.constexprs(BLOCK_P=bp, BLOCK_N=bn, INTERPRETER=False)
        for o in outs:
            o.fill_(float("nan"))

        def f():
            nc._REDUCE.launch((-(-n // bn), k), (part, outs[0], outs[-1]), (p, n), warps, 3, const)

        f()
        torch.cuda.synchronize()
        err = max((outs[i].double() - want[i]).abs().max().item() for i in range(k))
        scale = want.abs().max().item()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(20):
                f()
            torch.cuda.synchronize()
        us = sum(e.device_time_total for e in prof.key_averages() if "reduce" in e.key) / 20
        ok = "" if err <= scale * 2 ** -7 else f" BAD err {err:.3g}"
        line.append(f"{name} {bn}x{bp}w{warps} {us:5.2f}{ok}")
    print(f"{label:8s} K{k} P{p:4d}: " + " | ".join(line), flush=True)
