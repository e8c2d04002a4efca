#!/usr/bin/env bash
# One call on the GPU machine: run the named stages in order, each under its own time limit, and
# leave logs and results under $OUT (at most 8 files come back from the device tool).
#
#   bash ci/gpu_session.sh build L1 smoke        # correctness
#   bash ci/gpu_session.sh build bench tune      # performance
#   bash ci/gpu_session.sh build L2              # sweeps + compute-sanitizer
#
# Stages: build (setup.py build_ext --inplace), L1 (pytest on CUDA tensors, both backends),
# smoke (ci/cuda_smoke.py), bench (benchmarks/run.py), benchfull, tune (benchmarks/tune.py),
# L2 (slow sweep + compute-sanitizer), diagT (ci/diag_transpose.py), launch (ci/launch_overhead.py),
# profk / profkjit (benchmarks/profile_kernels.py: device time against timed time; PROFK_ARGS),
# profkB (the same with PROFKB_ARGS, the B side of an A/B run), profkV (PROFKV_ARGS once per
# CUDA forward layout in PROFKV_VECTORS, default "8 4": --fwd-vectors; profkV.log), mainjob (examples/train_llama.py
# on both RMSNorm backends; MAINJOB_ARGS),
# hostprof (ci/host_profile.py: cProfile of a host-bound row; HOSTPROF_ARGS),
# ncu (ci/ncu_case.py under ncu; NCU_CASES="backend:N:out[:ln] ..."), ncuop (the same cases:
# executed SASS instructions per opcode), ncusrc (the same cases: per SASS instruction, CSV), ncustall (the same cases: warp
# stall reasons per issued instruction, occupancy, DRAM throughput; NCU_KERNEL: the kernel-name
# regex, norm_fwd by default). Optional inputs carried from an
# earlier call: .carry/_C*.so.xz.NN with .carry/_C.srchash (the built extension in pieces, used
# where the hash matches; ci/_carry.sh) and .carry/triton_cache.tgz; wheels in .whl/ are
# installed to /tmp/site.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/gpu}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TRITON_CACHE_DIR="$PWD/.triton_cache" MAX_JOBS=${MAX_JOBS:-16}
unset TRITON_INTERPRET
T0=$(date +%s)
log() { echo "[$(( $(date +%s) - T0 ))s] $*"; }

if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
python3 -c "import setuptools" 2>/dev/null || python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/fallback/*.whl
# The extension of an earlier call, in xz-compressed pieces (ci/_carry.sh), is used only where its
# source hash matches this tree's engine/csrc and engine/_build.py.
. ci/_carry.sh
so_carried=$(carried_prefixes .carry/_C*.so.xz*)
if [ -n "$so_carried" ] && [ "$(cat .carry/_C.srchash 2>/dev/null)" = "$(src_hash)" ]; then
  for p in $so_carried; do unpack_so "$p" "engine/$(basename "$p")"; done
  touch engine/_C*.so; echo "using the carried extension (source hash $(src_hash))"
elif [ -n "$so_carried" ]; then
  echo "the carried extension was built from other sources: rebuilding"
fi
if [ -f .carry/triton_cache.tgz ]; then tar xzf .carry/triton_cache.tgz; fi

{
  nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.sm,clocks.mem --format=csv
  python3 -c "import torch, triton; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'triton', triton.__version__); p=torch.cuda.get_device_properties(0); print(p.name, p.multi_processor_count, 'SMs', getattr(p, 'L2_cache_size', '?'), 'L2')"
} > "$OUT/session.log" 2>&1
cat "$OUT/session.log"

for stage in "$@"; do
  log "== stage $stage =="
  case "$stage" in
    build) timeout "${BUILD_LIMIT:-300}" bash ci/build_ext.sh "$OUT" 2>&1 | tee -a "$OUT/session.log"
          for f in engine/_C*.so; do [ -f "$f" ] && pack_so "$f" "$OUT/$(basename "$f")"; done
          src_hash > "$OUT/_C.srchash"; ls -l "$OUT" ;;
    L1) timeout "${L1_LIMIT:-330}" python3 -m pytest -q -p no:cacheprovider -m "not slow" -n 8 --maxfail=60 \
          -rfE tests > "$OUT/L1.log" 2>&1; log "L1 exit $?"; tail -40 "$OUT/L1.log" ;;
    smoke) timeout "${SMOKE_LIMIT:-150}" python3 ci/cuda_smoke.py --quick > "$OUT/smoke.log" 2>&1;
          log "smoke exit $?"; tail -25 "$OUT/smoke.log" ;;
    bench) timeout "${BENCH_LIMIT:-300}" python3 benchmarks/run.py --suite all --quick --out "$OUT/bench.json" \
          --time-limit-s $(( ${BENCH_LIMIT:-300} - 40 )) > "$OUT/bench.log" 2>&1; log "bench exit $?"; tail -60 "$OUT/bench.log" ;;
    benchfull) timeout "${BENCH_LIMIT:-540}" python3 benchmarks/run.py --suite all --out "$OUT/bench.json" \
          --time-limit-s $(( ${BENCH_LIMIT:-540} - 40 )) > "$OUT/bench.log" 2>&1; log "bench exit $?"; tail -70 "$OUT/bench.log" ;;
    tune) timeout "${TUNE_LIMIT:-240}" python3 benchmarks/tune.py --out "$OUT/tune.json" \
          --max-seconds $(( ${TUNE_LIMIT:-240} - 30 )) ${TUNE_ARGS:-} > "$OUT/tune.log" 2>&1; log "tune exit $?"; tail -40 "$OUT/tune.log" ;;
    diag) timeout 60 python3 ci/diag.py --transpose > "$OUT/diag.log" 2>&1
          timeout 40 python3 ci/diag.py --crash >> "$OUT/diag.log" 2>&1; echo "crash repro exit $?" >> "$OUT/diag.log"
          log "diag done"; tail -45 "$OUT/diag.log" ;;
    gdb) timeout 100 cuda-gdb -q -batch -ex run -ex bt --args python3 ci/diag.py --crash >> "$OUT/diag.log" 2>&1 ;;
    fp8bench) timeout 150 python3 benchmarks/run.py --suite fp8 --out "$OUT/bench_fp8.json" --no-compile \
          --time-limit-s 120 > "$OUT/bench_fp8.log" 2>&1; log "fp8bench exit $?"; tail -42 "$OUT/bench_fp8.log" ;;
    prof) timeout 150 python3 ci/profile_fwd_bwd.py > "$OUT/prof.log" 2>&1; log "prof exit $?"; cat "$OUT/prof.log" | tail -40 ;;
    L2sweep) timeout 200 python3 -m pytest -q -p no:cacheprovider -m slow -n 8 tests > "$OUT/L2-sweep.log" 2>&1;
          log "L2 sweep exit $?"; tail -5 "$OUT/L2-sweep.log" ;;
    L1api) timeout 150 python3 -m pytest -q -p no:cacheprovider -n 4 tests/test_norm_api.py tests/test_backend.py \
          > "$OUT/L1.log" 2>&1; log "L1api exit $?"; tail -15 "$OUT/L1.log" ;;
    L2) timeout "${L2_LIMIT:-400}" bash ci/L2.sh > "$OUT/L2.log" 2>&1; log "L2 exit $?"; tail -30 "$OUT/L2.log" ;;
    diagT) timeout 150 python3 ci/diag_transpose.py -v > "$OUT/diagT.log" 2>&1; log "diagT exit $?"; tail -40 "$OUT/diagT.log" ;;
    launch) timeout 90 python3 ci/launch_overhead.py > "$OUT/launch.log" 2>&1; log "launch exit $?"; cat "$OUT/launch.log" ;;
    profk) timeout "${PROFK_LIMIT:-300}" python3 benchmarks/profile_kernels.py --json "$OUT/profk.json" ${PROFK_ARGS:-} \
          > "$OUT/profk.log" 2>&1; log "profk exit $?"; tail -80 "$OUT/profk.log" ;;
    mainjob) for t in 0 1; do  # the README's main job on both RMSNorm backends
          ENGINE_USE_RMSNORM_TRITON=$t timeout "${MAINJOB_LIMIT:-120}" python3 examples/train_llama.py ${MAINJOB_ARGS:-} \
            > "$OUT/mainjob_triton$t.log" 2>&1; log "mainjob ENGINE_USE_RMSNORM_TRITON=$t exit $?"
          tail -4 "$OUT/mainjob_triton$t.log"; done ;;
    profkB) timeout "${PROFK_LIMIT:-300}" python3 benchmarks/profile_kernels.py ${PROFKB_ARGS:-} \
          > "$OUT/profkB.log" 2>&1; log "profkB exit $?"; tail -80 "$OUT/profkB.log" ;;
    profkV) sides=""; for v in ${PROFKV_VECTORS:-8 4}; do sides="$sides${sides:+|}--fwd-vectors $v"; done
          OUT="$OUT" KAB_ARGS="${PROFKV_ARGS:-}" KAB_SIDES="$sides" KAB_REPS=1 KAB_LIMIT="${PROFK_LIMIT:-300}" \
            KAB_LOG=profkV.log bash ci/knob_ab.sh; log "profkV done"; tail -100 "$OUT/profkV.log" ;;
    hostprof) timeout 120 python3 ci/host_profile.py ${HOSTPROF_ARGS:-} > "$OUT/hostprof.log" 2>&1; log "hostprof exit $?"
          tail -70 "$OUT/hostprof.log" ;;
    profkjit) timeout "${PROFK_LIMIT:-300}" python3 benchmarks/profile_kernels.py --jit-launch ${PROFK_ARGS:-} \
          > "$OUT/profkjit.log" 2>&1; log "profkjit exit $?"; tail -40 "$OUT/profkjit.log" ;;
    ncu) for c in ${NCU_CASES:-cuda:4096:bf16 cuda:4096:fp8 triton:4096:fp8 triton:4096:bf16}; do
           c="${c//:/ }"  # backend:N:out (ci/ncu_case.py)
           echo "== ncu $c" >> "$OUT/ncu.log"
           timeout 120 ncu --clock-control none --kernel-name regex:"norm_fwd" --launch-skip 2 -c 1 \
             --section SpeedOfLight --section Occupancy --section WarpStateStats --section LaunchStats \
             --section MemoryWorkloadAnalysis --section InstructionStats --section SchedulerStats \
             python3 ci/ncu_case.py $c >> "$OUT/ncu.log" 2>&1
         done; log "ncu done"; grep -E "^== ncu|Duration|Throughput|Registers|Achieved Occupancy|Stall|Warp Cycles|Executed Instructions |Issue Slots Busy|Issued Warp|No Eligible|Eligible Warps|Grid Size|Block Size" "$OUT/ncu.log" | head -150 ;;
    ncuop) for c in ${NCU_CASES:-cuda:1024:fp8:ln triton:1024:fp8:ln}; do  # executed SASS per opcode
           # ("details": each count with its opcode; "values" printed the counts alone, session 6)
           c="${c//:/ }"
           echo "== ncuop $c" >> "$OUT/ncuop.log"
           timeout 120 ncu --clock-control none --kernel-name regex:"norm_fwd" --launch-skip 2 -c 1 --print-metric-instances details \
             --metrics sass__inst_executed_per_opcode,smsp__inst_executed.sum \
             python3 ci/ncu_case.py $c >> "$OUT/ncuop.log" 2>&1
         done; log "ncuop done"; grep -vE "^==PROF==" "$OUT/ncuop.log" | head -80 ;;
    ncustall) M=gpu__time_duration.sum,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum
           M=$M,lts__t_sector_hit_rate.pct,sm__warps_active.avg.pct_of_peak_sustained_active,launch__registers_per_thread
           M=$M,launch__occupancy_limit_registers,launch__occupancy_limit_shared_mem,launch__grid_size,launch__block_size
           M=$M,smsp__issue_active.avg.pct_of_peak_sustained_active,smsp__inst_executed.sum,smsp__warps_eligible.avg.per_cycle_active
           for r in barrier long_scoreboard short_scoreboard mio_throttle lg_throttle wait not_selected math_pipe_throttle \
                    membar drain no_instruction dispatch_stall branch_resolving selected; do
             M=$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio; done
           for c in ${NCU_CASES:-triton:16384:fp8}; do  # warp stall reasons per issued instruction
             echo "== ncustall $c" >> "$OUT/ncustall.log"; c="${c//:/ }"
             timeout 120 ncu --clock-control none --kernel-name regex:"${NCU_KERNEL:-norm_fwd}" --launch-skip 2 -c 1 --metrics "$M" \
               python3 ci/ncu_case.py $c 2>&1 | grep -vE "^==PROF==|^ +-+ |Metric Name" >> "$OUT/ncustall.log"
           done; log "ncustall done"; grep -E "^==|duration|dram__throughput|registers_per|warps_active|issue_active|stalled_(barrier|long|short|mio|lg|wait)" "$OUT/ncustall.log" | head -200 ;;
    ncusrc) for c in ${NCU_CASES:-cuda:4096:fp8:ln}; do  # executed instructions per SASS line (CSV)
           f="$OUT/ncusrc_${c//:/_}.csv"; c="${c//:/ }"
           timeout 150 ncu --clock-control none --kernel-name regex:"norm_fwd" --launch-skip 2 -c 1 --section SourceCounters \
             --page source --print-source sass --csv python3 ci/ncu_case.py $c > "$f" 2>&1
           log "ncusrc $c exit $? ($(wc -l < "$f") lines)"
         done ;;
    *) log "unknown stage $stage" ;;
  esac
done

# Hand the Triton cache back for the next call (a fresh machine starts bare; the build is copied
# right after the build stage).
if [ -d .triton_cache ]; then
  tar czf "$OUT/triton_cache.tgz" .triton_cache 2>/dev/null
  [ "$(stat -c %s "$OUT/triton_cache.tgz")" -gt 15000000 ] && rm -f "$OUT/triton_cache.tgz"
fi
log "done"
