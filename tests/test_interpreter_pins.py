"""Pins of Triton-interpreter behaviour that engine works around (TRITON_INTERPRET=1 only).

1. fp32 -> fp8 casts do not round to nearest even (and lose the mantissa carry), and the e4m3 cast
   turns NaN into a finite value;
2. fp32 -> bf16 casts truncate.

The kernels take an ``INTERPRETER`` constexpr that rounds in fp32 / integer arithmetic first
(``engine.triton_kernels.utils``); on the GPU the hardware conversion is used. When a Triton release
fixes the interpreter, the ``*_is_still_wrong`` tests fail: then drop the workaround.
"""

from __future__ import annotations

import pytest
import torch

from conftest import INTERPRET

pytestmark = pytest.mark.skipif(not INTERPRET, reason="pins TRITON_INTERPRET=1 behaviour")

if INTERPRET:
    import triton
    import triton.language as tl

    from engine.fp8 import fp8_format
    from engine.triton_kernels.utils import _cast, _fp8_saturate_cast

    @triton.jit
    def _native(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, tl.load(X + i).to(Y.dtype.element_ty))

    @triton.jit
    def _fixed_fp8(X, Y, fp8_max, MANT: tl.constexpr, MIN_EXP: tl.constexpr, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, _fp8_saturate_cast(tl.load(X + i), fp8_max, Y.dtype.element_ty, True, MANT, MIN_EXP))

    @triton.jit
    def _fixed_bf16(X, Y, N: tl.constexpr):
        i = tl.arange(0, N)
        tl.store(Y + i, _cast(tl.load(X + i), Y.dtype.element_ty, True))


N = 1 << 14


def _values():
    x = torch.randn(N) * 30
    x[:8] = torch.tensor([7.82, 0.49, 8.5, -8.5, 0.0, 1e-9, 1000.0, -1e6])
    return x


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2, torch.bfloat16])
def test_native_cast_is_still_wrong(dtype):
    x = _values()
    y = torch.empty(N, dtype=dtype)
    src = x.clamp(-fp8_format(dtype).max, fp8_format(dtype).max) if dtype != torch.bfloat16 else x
    _native[(1,)](src, y, N=N)
    wrong = (y.float() != src.to(dtype).float()).sum().item()
    assert wrong > 0, f"the interpreter's {dtype} cast is now correct: drop the INTERPRETER workaround"


def test_native_fp8_cast_of_nan_is_still_wrong():
    """e4m3 only: the interpreter's e5m2 cast keeps NaN."""
    x = torch.full((16,), float("nan"))
    y = torch.empty(16, dtype=torch.float8_e4m3fn)
    _native[(1,)](x, y, N=16)
    assert not torch.isnan(y.float()).any(), (
        "the interpreter's e4m3 cast keeps NaN now: drop the NaN lanes of the INTERPRETER workaround")


@pytest.mark.parametrize("dtype", [torch.float8_e4m3fn, torch.float8_e5m2])
def test_fp8_workaround_matches_torch(dtype):
    fmt = fp8_format(dtype)
    x = _values()
    x = torch.cat([x, torch.randn(N) * 1e-3, torch.randn(2 * N) * 1e-6])  # normals and subnormals
    x[9] = float("nan")
    x[10] = -float("nan")
    y = torch.empty(x.numel(), dtype=dtype)
    _fixed_fp8[(1,)](x, y, fmt.max, MANT=fmt.mantissa_bits, MIN_EXP=fmt.min_normal_exp, N=x.numel())
    expect = x.clamp(-fmt.max, fmt.max).to(dtype)  # NaN stays NaN through clamp and cast
    finite = ~torch.isnan(x)
    assert torch.equal(y.view(torch.uint8)[finite], expect.view(torch.uint8)[finite])
    assert torch.isnan(y[~finite].float()).all()


def test_bf16_workaround_matches_torch():
    x = torch.cat([_values(), torch.tensor([float("inf"), -float("inf"), 3.4e38] * 2 + [1.0, 2.0])])
    n = 1 << 15
    x = torch.cat([x, torch.randn(n - x.numel())])
    y = torch.empty(n, dtype=torch.bfloat16)
    _fixed_bf16[(1,)](x, y, N=n)
    assert torch.equal(y.view(torch.int16), x.to(torch.bfloat16).view(torch.int16))
