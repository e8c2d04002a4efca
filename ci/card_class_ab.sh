#!/usr/bin/env bash
# One GPU call: the card class (lean / wide DRAM bandwidth per SM, NOTES P109) each backend reads
# on this device, its test, then an A/B of the two classes' launch defaults on this device:
# benchmarks/profile_kernels.py --dram-class 0 (the device's own) against the other class, AB_REPS
# alternations (kernel time). Uses the built extension in place or the carried one (.carry/_C*,
# ci/_carry.sh). Logs under $OUT (class.log, ab.log).
#
#   OUT=... AB_ARGS="--impls triton --modes fwd fp8-delayed res-fwd --n 65536 131072" bash ci/card_class_ab.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-build/class}; mkdir -p "$OUT"
. ci/_carry.sh
if ! ls engine/_C*.so >/dev/null 2>&1 && [ "$(cat .carry/_C.srchash 2>/dev/null)" = "$(src_hash)" ]; then
  for p in $(carried_prefixes .carry/_C*.so.xz*); do unpack_so "$p" "engine/$(basename "$p")"; done
fi
export PYTHONPATH=$PWD TRITON_CACHE_DIR=$PWD/.triton_cache PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
{ nvidia-smi --query-gpu=name,memory.total,clocks.mem --format=csv
  python3 -c "
import torch, triton
from engine.triton_kernels import utils
from engine import cuda_backend
print('Triton: dram GB/s per SM', round(utils._dram_gbps_per_sm(0), 1), 'lean', utils.lean_dram(torch.device('cuda', 0)))
print('CUDA: device_dram_class()', cuda_backend.device_dram_class(), '(1 lean, 2 wide)')
print(triton.runtime.driver.active.utils.get_device_properties(0))"
  timeout 60 python3 -m pytest -q -p no:cacheprovider tests/test_backend.py -k dram_class 2>&1 | tail -2
} > "$OUT/class.log" 2>&1
cat "$OUT/class.log"
own=$(python3 -c "from engine import cuda_backend; print(cuda_backend.device_dram_class())" 2>/dev/null || echo 2)
other=$(( own == 1 ? 2 : 1 ))
for rep in $(seq "${AB_REPS:-2}"); do
  for cls in 0 $other; do
    echo "== rep $rep dram-class $cls" >> "$OUT/ab.log"
    timeout 150 python3 benchmarks/profile_kernels.py --graph --dram-class $cls \
      ${AB_ARGS:---impls triton --modes fwd fp8-delayed res-fwd --n 65536 131072} >> "$OUT/ab.log" 2>&1
  done
done
grep -E "^==|copy|card class|N=" "$OUT/ab.log"
