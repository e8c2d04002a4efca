"""Shared fixtures: the device under test and a backend axis.

L0 (CPU, CI): ``TRITON_INTERPRET=1`` is set for the whole run; backends are ``reference`` and
``triton`` (the interpreter). L1 (GPU): CUDA tensors, backends ``triton`` and ``cuda``. The
``backend`` fixture sets the family flags through ``engine.backend.reset_for_tests`` (the flags are
frozen per process otherwise) and checks the dispatcher really selected that backend.
"""

from __future__ import annotations

import os

import pytest
import torch

import engine
from engine.backend import Backend, OpFamily

INTERPRET = os.environ.get("TRITON_INTERPRET", "") == "1"
ON_GPU = torch.cuda.is_available() and not INTERPRET
DEVICE = torch.device("cuda") if ON_GPU else torch.device("cpu")
BACKENDS = ["triton", "cuda"] if ON_GPU else ["reference", "triton"]


def many_rows() -> int:
    """A row count past the CUDA forward's few-rows layout (4 vectors per thread for bf16 rows of
    1K-8K in calls of at most engine.cuda_backend.FEW_ROWS_PER_SM rows per SM: NOTES P146-P147),
    for the tests that tell the forward's paths apart by their bits: at few rows its register path
    adds a row's values in the blocked kernel's order at some widths. 301 off the GPU."""
    if not ON_GPU:
        return 301
    from engine.cuda_backend import FEW_ROWS_PER_SM

    return FEW_ROWS_PER_SM * gpu_sms() + 1


def gpu_sms() -> int:
    """The current GPU's SM count (the CUDA launchers' sm_count at sm_margin 0)."""
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def _cuda_profile(fn):
    """The torch profiler's record of one call of ``fn`` (CUDA activity, synchronized)."""
    from torch.profiler import ProfilerActivity, profile

    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    return prof


def cuda_kernel_names(fn):
    """Names of the CUDA kernels one call of ``fn`` launches (torch profiler)."""
    return [e.name for e in _cuda_profile(fn).events() if e.device_type == torch.autograd.DeviceType.CUDA]


def cuda_kernel_launches(fn):
    """(name, grid, block, args) of each CUDA kernel one call of ``fn`` launches, from the torch
    profiler's trace (Kineto's kernel events carry ``grid`` and ``block`` among their ``args``,
    with ``registers per thread`` and ``shared memory``)."""
    import json
    import os
    import tempfile

    prof = _cuda_profile(fn)
    with tempfile.TemporaryDirectory() as d:
        path = os.path.join(d, "trace.json")
        prof.export_chrome_trace(path)
        with open(path) as f:
            events = json.load(f).get("traceEvents", [])
    return [(e["name"], tuple(e["args"]["grid"]), tuple(e["args"]["block"]), e["args"]) for e in events
            if str(e.get("cat", "")).lower() == "kernel"]


def resident_bound(args) -> int:
    """CTAs of one profiled kernel launch (:func:`cuda_kernel_launches`' args) that a Hopper SM
    holds at once, at most: 2048 threads, 64K registers in 256-register units per warp, 228 KB of
    shared memory with 1 KB reserved per CTA, 32 CTAs. Computed from the trace apart from the
    CUDA driver's occupancy calculator that engine's launchers ask."""
    threads = 1
    for d in args["block"]:
        threads *= d
    warps = -(-threads // 32)
    by_regs = (65536 // (-(-args["registers per thread"] * 32 // 256) * 256)) // warps
    by_smem = 233472 // (args["shared memory"] + 1024)  # Kineto: static + dynamic
    return min(2048 // threads, by_regs, by_smem, 32)


_FLAGS = [
    "ENGINE_USE_RMSNORM_TRITON",
    "ENGINE_USE_LAYERNORM_TRITON",
    "ENGINE_USE_CAST_TRANSPOSE_TRITON",
]


def backend_env(name: str, **extra: str) -> dict:
    env = {flag: ("1" if name == "triton" else "0") for flag in _FLAGS}
    env["TRITON_INTERPRET"] = "1" if INTERPRET else ""
    env.update(extra)
    return env


def use_backend(name: str, **extra: str) -> None:
    """Point every op family at backend ``name`` (plus extra env settings) and verify it."""
    if name == "triton" and DEVICE.type == "cpu" and not INTERPRET:
        pytest.skip("the Triton backend on CPU needs TRITON_INTERPRET=1 (set by ci/L0.sh)")
    engine.backend.reset_for_tests(backend_env(name, **extra))
    for fam in (OpFamily.RMSNORM, OpFamily.LAYERNORM, OpFamily.CAST_TRANSPOSE):
        got = engine.backend.select_backend(fam, DEVICE)
        assert got is Backend(name), f"{fam} selected {got}, wanted {name}"


@pytest.fixture(params=BACKENDS)
def backend(request):
    use_backend(request.param)
    yield request.param
    engine.backend.reset_for_tests()


@pytest.fixture
def device():
    return DEVICE


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(1234)


def pytest_report_header(config):
    return f"engine tests: device={DEVICE} backends={BACKENDS} TRITON_INTERPRET={int(INTERPRET)}"
