#!/usr/bin/env bash
# One GPU call for an A/B of two CUDA builds: A = a carried tree (.carry/base.tgz, e.g.
# `git archive HEAD | gzip > .carry/base.tgz`), B = this working tree. Both are built in parallel,
# then optional tests run on B's build, then benchmarks/profile_kernels.py (this tree's, on both
# sides) runs on A and B alternated AB_REPS times (kernel time: compare only within one call).
# Logs under $OUT.
#
#   AB_ARGS="--impls cuda --n 16384 32768 --modes fwd+bwd" AB_REPS=2 \
#   AB_TESTS="tests/test_norm_contract.py" AB_K="stream or cluster" AB_SANITIZE="memcheck racecheck" bash ci/ab.sh
#
# AB_BUILD=0 skips both builds (an A/B of Triton code: AB_ARGS="--impls triton ...");
# AB_BUILD=carry takes both from an earlier call's output carried as .carry/{A,B}_C*.so.xz.NN
# (that call run with AB_PACK=AB); AB_BUILD=carryA takes A's from there and builds B.
# AB_PACK (A, B or AB; none by default): the built extensions of those sides come back in
# xz-compressed pieces ($OUT/{A,B}_C*.so.xz.NN, ci/_carry.sh, two of 7-15 MB a side), so that a
# later call can carry B's as .carry/_C*.so.xz.NN for ci/gpu_session.sh (with $OUT/_C.srchash).
# The device tool hands back at most 8 files a call: with both sides packed, the pieces and the
# hash took 5 and pushed the test log out (session 59, call 3).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/ab}; mkdir -p "$OUT"; OUT=$(cd "$OUT" && pwd)  # absolute: build_side cd's
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }
. ci/_carry.sh
SITE=""
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl
  SITE=/tmp/site:
fi
A=/tmp/ab_base
rm -rf "$A" && mkdir -p "$A" && tar xzf .carry/base.tgz -C "$A" || { log "no .carry/base.tgz"; exit 2; }
# Both sides measure with this tree's harness (benchmarks/*.py: the modes, the byte counts, the
# timing), so that an A/B compares engine code only and A runs the modes added since.
cp benchmarks/*.py "$A/benchmarks/"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem --format=csv > "$OUT/ab_session.log"
# build_side SIDE DIR JOBS: setup.py build_ext in DIR, logged to $OUT/build_SIDE.log (last line
# "SIDE build rc N"), the extension handed back as $OUT/SIDE_<name>.xz.NN where AB_PACK names
# the side.
build_side() {
  ( cd "$2" && MAX_JOBS=$3 python3 setup.py -q build_ext --inplace > "$OUT/build_$1.log" 2>&1
    rc=$?; echo "$1 build rc $rc" >> "$OUT/build_$1.log"; [ $rc = 0 ] || exit 1
    case "${AB_PACK:-}" in *"$1"*)
      for f in engine/_C*.so; do pack_so "$f" "$OUT/$1_$(basename "$f")"; done ;;
    esac )
}
# unpack_side SIDE DIR: the extension carried from an earlier call (.carry/SIDE_<name>.xz.NN)
# into DIR.
unpack_side() {
  for p in $(carried_prefixes .carry/"$1"_*.so.xz*); do
    unpack_so "$p" "$2/engine/$(basename "$p" | cut -c3-)"
  done
}
case "${AB_BUILD:-1}" in
  carry) unpack_side A "$A"; unpack_side B . ;;
  carryA) unpack_side A "$A"; build_side B . "$(nproc)" || exit 1; log "B built" ;;
  1) build_side A "$A" $(( $(nproc) / 2 )) & pa=$!
     build_side B . $(( $(nproc) / 2 )) & pb=$!
     wait $pa && wait $pb || { tail -q -n 1 "$OUT"/build_*.log; exit 1; }
     log "builds done" ;;
esac  # AB_BUILD=0: no CUDA builds (Triton-only A/B: --impls triton)
case "${AB_BUILD:-1}" in carry|carryA|1)
  tail -q -n 1 "$OUT"/build_*.log 2>/dev/null; ls -l "$A"/engine/_C*.so engine/_C*.so
  [ -n "${AB_PACK:-}" ] && src_hash > "$OUT/_C.srchash" ;;
esac
if [ -n "${AB_TESTS:-}" ]; then
  # shellcheck disable=SC2086
  PYTHONPATH=$SITE$PWD timeout "${AB_TESTS_LIMIT:-200}" python3 -m pytest -q -p no:cacheprovider -n 8 -rfE \
    -m "not slow" ${AB_K:+-k "$AB_K"} $AB_TESTS > "$OUT/ab_tests.log" 2>&1
  log "tests (B) exit $?"; tail -2 "$OUT/ab_tests.log"
fi
for tool in ${AB_SANITIZE:-}; do  # memcheck / racecheck over ci/sanitize.py on B's build
  PYTHONPATH=$SITE$PWD timeout "${AB_SANITIZE_LIMIT:-240}" compute-sanitizer --tool "$tool" --error-exitcode 1 python3 ci/sanitize.py \
    >> "$OUT/ab_sanitize.log" 2>&1
  log "$tool exit $?"; grep -E "ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/ab_sanitize.log" | tail -1
done
for rep in $(seq "${AB_REPS:-2}"); do
  for side in A B; do
    d=$PWD; [ $side = A ] && d=$A
    echo "=== $side rep $rep" >> "$OUT/ab.log"
    # shellcheck disable=SC2086
    (cd "$d" && PYTHONPATH=$SITE$d timeout "${AB_LIMIT:-120}" python3 benchmarks/profile_kernels.py ${AB_ARGS:-} \
      2>&1 | grep -vE "UserWarning|_warn_once" >> "$OUT/ab.log")
  done
  log "rep $rep done"
done
log done
