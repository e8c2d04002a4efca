#!/usr/bin/env bash
# Triton config sweeps (benchmarks/tune.py: timed with do_bench, each candidate checked against the
# reference) of the Triton cells under their bars in session 48's kernel table, on the current
# kernels (benchmarks/NOTES.md, "Next steps (session 50)": Q58 found 1.11x in a cell no H200 sweep
# had covered). On the GPU machine, about 6 minutes:
#   OUT=$OUT bash ci/tune_under_bar.sh
#   TUNE_DRY=1 bash ci/tune_under_bar.sh      # CPU: the interpreter, N = 256 (checks the arguments)
# Writes $OUT/tune_<op>_<norm>.json (six files) and $OUT/tune_under_bar.log (each sweep's table).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/tune}; mkdir -p "$OUT"
dry=(); [ "${TUNE_DRY:-0}" = 1 ] && dry=(--dry-run)
: > "$OUT/tune_under_bar.log"  # this run's tables only
rc=0
run() {  # op norm widths seconds
  local n=$3
  [ ${#dry[@]} -gt 0 ] && n=256
  echo "== tune.py --ops $1 --norm $2 --n $n" >> "$OUT/tune_under_bar.log"
  timeout $(( $4 + 90 )) python3 benchmarks/tune.py ${dry[@]+"${dry[@]}"} --ops "$1" --norm "$2" --n "$n" \
    --max-seconds "$4" --out "$OUT/tune_${1}_${2}.json" > "$OUT/tune_$1_$2.tmp" 2>&1 || rc=1
  tail -14 "$OUT/tune_$1_$2.tmp" >> "$OUT/tune_under_bar.log"; rm -f "$OUT/tune_$1_$2.tmp"
}
run fwd rmsnorm 65536,131072 30
run fwd layernorm 32768,65536,131072 40
run fwd-fp8 rmsnorm 2048,16384,32768,65536,131072 60
run fwd-fp8 layernorm 2048,4096,8192,16384,32768,65536,131072 80
run bwd layernorm 1024,16384,32768,65536,131072 60
run bwd rmsnorm 65536,131072 30
exit $rc
