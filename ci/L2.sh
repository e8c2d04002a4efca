#!/usr/bin/env bash
# L2 -- GPU numerics sweeps (tests marked slow) and compute-sanitizer memcheck / racecheck of the CUDA
# backend (ci/sanitize.py drives fwd, bwd, FP8, transposes on small irregular shapes).
set -euo pipefail
source "$(dirname "$0")/_gpu_prelude.sh"
python -m pytest -q -p no:cacheprovider -m slow -n 8 tests "$@" 2>&1 | tee "$OUT/L2-sweep.log"
for tool in memcheck racecheck; do
  echo "== compute-sanitizer --tool $tool =="
  compute-sanitizer --tool "$tool" --error-exitcode 1 --target-processes all \
    python ci/sanitize.py 2>&1 | tee "$OUT/L2-$tool.log" | tail -5
done
