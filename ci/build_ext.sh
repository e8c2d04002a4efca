#!/usr/bin/env bash
# Build the CUDA extension in place (engine/_C*.so) with setup.py; skipped if an up-to-date one exists.
# Usage: bash ci/build_ext.sh [log-dir]
set -euo pipefail
cd "$(dirname "$0")/.."
LOG=${1:-build/ci}; mkdir -p "$LOG"
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
newest_src=$(find engine/csrc engine/_build.py -type f -newer engine/_C*.so 2>/dev/null | head -1 || true)
if ls engine/_C*.so >/dev/null 2>&1 && [ -z "$newest_src" ]; then
  echo "engine/_C is up to date"
else
  t0=$(date +%s)
  python setup.py -q build_ext --inplace > "$LOG/build.log" 2>&1 || { tail -60 "$LOG/build.log"; exit 1; }
  echo "built engine/_C in $(( $(date +%s) - t0 )) s (MAX_JOBS=$MAX_JOBS)"
fi
python -c "import engine._C" && echo "engine._C imports"
