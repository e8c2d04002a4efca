"""Dispatch: flags read once and frozen, strict errors, describe(), one place reading the environment."""

from __future__ import annotations

import logging
import pathlib
import re

import pytest
import torch

import engine
from engine.backend import Backend, BackendUnavailableError, OpFamily

from conftest import INTERPRET, backend_env

ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture(autouse=True)
def _reset():
    yield
    engine.backend.reset_for_tests()


def test_flag_values_select_backends():
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1", "TRITON_INTERPRET": "1"})
    assert engine.backend.select_backend(OpFamily.RMSNORM, torch.device("cpu")) is Backend.TRITON
    assert engine.backend.select_backend(OpFamily.LAYERNORM, torch.device("cpu")) is Backend.REFERENCE
    d = engine.backend.describe()
    assert d["rmsnorm"] == {"cuda": "triton", "cpu": "triton", "flag": "ENGINE_USE_RMSNORM_TRITON=1"}
    assert d["layernorm"] == {"cuda": "cuda", "cpu": "reference", "flag": "ENGINE_USE_LAYERNORM_TRITON=0"}


@pytest.mark.parametrize("flag", [None, "0", "1"])
def test_external_transpose_by_width(flag):
    """ENGINE_NORM_EXTERNAL_TRANSPOSE set decides for every width and backend (True: the tiled
    transpose after the norm, False: the norm kernel); unset, rows wider than the backend's
    IN_KERNEL_TRANSPOSE_MAX_N take the tiled transpose (True) and the others leave the choice to
    the backend (None: ``out_t_auto``): CUDA up to 16384 for both norms (its band kernel where the
    card's defaults take it, its tile at 1K), Triton up to 4096 for RMSNorm (its bands, which
    norms.band_by_default takes up to 2048 on a card that is not lean) and never for LayerNorm,
    never on the reference (0); copies of at most the backend's SMALL_COPY_ROWS rows and the
    norm's SMALL_COPY_VALUES values take the tiled transpose as well (True, NOTES Q32-Q34)."""
    from engine import _norm_ops, cuda_backend, reference, triton_kernels

    engine.backend.reset_for_tests({} if flag is None else {"ENGINE_NORM_EXTERNAL_TRANSPOSE": flag})
    assert engine.backend.settings().norm_external_transpose is (None if flag is None else flag == "1")
    shown = engine.backend.describe()["settings"]["norm_external_transpose"]
    assert shown == ("by row width" if flag is None else str(flag == "1"))
    for impl, n, is_rms, unset in [(cuda_backend, 64, True, None), (cuda_backend, 1024, True, None),
                                   (cuda_backend, 16384, True, None), (cuda_backend, 16392, True, True),
                                   (cuda_backend, 1024, False, None), (cuda_backend, 16384, False, None),
                                   (cuda_backend, 16392, False, True),
                                   (cuda_backend, 131072, True, True),
                                   (triton_kernels, 64, True, None), (triton_kernels, 4096, True, None),
                                   (triton_kernels, 4104, True, True), (triton_kernels, 1024, False, True),
                                   (reference, 1024, True, True)]:
        assert _norm_ops.external_transpose(impl, 1 << 16, n, is_rms) is (
            unset if flag is None else flag == "1")
    # Small copies (at most the backend's SMALL_COPY_ROWS rows, CUDA 4096 and Triton 8192, and the
    # norm's SMALL_COPY_VALUES: 8M for RMSNorm, 16M for LayerNorm) come after the norm with the
    # flag unset (NOTES Q32, Q33, Q34); the flag still decides where it is set. Triton takes the
    # tiled transpose for LayerNorm at every width and for RMSNorm past 4096 (above), so those
    # cases are CUDA's.
    cases = [(True, 32, 1024, True, True), (True, 4096, 2048, True, True),
             (True, 2048, 4096, True, True), (True, 4096, 4096, False, False),
             (True, 2048, 8192, False, None), (True, 4097, 1024, False, True),
             (True, 8192, 1024, False, True), (True, 8193, 512, False, False),
             (True, 8192, 2048, False, False), (True, 16384, 512, False, False),
             (True, 1, 8192, True, None),
             (False, 32, 1024, True, None), (False, 2048, 4096, True, None),
             (False, 4096, 4096, True, None), (False, 2048, 8192, True, None),
             (False, 1024, 16384, True, None), (False, 4096, 8192, False, None),
             (False, 4097, 2048, False, None), (False, 8192, 2048, False, None)]
    for is_rms, m, n, cuda_small, triton_small in cases:
        for impl, small in ((cuda_backend, cuda_small), (triton_kernels, triton_small)):
            if small is None:
                continue
            want = (True if small else None) if flag is None else flag == "1"
            assert _norm_ops.external_transpose(impl, m, n, is_rms) is want, (impl, is_rms, m, n)


def test_cpu_without_interpreter_takes_reference():
    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1"})
    assert engine.backend.select_backend(OpFamily.RMSNORM, torch.device("cpu")) is Backend.REFERENCE
    assert engine.backend.describe()["rmsnorm"]["cpu"] == "reference"


@pytest.mark.parametrize("value", ["yes", "2", "true", " on"])
def test_invalid_flag_raises(value):
    engine.backend.reset_for_tests({"ENGINE_USE_LAYERNORM_TRITON": value})
    with pytest.raises(ValueError, match="ENGINE_USE_LAYERNORM_TRITON"):
        engine.backend.settings()


def test_settings_frozen_after_first_read(monkeypatch):
    engine.backend.reset_for_tests()
    monkeypatch.setenv("ENGINE_USE_RMSNORM_TRITON", "0")
    monkeypatch.setenv("ENGINE_NORM_EXTERNAL_TRANSPOSE", "0")
    first = engine.backend.settings()
    monkeypatch.setenv("ENGINE_USE_RMSNORM_TRITON", "1")
    monkeypatch.setenv("ENGINE_NORM_EXTERNAL_TRANSPOSE", "1")
    again = engine.backend.settings()
    assert again is first
    assert again.use_triton[OpFamily.RMSNORM] is False
    assert again.norm_external_transpose is False


def test_selection_logged_once(caplog):
    engine.backend.reset_for_tests({})
    with caplog.at_level(logging.DEBUG, logger="engine.backend"):
        for _ in range(3):
            engine.backend.select_backend(OpFamily.RMSNORM, torch.device("cpu"))
    hits = [r for r in caplog.records if "rmsnorm on cpu" in r.getMessage()]
    assert len(hits) == 1


def test_unsupported_device_raises():
    engine.backend.reset_for_tests({})
    with pytest.raises(ValueError, match="CUDA and CPU"):
        engine.backend.select_backend(OpFamily.RMSNORM, torch.device("meta"))


def test_family_must_be_enum():
    with pytest.raises(TypeError):
        engine.backend.select_backend("rms", torch.device("cpu"))


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the error of a machine without CUDA")
def test_cuda_backend_unavailable_is_strict():
    """The CUDA flag on a machine that cannot run it raises with a fix, never falls back."""
    engine.backend.reset_for_tests({})
    with pytest.raises(BackendUnavailableError) as e:
        engine.backend.select_backend(OpFamily.RMSNORM, torch.device("cuda"))
    assert "ENGINE_USE_RMSNORM_TRITON" in str(e.value) or "CUDA" in str(e.value)


def test_cuda_backend_rejects_cpu_tensors():
    """A CPU tensor handed to the CUDA backend is a clear Python error (no crash, no extension build)."""
    from engine import cuda_backend

    x = torch.randn(4, 8)
    w = torch.ones(8)
    out = torch.empty_like(x)
    rs = torch.empty(4)
    with pytest.raises((ValueError, RuntimeError), match="(?i)cuda"):
        cuda_backend.norm_fwd(x, w, None, None, 1e-5, out, None, None, rs, None, None, None, None,
                              is_rms_norm=True, zero_centered_gamma=False, current_scaling=False,
                              amax_epsilon=0.0, sm_margin=0)


# engine.cuda_backend's process-wide launch knobs: (context manager, extension setter, two valid
# values, the default, a value the C setter refuses) and the values the Python side rejects.
KNOBS = {
    "max_cluster_size": ("set_max_cluster_size", 2, 1, 0, 3, [-1, 3, 32, 2.0, "8", True],
                         "0, 1, 2, 4, 8 or 16"),
    "norm_fwd_vectors": ("set_norm_fwd_vectors", 8, 4, 0, 2, [1, 2, 3, 16, 4.0, "4", True], "0, 4 or 8"),
    "norm_bwd_elems": ("set_norm_bwd_elems", 32, 16, 0, 8, [1, 8, 64, 16.0, "16", True], "0, 16 or 32"),
    "norm_bwd_reduce_vec": ("set_norm_bwd_reduce_vec", 4, 1, 0, 2, [-1, 2, 8, 4.0, "4", True], "0, 1 or 4"),
    "norm_bwd_cta_threads": ("set_norm_bwd_cta_threads", 1024, 512, 0, 128,
                             [1, 128, 2048, 512.0, "1024", True], "0, 256, 512 or 1024"),
    "norm_fwd_general_loop": ("set_norm_fwd_general_loop", 1, 0, 0, 2, [-1, 2, 1.0, "1", True],
                              "0 or 1"),
    "norm_fwd_blocked_from": ("set_norm_fwd_blocked_from", 16384, 1 << 30, 0, -5,
                              [-1, -5, 16384.0, "16384", True], "int >= 0"),
    "norm_fwd_grid_per_sm": ("set_norm_fwd_grid_per_sm", 16, 1, 0, 65,
                             [-1, 65, 128, 4.0, "4", True], "int in 0..64"),
    "norm_bwd_stream_from": ("set_norm_bwd_stream_from", 32768, 1 << 30, 0, -3,
                             [-1, -3, 32768.0, "32768", True], "int >= 0"),
    "norm_bwd_stream_threads": ("set_norm_bwd_stream_threads", 256, 512, 0, 64,
                                [1, 64, 1024, 256.0, "256", True], "0, 128, 256 or 512"),
    "norm_fwd_stream_from": ("set_norm_fwd_stream_from", 16384, 1 << 30, 0, -2,
                             [-1, -2, 16384.0, "16384", True], "int >= 0"),
    "norm_fwd_stream_threads": ("set_norm_fwd_stream_threads", 256, 512, 0, 64,
                                [1, 64, 1024, 256.0, "256", True], "0, 128, 256 or 512"),
    "norm_fwd_band": ("set_norm_fwd_band", 2, 4, 0, 5,
                      [-1, 5, 256, 2.0, "2", True], r"int in 0\.\.4"),
    "norm_fwd_blocked_shape": ("set_norm_fwd_blocked_shape", 1, 4, 0, 5, [-1, 5, 2.0, "2", True],
                               "0, 1, 2, 3 or 4"),
    "norm_fwd_lean": ("set_norm_fwd_lean", 1, 3, 0, 4, [-1, 4, 1.0, "1", True], "0, 1, 2 or 3"),
    "norm_fwd_fp8_lean": ("set_norm_fwd_fp8_lean", 1, 2, 0, 3, [-1, 3, 4, 8, 1.0, "1", True],
                          "0, 1 or 2"),
    "dram_class": ("set_dram_class", 1, 2, 0, 3, [-1, 3, 1.0, "1", True], "0, 1 or 2"),
    "fp8_transpose_order": ("set_fp8_transpose_order", 1, 2, 0, 3, [-1, 3, 1.0, "1", True],
                            "0, 1 or 2"),
}


@pytest.mark.parametrize("knob,n", [(k, n) for k, v in KNOBS.items() for n in v[5]])
def test_launch_knob_rejects_bad_values(knob, n):
    """Only the listed values; anything else raises before the extension is touched."""
    from engine import cuda_backend

    with pytest.raises(ValueError, match=KNOBS[knob][6]):
        with getattr(cuda_backend, knob)(n):
            pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the CUDA extension's class needs a GPU")
def test_dram_class_agrees():
    """Both backends read the same card class off the device (the CUDA extension from its
    attributes, Triton from its driver's; NOTES P109), and each one's override forces it."""
    from engine import cuda_backend
    from engine.triton_kernels import utils

    dev = torch.device("cuda", torch.cuda.current_device())
    assert cuda_backend.device_dram_class() == (1 if utils.lean_dram(dev) else 2)
    for n in (1, 2):
        with cuda_backend.dram_class(n):
            assert cuda_backend.device_dram_class() == n
    name = torch.cuda.get_device_name()
    if name.startswith(("NVIDIA H100", "NVIDIA H200")):  # the two cards measured: H100 lean, H200 wide
        assert cuda_backend.device_dram_class() == (1 if "H100" in name else 2), name


@pytest.mark.skipif(not torch.cuda.is_available(), reason="the knobs live in the CUDA extension")
@pytest.mark.parametrize("knob", sorted(KNOBS))
def test_launch_knob_restores(knob):
    """Nested blocks set and restore the value; the default is back after them; the C setter
    refuses a bad value itself (returns -1, changes nothing)."""
    from engine import cuda_backend

    setter_name, a, b, default, bad = KNOBS[knob][:5]
    ext = cuda_backend._ext_or_load()
    setter = getattr(ext, setter_name)
    with getattr(cuda_backend, knob)(a):
        assert setter(a) == a
        with getattr(cuda_backend, knob)(b):
            assert setter(b) == b
        assert setter(a) == a
    assert setter(default) == default
    assert setter(bad) == -1
    assert setter(default) == default


def test_environment_read_only_in_backend():
    """``os.environ`` / ``getenv`` appear in engine/backend.py and nowhere else in the package."""
    offenders = []
    for path in (ROOT / "engine").rglob("*.py"):
        if path.name == "backend.py" and path.parent.name == "engine":
            continue
        text = path.read_text()
        if re.search(r"os\.environ|getenv\(", text):
            offenders.append(str(path.relative_to(ROOT)))
    assert offenders == []


@pytest.mark.skipif(not INTERPRET, reason="needs TRITON_INTERPRET=1")
def test_fixture_env_reaches_triton():
    engine.backend.reset_for_tests(backend_env("triton"))
    for fam in (OpFamily.RMSNORM, OpFamily.LAYERNORM, OpFamily.CAST_TRANSPOSE):
        assert engine.backend.select_backend(fam, torch.device("cpu")) is Backend.TRITON


def test_triton_e4m3_below_sm89_raises(monkeypatch):
    """Triton has no float8_e4m3fn type below sm_89 (its kernels fail to compile there with a message
    about internal type names): the Triton backend raises BackendUnavailableError naming the fix
    instead. e5m2, sm_89+, and CPU tensors (the interpreter) pass."""
    pytest.importorskip("triton")
    from engine.triton_kernels import utils

    cuda0 = torch.device("cuda", 0)
    monkeypatch.setattr(utils, "_cuda_capability", lambda index: (8, 0))
    with pytest.raises(BackendUnavailableError, match=r"sm_80.*float8_e5m2"):
        utils.check_fp8_output(torch.float8_e4m3fn, cuda0)
    utils.check_fp8_output(torch.float8_e5m2, cuda0)
    utils.check_fp8_output(torch.bfloat16, cuda0)
    utils.check_fp8_output(torch.float8_e4m3fn, torch.device("cpu"))
    for cap in ((8, 9), (9, 0), (10, 0)):
        monkeypatch.setattr(utils, "_cuda_capability", lambda index, cap=cap: cap)
        utils.check_fp8_output(torch.float8_e4m3fn, cuda0)


@pytest.mark.skipif(not INTERPRET, reason="drives the Triton launchers on CPU tensors (interpreter)")
def test_triton_fp8_launchers_check_the_format(monkeypatch):
    """The norm forward and cast_transpose launchers ask check_fp8_output about their output format
    and device before anything else (an FP8 output only)."""
    from engine.triton_kernels import norms, transpose

    seen = []
    record = lambda dtype, device: seen.append((dtype, device.type))  # noqa: E731
    monkeypatch.setattr(norms, "check_fp8_output", record)
    monkeypatch.setattr(transpose, "check_fp8_output", record)
    x, w = torch.randn(3, 64), torch.ones(64)
    one = lambda: torch.ones(1)  # noqa: E731
    for out_dtype in (torch.float8_e4m3fn, torch.bfloat16):
        fp8 = out_dtype is torch.float8_e4m3fn
        norms.norm_fwd(x, w, None, None, 1e-5, torch.empty(3, 64, dtype=out_dtype), None, None,
                       torch.empty(3), one() if fp8 else None, one() if fp8 else None,
                       one() if fp8 else None, None, is_rms_norm=True, zero_centered_gamma=False,
                       current_scaling=False, amax_epsilon=0.0, sm_margin=0)
    transpose.cast_transpose(x, one(), one(), one(), torch.empty(3, 64, dtype=torch.float8_e5m2),
                             None, current_scaling=False, amax_epsilon=0.0)
    assert seen == [(torch.float8_e4m3fn, "cpu"), (torch.float8_e5m2, "cpu")]
