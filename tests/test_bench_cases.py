"""The benchmark harness's cases (benchmarks/cases.py) on small shapes: every mode builds, runs and
passes its own float64 check for engine's backends and the eager peer, so that a broken case (a
mode whose call or outputs no longer match the engine API) fails here, in CI, rather than in a
GPU benchmark run. On the CPU engine runs its Triton kernels in the interpreter (L0); on the GPU
both backends (L1). The timed sweeps themselves are GPU-only (benchmarks/test_bench_norms.py).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

from conftest import ON_GPU

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the repository root: benchmarks/
from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402

IMPLS = ["triton", "eager"] + (["cuda"] if ON_GPU else [])
MODES = [(norm, mode) for norm in ("rmsnorm", "layernorm") for mode in C.NORM_MODES + C.FP8_MODES
         if not (mode == "cast-T" and norm == "layernorm")]
M, N = 40, 200  # N not a multiple of 16; M not a multiple of a transpose tile


@pytest.mark.parametrize("impl", IMPLS)
@pytest.mark.parametrize("norm,mode", MODES, ids=[f"{n}-{m}" for n, m in MODES])
def test_case_matches_oracle(norm, mode, impl):
    if impl not in C.impls_for(norm, mode):
        pytest.skip(f"{impl} does not take part in {mode}")
    spec = C.Spec(norm, mode, impl)
    inp = C.make_inputs(norm, mode, M, N, H.device())
    try:
        case = C.build(spec, inp)
        outs = case.outputs(case.first)
        errs = C.check(spec, inp, outs)
    finally:
        H.reset_backend()
    expected = {"fwd": {"y"}, "fwd+bwd": {"dx"}, "res-fwd": {"y", "res"}, "fp8-delayed": {"q"},
                "fp8-current": {"q"}, "fp8-T": {"q", "qt"}, "res-fp8": {"q", "res"},
                "cast-T": {"q", "qt"}}[mode]
    assert set(errs) == expected, errs  # every output of the mode was checked
    assert C.check_ok(errs), errs
    if mode == "res-fp8":  # the residual_out is the exact rounded sum
        assert torch.equal(outs["res"], inp["x"] + inp["r"])


def test_nbytes_res_fp8():
    """The residual form to FP8 moves the FP8 form's bytes plus the residual read and
    residual_out written (bf16), nothing else."""
    for norm in ("rmsnorm", "layernorm"):
        fp8 = C.nbytes(C.Spec(norm, "fp8-delayed", "cuda"), M, N)
        res = C.nbytes(C.Spec(norm, "res-fp8", "cuda"), M, N)
        assert res - fp8 == 2 * M * N * 2
