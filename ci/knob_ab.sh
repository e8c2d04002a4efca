#!/usr/bin/env bash
# One build, several knob settings of benchmarks/profile_kernels.py alternated (kernel time:
# compare only within one call). KAB_ARGS: the arguments every side shares; KAB_SIDES: the sides'
# own arguments, separated by "|" (an empty side is the default); KAB_REPS: alternations (2);
# KAB_LIMIT: seconds per run (120). Appends to $OUT/$KAB_LOG (knob_ab.log; gpu_session.sh's
# profkV stage: profkV.log).
#
#   KAB_ARGS="--impls cuda --n 8192 --modes fp8-delayed" KAB_SIDES="|--fwd-lean 2" bash ci/knob_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/knob_ab}; mkdir -p "$OUT"
# split on "|" keeping empty sides wherever they are (read -a drops a trailing empty field: the
# default side of "--knob v|" was lost in session 57's call 6)
sides=(); rest="${KAB_SIDES:-}"
while :; do sides+=("${rest%%|*}"); [[ "$rest" == *"|"* ]] || break; rest="${rest#*|}"; done
for rep in $(seq 1 "${KAB_REPS:-2}"); do
  for i in "${!sides[@]}"; do
    echo "== rep $rep side $i: ${sides[$i]:-(default)}" >> "$OUT/${KAB_LOG:-knob_ab.log}"
    # shellcheck disable=SC2086  # the arguments are word lists on purpose
    timeout "${KAB_LIMIT:-120}" python3 benchmarks/profile_kernels.py ${KAB_ARGS:-} ${sides[$i]} \
      2>&1 | grep -vE "UserWarning|_warn_once" >> "$OUT/${KAB_LOG:-knob_ab.log}"
  done
done
