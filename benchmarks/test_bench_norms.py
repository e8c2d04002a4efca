"""pytest-benchmark sweep of engine's backends: ``pytest benchmarks/ --benchmark-only`` (GPU only).

Parametrized over the backend (cuda, triton), the op mode and the hidden size N = 1K..128K at
M*N = 64M bf16 elements, plus the small shapes (host + device per call). The cases are those of
``benchmarks/run.py`` (``benchmarks.cases``), so each is checked against the float64 test oracle
before it is timed. pytest-benchmark times a call plus a device synchronize; ``extra_info`` carries
the do_bench median, GB/s over the fewest bytes and % of the copy bandwidth of this session. The
peers (torch eager / F / compile / Liger) are in ``benchmarks/run.py``, which prints them side by side.
"""

from __future__ import annotations

import pytest
import torch

from benchmarks import cases as C
from benchmarks import harness as H

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the benchmarks need a CUDA device")

BACKENDS = ("cuda", "triton")
MODES = (
    ("rmsnorm", "fwd"), ("rmsnorm", "fwd+bwd"), ("rmsnorm", "res-fwd"),
    ("layernorm", "fwd"), ("layernorm", "fwd+bwd"), ("layernorm", "res-fwd"),
    ("rmsnorm", "fp8-delayed"), ("rmsnorm", "fp8-current"), ("rmsnorm", "fp8-T"), ("rmsnorm", "res-fp8"),
    ("rmsnorm", "cast-T"),
)


@pytest.fixture(scope="module")
def copy_gbps() -> float:
    return H.copy_bandwidth()["gbps"]


_UNAVAILABLE: dict = {}


def _require(backend: str) -> None:
    """Fail fast when a backend cannot run: try it once per session (the CUDA extension may
    JIT-build on first use, and would try again on every test after a failed build)."""
    if backend not in _UNAVAILABLE:
        try:
            H.use_backend(backend)
            _UNAVAILABLE[backend] = None
        except Exception as e:
            _UNAVAILABLE[backend] = H.short_error(e, 400)
        finally:
            H.reset_backend()
    if _UNAVAILABLE[backend]:
        pytest.fail(f"backend {backend} unavailable: {_UNAVAILABLE[backend]}")


def _run(benchmark, spec: C.Spec, m: int, n: int, copy_gbps: float, small: bool) -> None:
    _require(spec.impl.split("-")[0])
    inp = C.make_inputs(spec.norm, spec.mode, m, n, H.device())
    try:
        case = C.build(spec, inp)
        errs = C.check(spec, inp, case.outputs(case.first))
        case.first = None
        assert C.check_ok(errs), f"{spec} differs from the oracle: {errs}"

        def call():
            case.fn()
            torch.cuda.synchronize()

        benchmark.pedantic(call, rounds=50 if small else 20, iterations=1, warmup_rounds=3)
        ms = H.bench(case.fn)
        us = H.host_loop_us(case.fn) if small else ms * 1e3
        nb = C.nbytes(spec, m, n)
        benchmark.extra_info.update(
            backend=case.backend, M=m, N=n, bytes=nb, device_us=round(ms * 1e3, 2), us=round(us, 2),
            gbps=round(H.gbps(nb, us / 1e3), 1), pct_copy=round(100 * H.gbps(nb, us / 1e3) / copy_gbps, 1),
            timing="host loop" if small else "do_bench median")
    except C.Skip as e:
        pytest.skip(str(e))
    finally:
        H.reset_backend()
        del inp
        H.free_memory()


@pytest.mark.parametrize("n", H.SWEEP_N, ids=H.fmt_n)
@pytest.mark.parametrize("norm,mode", MODES, ids=[f"{a}-{b}" for a, b in MODES])
@pytest.mark.parametrize("backend", BACKENDS)
def test_sweep(benchmark, copy_gbps, backend, norm, mode, n):
    m, n = H.large_shape(n)
    benchmark.group = f"{norm} {mode} N={H.fmt_n(n)}"
    _run(benchmark, C.Spec(norm, mode, backend), m, n, copy_gbps, small=False)


@pytest.mark.parametrize("shape", H.SMALL_SHAPES, ids=lambda s: f"{s[0]}x{s[1]}")
@pytest.mark.parametrize("norm", ("rmsnorm", "layernorm"))
@pytest.mark.parametrize("backend", BACKENDS)
def test_small(benchmark, copy_gbps, backend, norm, shape):
    m, n = shape
    benchmark.group = f"{norm} fwd {m}x{n}"
    _run(benchmark, C.Spec(norm, "fwd", backend), m, n, copy_gbps, small=True)
