"""Build description of the CUDA extension ``engine._C`` (sources, include dirs, compiler flags).

Standalone on purpose: only the standard library is imported at module level, so ``setup.py`` can
load this file by path without importing the ``engine`` package (or torch), and the JIT build in
:mod:`engine.cuda_backend` and the CI compile check (``ci/compile_csrc.sh``) use the very same flags.
"""

from __future__ import annotations

import os
from typing import List, Optional

__all__ = ["extension_name", "sources", "include_dirs", "nvcc_flags", "cxx_flags", "DEFAULT_ARCHS"]

#: Target architectures when none are given: Hopper (H100 / H200).
DEFAULT_ARCHS = "9.0"

_CSRC = os.path.join("engine", "csrc")


def extension_name() -> str:
    """Import name of the compiled extension."""
    return "engine._C"


def sources(root: str) -> List[str]:
    """Every ``.cu`` under ``engine/csrc`` and every ``.cpp`` under ``engine/csrc/extensions``.

    Paths are absolute and sorted, so the build (and torch's JIT source hash) is deterministic.
    """
    csrc = os.path.join(os.path.abspath(root), _CSRC)
    found: List[str] = []
    for dirpath, _dirnames, filenames in os.walk(csrc):
        rel = os.path.relpath(dirpath, csrc)
        in_ext = rel == "extensions" or rel.startswith("extensions" + os.sep)
        for name in filenames:
            if name.endswith(".cu") or (in_ext and name.endswith(".cpp")):
                found.append(os.path.join(dirpath, name))
    return sorted(found)


def include_dirs(root: str) -> List[str]:
    """``engine/csrc/include`` (the C API) and ``engine/csrc`` (internal ``common/...`` headers)."""
    csrc = os.path.join(os.path.abspath(root), _CSRC)
    return [os.path.join(csrc, "include"), csrc]


def _gencode(archs: str) -> List[str]:
    flags: List[str] = []
    for raw in archs.replace(",", ";").replace(" ", ";").split(";"):
        a = raw.strip()
        if not a:
            continue
        ptx = a.endswith("+PTX")
        a = a[: -len("+PTX")] if ptx else a
        suffix = ""
        if a[-1:] in ("a", "f"):
            a, suffix = a[:-1], a[-1]
        parts = a.split(".")
        if len(parts) != 2 or not all(p.isdigit() for p in parts):
            raise ValueError(
                f"invalid CUDA arch {raw!r} in {archs!r}: use forms like '9.0', '9.0a', '8.0+PTX'"
            )
        cc = parts[0] + parts[1] + suffix
        flags.append(f"-gencode=arch=compute_{cc},code=sm_{cc}")
        if ptx:
            flags.append(f"-gencode=arch=compute_{cc},code=compute_{cc}")
    if not flags:
        raise ValueError(f"no CUDA arch in {archs!r}")
    return flags


def nvcc_flags(archs: Optional[str] = None) -> List[str]:
    """nvcc flags: -O3, C++17, line info, the torch-compatible half/bfloat16 defines, gencodes.

    ``archs`` is a ``;``-separated list such as ``"8.0;9.0"`` (default ``"9.0"``). Deliberately no
    ``--use_fast_math``: it would turn IEEE division (used for scale and scale_inv)
    into approximations and flush denormals, changing results against the reference.
    """
    return [
        "-O3",
        "-std=c++17",
        "-lineinfo",
        "--expt-relaxed-constexpr",
        # torch's build defines these; set them here too so that every compile path agrees.
        "-D__CUDA_NO_HALF_OPERATORS__",
        "-D__CUDA_NO_HALF_CONVERSIONS__",
        "-D__CUDA_NO_BFLOAT16_CONVERSIONS__",
        "-D__CUDA_NO_HALF2_OPERATORS__",
    ] + _gencode(archs or DEFAULT_ARCHS)


def cxx_flags() -> List[str]:
    """Host C++ flags for the binding sources."""
    return ["-O3", "-std=c++17"]
