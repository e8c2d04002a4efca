#!/usr/bin/env bash
# L1 -- GPU correctness, both backends (run on a CUDA machine: H100/H200).
#   builds the CUDA extension in place (setup.py build_ext --inplace), then runs the test suite on CUDA
#   tensors with the backend axis set to triton and cuda (tests/conftest.py). Logs under $OUT (or build/ci).
set -euo pipefail
source "$(dirname "$0")/_gpu_prelude.sh"
python -m pytest -q -p no:cacheprovider -m "not slow" -n 8 tests "$@" 2>&1 | tee "$OUT/L1.log"
