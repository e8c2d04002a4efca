#!/usr/bin/env bash
# L3 -- GPU benchmarks: the sweep of PERF.md (both backends and the peers in one run), JSON + table;
# then the kernels' own device time beside each engine row's timed number (benchmarks/
# profile_kernels.py: which rows are host-bound).
# Usage: bash ci/L3.sh [--quick] [--suite rmsnorm|layernorm|fp8|all]   (arguments go to run.py)
set -euo pipefail
source "$(dirname "$0")/_gpu_prelude.sh"
python benchmarks/run.py --suite all --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/L3.log"
python benchmarks/profile_kernels.py --json "$OUT/profile_kernels.json" 2>&1 | tee "$OUT/L3-kernels.log"
