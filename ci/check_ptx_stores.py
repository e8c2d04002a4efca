"""L0 checks of the CUDA forward's y stores in PTX (NOTES P124, P153), without a GPU.

NVVM compiled the blocked forward's 16-byte store of a 16-bit y (``store_words`` of a ``uint4``
through an ``O*`` of 2-byte alignment) into four ``st.global.u32``; since session 38 a row of one
chunk stores it with one ``st.global.v4.b32`` (``store_words_v``, inline PTX). This compiles
``norm_fwd_bf16.cu`` to PTX with engine's nvcc flags (``-arch=compute_90`` instead of the
gencodes) and fails if any packed build of the blocked kernel (a 16-bit x, ``VEC`` 8) lacks that
vector store.

In the same PTX, the lean forward (norm_fwd_lean.cuh) must load each slot's gamma (and beta) one
slot ahead, before the previous slot's store of y (P153: +1.3 to +2.1 points on the H200). The
compiler keeps every load after the stores that precede it in the source, so written at its
use, each load followed the previous slot's store (PTX: ``ld st ld st ... ld st``, one L1 round
trip per slot); loaded ahead, each epilogue body ends in two stores in a row (the last slot's
gamma was loaded before the previous store). The check: every lean build has one such pair per
epilogue body (RMSNorm one, LayerNorm two: its exact and FMA forms). Run by ci/compile_csrc.sh::

    python ci/check_ptx_stores.py [--nvcc PATH]
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
SOURCE = "engine/csrc/normalization/norm_fwd_bf16.cu"
# mangled names of norm_fwd_blocked_kernel<X, X, bf16, 8, 4, W, kNorm> (X bf16 or fp16: the
# packed builds, whose bf16 y is stored 16 bytes at a time)
PACKED = re.compile(r"_ZN6engine4norm23norm_fwd_blocked_kernelI"
                    r"(13__nv_bfloat16S2_S2_|6__halfS2_13__nv_bfloat16)Li8ELi4E")


def build_flags() -> list:
    spec = importlib.util.spec_from_file_location("_engine_build", ROOT / "engine" / "_build.py")
    b = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(b)
    flags = [f for f in b.nvcc_flags() if not f.startswith("-gencode")]
    return flags + ["-arch=compute_90"] + [f"-I{d}" for d in b.include_dirs(str(ROOT))]


def entries(ptx: str) -> dict:
    """PTX text of each kernel entry, by mangled name."""
    starts = [m for m in re.finditer(r"^\.visible \.entry (\S+)\(", ptx, re.M)]
    out = {}
    for i, m in enumerate(starts):
        end = starts[i + 1].start() if i + 1 < len(starts) else len(ptx)
        out[m.group(1)] = ptx[m.start():end]
    return out


LEAN = re.compile(r"_ZN6engine4norm20norm_fwd_lean_kernelI\S*?Lb([01])ELb[01]E")


def global_ops(body: str) -> str:
    """The kernel's global loads and stores in PTX order: L (ld.global) / S (st.global), with the
    vector width (1, 2 or 4), space-separated."""
    ops = re.findall(r"^\s*(?:@!?%p\d+ )?(ld|st)\.global(\S*)", body, re.M)
    return " ".join(("L" if op == "ld" else "S") + ("4" if ".v4" in m else "2" if ".v2" in m else "1")
                    for op, m in ops)


def lean_loads_ahead(ptx: str) -> list:
    """Problems with the lean kernel's gamma loads (empty: every build loads them a slot ahead)."""
    lean = {k: v for k, v in entries(ptx).items() if LEAN.match(k)}
    if not lean:
        return ["no build of norm_fwd_lean_kernel found in the PTX"]
    bad = []
    for k, v in lean.items():
        want = 1 if LEAN.match(k).group(1) == "1" else 2  # epilogue bodies: RMSNorm 1, LayerNorm 2
        pairs = len(re.findall(r"(?=S4 S4)", global_ops(v)))
        if pairs < want:
            bad.append(f"{k}: {pairs} of {want} epilogue bodies end in two y stores in a row "
                       "(gamma loaded at its use, after the previous slot's store?)")
    return bad


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nvcc", default=shutil.which("nvcc") or "/usr/local/cuda/bin/nvcc")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "norm_fwd_bf16.ptx"
        cmd = [args.nvcc, *build_flags(), "-ptx", str(ROOT / SOURCE), "-o", str(out)]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            print(r.stdout + r.stderr)
            print(f"check_ptx_stores: nvcc -ptx {SOURCE} failed")
            return 1
        ptx = out.read_text()
    packed = {k: v for k, v in entries(ptx).items() if PACKED.match(k)}
    if not packed:
        print("check_ptx_stores: no packed build of norm_fwd_blocked_kernel found in the PTX")
        return 1
    bad = [k for k, v in packed.items() if "st.global.v4.b32" not in v]
    for k in bad:
        print(f"check_ptx_stores: no st.global.v4.b32 (one-chunk y store) in {k}")
    print(f"check_ptx_stores: {len(packed) - len(bad)}/{len(packed)} packed blocked builds store y "
          f"with st.global.v4.b32")
    lean_bad = lean_loads_ahead(ptx)
    for b in lean_bad:
        print(f"check_ptx_stores: {b}")
    if not lean_bad:
        print("check_ptx_stores: every lean forward build loads gamma a slot ahead of its use")
    return 1 if bad or lean_bad else 0


if __name__ == "__main__":
    sys.exit(main())
