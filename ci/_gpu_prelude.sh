# Sourced by ci/L1.sh, ci/L2.sh and ci/L3.sh (GPU levels): the repository root as working directory,
# logs under $OUT (default build/ci), unbuffered Python, no Triton interpreter, and the CUDA
# extension built in place (ci/build_ext.sh).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-build/ci}; mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
unset TRITON_INTERPRET
bash ci/build_ext.sh "$OUT"
