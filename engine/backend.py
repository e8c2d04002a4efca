"""Backend selection: the one place that reads the environment and picks an implementation.

Every op family (RMSNorm, LayerNorm, cast+transpose, ...) has three implementations of one op contract:

* ``engine.reference``      -- pure PyTorch, fp32 math. Serves CPU tensors and is the CPU fallback.
* ``engine.triton_kernels`` -- Triton kernels. Runs on CUDA tensors, and on CPU tensors under
  ``TRITON_INTERPRET=1`` (this is how CI exercises the kernels without a GPU).
* ``engine.cuda_backend``   -- the compiled CUDA C++ extension built from ``engine/csrc``.

Environment flags (read once, at first use, then frozen for the life of the process, which keeps
selection stable under CUDA-graph capture and ``torch.compile``):

=================================== ==========================================================
``ENGINE_USE_RMSNORM_TRITON``       1: Triton for RMSNorm on CUDA tensors; 0 or unset: CUDA C++
``ENGINE_USE_LAYERNORM_TRITON``     same for LayerNorm
``ENGINE_USE_CAST_TRANSPOSE_TRITON`` same for ``cast_transpose`` / ``fp8_transpose``
``ENGINE_USE_ACTIVATION_TRITON``    same for the activation family (reserved)
``ENGINE_USE_ROPE_TRITON``          same for RoPE (reserved)
``ENGINE_NORM_EXTERNAL_TRANSPOSE``  1: FP8 transposed norm output by a separate tiled transpose
                                    kernel; 0: transposed stores inside the norm kernel.
                                    Unset: per row width, the path measured faster (each
                                    backend's IN_KERNEL_TRANSPOSE_MAX_N per norm; see README)
``ENGINE_TRITON_AUTOTUNE``          1: autotune Triton kernels (keyed on N, dtypes, flags);
                                    0 or unset: heuristic configs
``ENGINE_CUDA_ARCHS``               archs for the JIT build of the extension (default ``9.0``)
``TRITON_INTERPRET``                1: CPU tensors of a Triton-flagged family run the Triton
                                    kernels in Triton's interpreter
=================================== ==========================================================

Rules: a flag value other than ``0``/``1``/empty raises. CUDA tensors go to the backend the flag
names; if it cannot run, :class:`BackendUnavailableError` says how to fix it (no silent fallback).
CPU tensors go to the reference path unless the family's Triton flag is set and
``TRITON_INTERPRET=1``. Other device types raise. ``os.environ`` is read here and nowhere else.
"""

from __future__ import annotations

import enum
import logging
import os
import threading
from dataclasses import dataclass
from types import ModuleType
from typing import Dict, Mapping, Optional

import torch

__all__ = [
    "OpFamily",
    "Backend",
    "Settings",
    "BackendUnavailableError",
    "settings",
    "select",
    "select_backend",
    "describe",
    "reset_for_tests",
    "register_derived_cache",
]

_log = logging.getLogger("engine.backend")


class OpFamily(enum.Enum):
    """Op families that select their backend independently."""

    RMSNORM = "rmsnorm"
    LAYERNORM = "layernorm"
    CAST_TRANSPOSE = "cast_transpose"
    ACTIVATION = "activation"
    ROPE = "rope"


class Backend(enum.Enum):
    """The implementations of an op contract."""

    REFERENCE = "reference"
    TRITON = "triton"
    CUDA = "cuda"


_TRITON_FLAGS: Dict[OpFamily, str] = {
    OpFamily.RMSNORM: "ENGINE_USE_RMSNORM_TRITON",
    OpFamily.LAYERNORM: "ENGINE_USE_LAYERNORM_TRITON",
    OpFamily.CAST_TRANSPOSE: "ENGINE_USE_CAST_TRANSPOSE_TRITON",
    OpFamily.ACTIVATION: "ENGINE_USE_ACTIVATION_TRITON",
    OpFamily.ROPE: "ENGINE_USE_ROPE_TRITON",
}

class BackendUnavailableError(RuntimeError):
    """The backend a flag selected cannot run here. The message says how to fix it."""


@dataclass(frozen=True)
class Settings:
    """The frozen result of reading the environment once."""

    use_triton: Mapping[OpFamily, bool]
    triton_interpret: bool
    #: ENGINE_NORM_EXTERNAL_TRANSPOSE: True / False as set, None when unset (per row width: the
    #: path measured faster, engine._norm_ops.external_transpose)
    norm_external_transpose: Optional[bool]
    triton_autotune: bool
    cuda_archs: Optional[str]


def _parse_bool(env: Mapping[str, str], name: str, default: Optional[bool]) -> Optional[bool]:
    raw = env.get(name, "").strip()
    if raw == "":
        return default
    if raw in ("0", "1"):
        return raw == "1"
    raise ValueError(f"{name}={raw!r} is not valid: use 1 (on) or 0 (off), or leave it unset")


def _read_settings(env: Mapping[str, str]) -> Settings:
    return Settings(
        use_triton={fam: _parse_bool(env, flag, False) for fam, flag in _TRITON_FLAGS.items()},
        triton_interpret=_parse_bool(env, "TRITON_INTERPRET", False),
        norm_external_transpose=_parse_bool(env, "ENGINE_NORM_EXTERNAL_TRANSPOSE", None),
        triton_autotune=_parse_bool(env, "ENGINE_TRITON_AUTOTUNE", False),
        cuda_archs=env.get("ENGINE_CUDA_ARCHS") or None,
    )


_lock = threading.Lock()
_settings: Optional[Settings] = None
_env_override: Optional[Mapping[str, str]] = None  # set by reset_for_tests
_selected: Dict[tuple, Backend] = {}


def settings() -> Settings:
    """Read the environment on first call; return the same frozen :class:`Settings` afterwards."""
    global _settings
    if _settings is None:
        with _lock:
            if _settings is None:
                s = _read_settings(os.environ if _env_override is None else _env_override)
                _log.debug("engine settings: %s", s)
                _settings = s
    return _settings


def _triton_importable() -> Optional[str]:
    try:
        import triton  # noqa: F401
    except Exception as e:  # pragma: no cover - depends on the install
        return f"{type(e).__name__}: {e}"
    return None


def select_backend(family: OpFamily, device: torch.device) -> Backend:
    """Which backend serves ``family`` for tensors on ``device`` (memoised per device type).

    Raises :class:`BackendUnavailableError` when the selected backend cannot run and
    ``ValueError`` for device types engine does not support.
    """
    if not isinstance(family, OpFamily):
        raise TypeError(f"family must be an OpFamily, got {family!r}")
    key = (family, device.type)
    got = _selected.get(key)
    if got is not None:
        return got
    s = settings()
    want_triton = s.use_triton[family]
    flag = _TRITON_FLAGS[family]
    if device.type == "cuda":
        if want_triton:
            err = _triton_importable()
            if err is not None:
                raise BackendUnavailableError(
                    f"{flag}=1 selects the Triton backend but triton cannot be imported ({err}). "
                    f"Install triton (pip install triton) or unset {flag} to use the CUDA backend."
                )
            backend = Backend.TRITON
        else:
            from engine import cuda_backend

            cuda_backend.ensure_available()  # raises BackendUnavailableError with a fix
            backend = Backend.CUDA
    elif device.type == "cpu":
        if want_triton and s.triton_interpret:
            err = _triton_importable()
            if err is not None:
                raise BackendUnavailableError(
                    f"{flag}=1 with TRITON_INTERPRET=1 asks for the Triton interpreter, but triton "
                    f"cannot be imported ({err}). Install triton or unset {flag}."
                )
            backend = Backend.TRITON
        else:
            backend = Backend.REFERENCE
    else:
        raise ValueError(
            f"engine supports CUDA and CPU tensors; got a tensor on {device.type!r}"
        )
    with _lock:
        if key not in _selected:
            _selected[key] = backend
            _log.debug("engine: %s on %s -> %s backend", family.value, device.type, backend.value)
    return _selected[key]


def implementation(backend: Backend) -> ModuleType:
    """The module implementing the op contracts for ``backend``."""
    if backend is Backend.REFERENCE:
        from engine import reference

        return reference
    if backend is Backend.TRITON:
        from engine import triton_kernels

        return triton_kernels
    from engine import cuda_backend

    return cuda_backend


_modules: Dict[tuple, ModuleType] = {}


def select(family: OpFamily, device: torch.device) -> ModuleType:
    """The one dispatch point: the module implementing ``family``'s op contract on ``device``.

    Memoised per (family, device): after the first call it is one dict lookup (this sits on the
    per-call path of every op). The key is the device itself, not ``device.type``, which builds a
    string per call (0.5 us of a 1.4 us lookup on the development machine); the selection depends
    on the type alone, so devices of one type map to the same module.
    """
    key = (family, device)
    mod = _modules.get(key)
    if mod is None:
        mod = implementation(select_backend(family, device))
        _modules[key] = mod
    return mod


def describe() -> Dict[str, Dict[str, str]]:
    """What each op family resolves to, per device type, without building or loading anything.

    Returns ``{family: {"cuda": backend, "cpu": backend, "flag": "NAME=value"}}`` plus a
    ``"settings"`` entry with the transpose and autotune switches.
    """
    s = settings()
    out: Dict[str, Dict[str, str]] = {}
    for fam, flag in _TRITON_FLAGS.items():
        t = s.use_triton[fam]
        out[fam.value] = {
            "cuda": (Backend.TRITON if t else Backend.CUDA).value,
            "cpu": (Backend.TRITON if (t and s.triton_interpret) else Backend.REFERENCE).value,
            "flag": f"{flag}={int(t)}",
        }
    out["settings"] = {
        "norm_external_transpose": ("by row width" if s.norm_external_transpose is None
                                    else str(s.norm_external_transpose)),
        "triton_autotune": str(s.triton_autotune),
        "triton_interpret": str(s.triton_interpret),
    }
    return out


#: Caches derived from the settings (e.g. the Triton launch plans), emptied by reset_for_tests.
_derived_caches: list = []


def register_derived_cache(cache) -> None:
    """Have :func:`reset_for_tests` empty ``cache`` (anything with ``clear()``): for memoised
    values that depend on the frozen settings."""
    _derived_caches.append(cache)


def reset_for_tests(env: Optional[Mapping[str, str]] = None) -> None:
    """Forget the frozen settings and selections and empty the caches derived from them (tests only).

    With ``env`` the settings are read (at next use) from that mapping instead of ``os.environ``.
    """
    global _settings, _env_override
    with _lock:
        _selected.clear()
        _modules.clear()
        for cache in _derived_caches:
            cache.clear()
        _settings = None
        _env_override = None if env is None else dict(env)
