#!/usr/bin/env bash
# L3 -- GPU benchmarks: the sweep of PERF.md (both backends and the peers in one run), JSON + table.
# Usage: bash ci/L3.sh [--quick] [--suite rmsnorm|layernorm|fp8|all]
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/ci}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
bash ci/build_ext.sh "$OUT"
python benchmarks/run.py --suite all --out "$OUT/bench.json" "$@" 2>&1 | tee "$OUT/L3.log"
