#!/usr/bin/env bash
# L0 compile check of engine/csrc, runnable without a GPU (a CPU-only torch is enough).
#
#   * every .cu under engine/csrc: plain `nvcc -c` with the flags of engine/_build.py (sm_90 by
#     default; ENGINE_CUDA_ARCHS overrides, e.g. "8.0;9.0");
#   * every binding .cpp under engine/csrc/extensions: `c++ -c` against torch's headers (plus the
#     CUDA and Python include dirs) with -DTORCH_EXTENSION_NAME=_C and torch's C++ ABI flag;
#   * ci/check_ptx_stores.py: the blocked forward's one-chunk y store is one st.global.v4.b32 in
#     the PTX of norm_fwd_bf16.cu (NOTES P124), and the lean forward loads gamma a slot ahead of
#     its use (P153).
# All files compile in parallel over the cores (the binding first: it is the longest job).
# Options: --ptxas-v   also print the ptxas register / spill / stack report of every kernel
#          --keep DIR  keep objects and logs in DIR instead of a temporary directory
#          -j N        parallel jobs (default: nproc)
# Exits non-zero on any compile error, on a compiler warning in our sources, on a failed PTX check,
# and (with --ptxas-v) on any kernel with a non-zero stack frame (register spills / local memory).
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
PTXAS_V=0
KEEP=""
JOBS="$(nproc 2>/dev/null || echo 2)"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --ptxas-v) PTXAS_V=1; shift ;;
    --keep) KEEP="$2"; shift 2 ;;
    -j) JOBS="$2"; shift 2 ;;
    *) echo "usage: $0 [--ptxas-v] [--keep DIR] [-j N]" >&2; exit 2 ;;
  esac
done

PY="${PYTHON:-python}"
command -v "$PY" >/dev/null 2>&1 || PY=python3
NVCC="${NVCC:-$(command -v nvcc || true)}"
if [[ -z "$NVCC" && -x /usr/local/cuda/bin/nvcc ]]; then NVCC=/usr/local/cuda/bin/nvcc; fi
if [[ -z "$NVCC" ]]; then echo "compile_csrc: nvcc not found (put it on PATH or set NVCC=...)" >&2; exit 1; fi
CXX="${CXX:-c++}"

if [[ -n "$KEEP" ]]; then OUT="$KEEP"; mkdir -p "$OUT"; else OUT="$(mktemp -d)"; trap 'rm -rf "$OUT"' EXIT; fi

# Flags and file lists come from engine/_build.py, loaded by path (no engine / torch import).
read_build() {
  "$PY" - "$ROOT" "$1" <<'PYEOF'
import importlib.util, os, sys
root, what = sys.argv[1], sys.argv[2]
spec = importlib.util.spec_from_file_location("_engine_build", os.path.join(root, "engine", "_build.py"))
b = importlib.util.module_from_spec(spec)
spec.loader.exec_module(b)
srcs = b.sources(root)
items = {
    "nvcc": b.nvcc_flags(os.environ.get("ENGINE_CUDA_ARCHS") or None),
    "cxx": b.cxx_flags(),
    "inc": b.include_dirs(root),
    "src": [s for s in srcs if s.endswith(".cpp")] + [s for s in srcs if s.endswith(".cu")],
}[what]
print("\n".join(items))
PYEOF
}
mapfile -t NVCC_FLAGS < <(read_build nvcc)
mapfile -t CXX_FLAGS < <(read_build cxx)
mapfile -t INCS < <(read_build inc)
mapfile -t SRCS < <(read_build src)
INC_FLAGS=()
for d in "${INCS[@]}"; do INC_FLAGS+=("-I$d"); done
NVCC_ARGS=("${NVCC_FLAGS[@]}" "${INC_FLAGS[@]}" -Xcompiler -fPIC -Xcompiler -Wall)
if [[ "$PTXAS_V" == 1 ]]; then NVCC_ARGS+=(-Xptxas -v); fi

CPP_ARGS=()
if printf '%s\n' "${SRCS[@]}" | grep -q '\.cpp$'; then
  mapfile -t TORCH_INCS < <("$PY" -c 'import torch.utils.cpp_extension as c; print("\n".join(c.include_paths()))')
  ABI="$("$PY" -c 'import torch; print(int(torch._C._GLIBCXX_USE_CXX11_ABI))')"
  PY_INC="$("$PY" -c 'import sysconfig; print(sysconfig.get_paths()["include"])')"
  # nvcc may be a wrapper script: ask it where its headers are.
  CUDA_INC="$("$NVCC" --dryrun -c -x cu /dev/null 2>&1 | sed -nE 's/.*INCLUDES="-I([^"]*)".*/\1/p' | head -1 | awk '{print $1}')"
  [[ -n "$CUDA_INC" && -f "$CUDA_INC/cuda_runtime.h" ]] || CUDA_INC=/usr/local/cuda/include
  CPP_ARGS=("${CXX_FLAGS[@]}" -fPIC -Wall -Werror=return-type "${INC_FLAGS[@]}")
  for d in "${TORCH_INCS[@]}"; do CPP_ARGS+=(-isystem "$d"); done
  # A CPU-only torch wheel ships the c10/cuda headers without the generated
  # c10/cuda/impl/cuda_cmake_macros.h; provide the CUDA build's content (shared-library build).
  have_macros=0
  for d in "${TORCH_INCS[@]}"; do [[ -f "$d/c10/cuda/impl/cuda_cmake_macros.h" ]] && have_macros=1; done
  if [[ "$have_macros" == 0 ]]; then
    mkdir -p "$OUT/stub/c10/cuda/impl"
    printf '#pragma once\n#define C10_CUDA_BUILD_SHARED_LIBS\n' >"$OUT/stub/c10/cuda/impl/cuda_cmake_macros.h"
    CPP_ARGS+=(-isystem "$OUT/stub")
  fi
  CPP_ARGS+=(-isystem "$CUDA_INC" -isystem "$PY_INC" -DTORCH_API_INCLUDE_EXTENSION_H
             -DTORCH_EXTENSION_NAME=_C "-D_GLIBCXX_USE_CXX11_ABI=$ABI")
fi

echo "compile_csrc: ${#SRCS[@]} files, $JOBS jobs, $("$NVCC" --version | tail -1)"
echo "compile_csrc: nvcc flags: ${NVCC_FLAGS[*]}"

export NVCC CXX OUT ROOT
export NVCC_ARGS_Q="$(printf '%q ' "${NVCC_ARGS[@]}")"
export CPP_ARGS_Q="$(printf '%q ' "${CPP_ARGS[@]}")"
compile_one() {
  local src="$1" rel base log t0=$SECONDS cmd
  rel="${src#"$ROOT"/}"
  base="$OUT/$(echo "$rel" | tr '/' '_')"
  log="$base.log"
  if [[ "$src" == *.cu ]]; then
    cmd="\"$NVCC\" $NVCC_ARGS_Q -c \"$src\" -o \"$base.o\""
  else
    cmd="\"$CXX\" $CPP_ARGS_Q -c \"$src\" -o \"$base.o\""
  fi
  if eval "$cmd" >"$log" 2>&1; then
    if grep -E "warning" "$log" | grep -v "^ptxas info" | grep -q .; then
      echo "WARN  $rel"; cat "$log"; return 1
    fi
    echo "ok    $rel ($((SECONDS - t0)) s)"
  else
    echo "FAIL  $rel"; cat "$log"; return 1
  fi
}
export -f compile_one

status=0
START=$SECONDS
printf '%s\n' "${SRCS[@]}" | xargs -P "$JOBS" -I{} bash -c 'compile_one "$@"' _ {} || status=1
# the blocked forward's one-chunk y store is one vector store in PTX (NOTES P124)
"$PY" "$ROOT/ci/check_ptx_stores.py" --nvcc "$NVCC" || status=1

if [[ "$PTXAS_V" == 1 ]]; then
  echo "compile_csrc: ptxas report per kernel (registers, stack frame, spills):"
  for log in "$OUT"/*.cu.log; do
    [[ -f "$log" ]] || continue
    awk '
      /Compiling entry function/ { match($0, /'\''[^'\'']*'\''/); fn = substr($0, RSTART + 1, RLENGTH - 2) }
      /bytes stack frame/ { st = $1; sp = $5; sl = $9 }
      /Used [0-9]+ registers/ { for (i = 1; i <= NF; i++) if ($i == "Used") r = $(i + 1);
                                printf "  %4s regs  %3s B stack  %3s/%3s B spill st/ld  %s\n", r, st, sp, sl, fn }
    ' "$log" | c++filt | sed -E 's/engine::(norm|transpose)::(\(anonymous namespace\)::)?//; s/\((engine::)?(norm::|transpose::)?(\(anonymous namespace\)::)?[A-Za-z]+Args\)//'
  done | tee "$OUT/ptxas_report.txt"
  if awk '$3 != "0" && $4 == "B" && $5 == "stack" {bad = 1} END {exit bad ? 0 : 1}' "$OUT/ptxas_report.txt"; then
    echo "compile_csrc: kernels with a stack frame (spills / local memory) above" >&2
    status=1
  fi
fi
echo "compile_csrc: $((SECONDS - START)) s, $([[ $status == 0 ]] && echo OK || echo FAILED)"
exit $status
