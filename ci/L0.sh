#!/usr/bin/env bash
# L0 -- the CPU suite; what CI runs (.ci/run). Needs no GPU.
#   1. a virtualenv (.venv, unless one is active) with the CPU build of torch, triton and the test tools;
#   2. engine installed editable (pure Python on a CPU machine);
#   3. every .cu under engine/csrc compiled with nvcc, the torch bindings compiled (-c) against torch's headers;
#   4. every Triton kernel variant engine launches compiled for sm_90 (ci/triton_compile_check.py);
#   5. pytest with TRITON_INTERPRET=1: the reference backend and the Triton kernels in the interpreter.
# Exits non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ -z "${VIRTUAL_ENV:-}" ]; then
  [ -x .venv/bin/python ] || "${PYTHON:-python3}" -m venv .venv
  # shellcheck disable=SC1091
  . .venv/bin/activate
fi
python -m pip install -q --upgrade pip setuptools wheel
# torch==2.13.0 is the CPU build on CI machines (a bare `torch` would pull a multi-GB CUDA build).
# numpy: Triton's interpreter imports it (triton does not declare it).
python -m pip install -q "torch==2.13.0" triton numpy pytest pytest-benchmark pytest-xdist tabulate
python -m pip install -q --no-build-isolation --no-deps -e .

echo "== L0: nvcc compile check of engine/csrc =="
bash ci/compile_csrc.sh

echo "== L0: Triton kernels compiled for sm_90 (no GPU: the interpreter never compiles them) =="
TRITON_CACHE_DIR="$(mktemp -d)" env -u TRITON_INTERPRET python ci/triton_compile_check.py

echo "== L0: pytest (reference backend + Triton interpreter) =="
TRITON_INTERPRET=1 python -m pytest -q -p no:cacheprovider -n auto tests "$@"
