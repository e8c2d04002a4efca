"""L2: randomized numerics sweep on the GPU (marked slow; ci/L2.sh).

Random shapes (N log-uniform up to 300K, tails of every width), random dtype combinations, both
norms, residual and zero-centred gamma on or off, FP8 with both transpose paths; every case checked
against the float64 oracle like the L0/L1 contract tests, on both GPU backends.
"""

from __future__ import annotations

import math
import random

import pytest
import torch

from conftest import ON_GPU, use_backend
from test_fp8 import fp8_steps
from test_norm_contract import check_bwd

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not ON_GPU, reason="GPU sweep")]

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16


def _cases(count, seed):
    rng = random.Random(seed)
    for i in range(count):
        n = max(1, int(math.exp(rng.uniform(0, math.log(300_000)))))
        m = max(1, min(int(math.exp(rng.uniform(0, math.log(4096)))), 40_000_000 // n))
        x_dtype = rng.choice([F32, F16, BF16])
        yield pytest.param(
            dict(m=m, n=n, is_rms=rng.random() < 0.5, x_dtype=x_dtype,
                 w_dtype=rng.choice([x_dtype, F32]), out_dtype=rng.choice([F32, F16, BF16]),
                 res_dtype=rng.choice([None, x_dtype, F32]), zcg=rng.random() < 0.3),
            id=f"case{i}-{m}x{n}")


@pytest.mark.parametrize("case", list(_cases(60, 2026)))
def test_random_norm_cases(backend, case):
    check_bwd(case["is_rms"], case["m"], case["n"], case["x_dtype"], case["w_dtype"], case["out_dtype"],
              zcg=case["zcg"], bias=not case["is_rms"], res_dtype=case["res_dtype"], row_extra=3)


@pytest.mark.parametrize("n", [1, 15, 16, 17, 127, 128, 129, 4095, 4097, 16383, 16385, 65537, 262144])
@pytest.mark.parametrize("external", ["0", "1"])
def test_fp8_transpose_widths(backend, n, external):
    """Transposed FP8 at every width class around tile and vector boundaries, on both paths."""
    import engine
    from engine.fp8 import Float8CurrentScalingQuantizer

    use_backend(backend, ENGINE_NORM_EXTERNAL_TRANSPOSE=external)
    for m in (1, 33, 255):
        x = torch.randn(m, n, device="cuda", dtype=BF16)
        w = torch.randn(n, device="cuda", dtype=BF16)
        with torch.no_grad():
            t = engine.rmsnorm(x, w, quantizer=Float8CurrentScalingQuantizer(torch.float8_e4m3fn, columnwise=True))
            y32 = engine.rmsnorm(x, w, out_dtype=F32)
        assert torch.equal(t.transpose_data.view(torch.uint8), t.data.view(torch.uint8).t())
        from reference import fp8_quantize

        expect = fp8_quantize(y32, (torch.tensor(448.0, device="cuda") / y32.abs().max()).item(),
                              torch.float8_e4m3fn)
        assert fp8_steps(t.data, expect).max().item() <= 1
