"""Install engine.

* CPU machine (or a CPU build of torch, or no nvcc): pure Python; the Triton and reference paths work.
* CUDA build of torch + nvcc: also builds the CUDA extension ``engine._C`` from engine/csrc
  (sm_90 by default; ``ENGINE_CUDA_ARCHS="8.0;9.0"`` overrides). Run ``pip install
  --no-build-isolation .`` so the build sees the installed torch.
* Editable installs (``pip install -e .``) skip the ahead-of-time build: the extension is built just in
  time on first use of the CUDA backend (``engine.cuda_backend``), with a message while it compiles.
"""

import importlib.util
import os
import pathlib
import sys

from setuptools import find_packages, setup

ROOT = pathlib.Path(__file__).resolve().parent


def _load_build_config():
    # engine/_build.py imports only the standard library, so it loads without importing engine.
    spec = importlib.util.spec_from_file_location("_engine_build", ROOT / "engine" / "_build.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _editable() -> bool:
    return any(cmd in sys.argv for cmd in ("develop", "editable_wheel"))


def _cuda_extension():
    if _editable() or os.environ.get("ENGINE_SKIP_CUDA_BUILD") == "1":
        return [], {}
    try:
        import torch
        from torch.utils.cpp_extension import CUDA_HOME, BuildExtension, CUDAExtension
    except ImportError:
        return [], {}
    if torch.version.cuda is None or CUDA_HOME is None:
        print("engine: CPU build of torch or no nvcc found: installing pure Python "
              "(Triton and reference backends; the CUDA backend needs a CUDA torch and nvcc)")
        return [], {}
    b = _load_build_config()
    sources = [os.path.relpath(p, ROOT) for p in b.sources(str(ROOT))]
    ext = CUDAExtension(
        name=b.extension_name(),
        sources=sources,
        include_dirs=b.include_dirs(str(ROOT)),
        extra_compile_args={"cxx": b.cxx_flags(), "nvcc": b.nvcc_flags(os.environ.get("ENGINE_CUDA_ARCHS"))},
    )
    return [ext], {"build_ext": BuildExtension}


ext_modules, cmdclass = _cuda_extension()

setup(
    name="engine",
    version="0.1.0",
    description="Fused norm, FP8 and activation kernels for training transformers (CUDA C++ and Triton)",
    long_description=(ROOT / "README.rst").read_text() if (ROOT / "README.rst").exists() else "",
    long_description_content_type="text/x-rst",
    packages=find_packages(include=["engine", "engine.*"]),
    package_data={"engine": ["csrc/**/*.h", "csrc/**/*.cuh", "csrc/**/*.cu", "csrc/**/*.cpp"]},
    include_package_data=True,
    python_requires=">=3.10",
    install_requires=["torch>=2.4", "triton>=3.0"],
    extras_require={
        "test": ["pytest", "pytest-xdist", "tabulate", "numpy"],
        "bench": ["pytest-benchmark", "tabulate"],
    },
    ext_modules=ext_modules,
    cmdclass=cmdclass,
)
