"""The one tolerance table of the test suite.

Element-wise checks use ``torch.testing.assert_close(actual, expected, **tol)`` against the float64
oracle. Entries are set by the output dtype's rounding plus fp32 arithmetic:

* a 16-bit output is the correctly rounded fp32 value, off the exact value by at most half an ulp
  (relative 2**-9 .. 2**-8 for bf16, 2**-12 .. 2**-11 for fp16) plus a few fp32 ulps;
* fp32 outputs carry the fp32 arithmetic error of sums over N terms and of rsqrt (~1e-6 relative);
* backward outputs subtract per-row constants (cancellation), so they get an absolute floor.

Reductions over rows (dweight, dbias) are checked by relative norm error ``|a - e| / |e|``.
"""

import torch

FWD = {
    torch.float32: dict(rtol=1e-5, atol=1e-5),
    torch.float16: dict(rtol=5e-4, atol=1e-5),
    torch.bfloat16: dict(rtol=4e-3, atol=1e-5),
}

BWD = {
    torch.float32: dict(rtol=1e-4, atol=1e-4),
    torch.float16: dict(rtol=1e-3, atol=1e-3),
    torch.bfloat16: dict(rtol=8e-3, atol=8e-3),
}

STATS = dict(rtol=1e-5, atol=1e-6)

#: relative norm error of dweight / dbias, by the parameter dtype
REDUCTION = {torch.float32: 1e-5, torch.float16: 1e-3, torch.bfloat16: 8e-3}

#: LayerNorm of rows with mean 1e4 and unit noise in fp32: the fp32 mean itself carries an error of
#: about log2(N) * 2**-24 * 1e4 ~ 1e-3 (any fp32 algorithm), so y gets that absolute error. A
#: E[x^2] - E[x]^2 variance would be off by ~1e8 * 2**-24 ~ 6 and fails by far (the test checks that).
LARGE_MEAN_FP32 = dict(rtol=1e-3, atol=5e-3)

#: LayerNorm y of 16-bit rows of mean ~300 and unit noise (tests/test_norm_contract.py): the fp32
#: mean's error, up to log2(N) half-ulps of 300 (14 x 1.5e-5 = 2.1e-4 at N = 16K: fp16 rows on
#: steps of 0.25 do not sum exactly in fp32), times |gamma| <= ~3.3, is up to 7e-4 absolute before
#: the output's own rounding (rtol of FWD).
LARGE_MEAN_300_ATOL = 1e-3


def rel_err(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """``|actual - expected| / |expected|`` in float64 (0 if both are zero)."""
    a = actual.double()
    e = expected.double()
    den = e.norm().item()
    num = (a - e).norm().item()
    return num if den == 0 else num / den
