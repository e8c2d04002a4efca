"""README.rst result tables from a ``benchmarks/run.py`` JSON (so no number is copied by hand).

    python benchmarks/readme_tables.py benchmarks/results/h200_bench_all.json [more.json ...]
    python benchmarks/readme_tables.py --kernels benchmarks/results/h200_profile_kernels_s16_all.json

Prints three reStructuredText tables: the norms (engine's two backends and the best peer per
cell, % of copy bandwidth), the FP8 outputs (with the in-kernel transpose rows; LayerNorm's when a
JSON of ``run.py --suite fp8 --fp8-norm layernorm`` is given too) and the small shapes (µs per
call, host + device). With several JSON files the rows of all are used, each cell as % of the copy
bandwidth measured in its own run; where two runs have the same cell the first file's is shown.
With ``--kernels`` it prints the kernel-time table of one ``profile_kernels.py --json`` run (the
device time of engine's kernels alone, % of the copy bandwidth of that run); with ``--bars`` how
many of that run's cells meet the issues' bars (:data:`BARS`), the cells under them, and with
``--against EARLIER.json`` the cells that crossed their bar since::

    python benchmarks/readme_tables.py --bars new.json --against old.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from tabulate import tabulate

PEERS = ("F", "compile", "liger", "eager")


def _n(n: int) -> str:
    return f"{n // 1024}K"


def _rows(data):
    return [r for r in data["rows"] if "pct_copy" in r or "us_per_call" in r]


def large_table(rows, ops, engine_impls, peer_impls=PEERS):
    ns = sorted({r["N"] for r in rows if r.get("timing") == "device"})
    out = []
    for op in ops:
        cells = {}
        for r in rows:  # the first run given wins where two runs have the same cell
            if r["op"] == op and r.get("timing") == "device":
                cells.setdefault((r["impl"], r["N"]), r)
        if not cells:
            continue
        for impl, label in engine_impls:
            if any((impl, n) in cells for n in ns):
                out.append([op, label] + [_pct(cells.get((impl, n))) for n in ns])
        best = []
        for n in ns:
            peers = [cells[(p, n)] for p in peer_impls if (p, n) in cells and "pct_copy" in cells[(p, n)]]
            b = max(peers, key=lambda r: r["pct_copy"], default=None)
            best.append(f"{b['pct_copy']:.0f} {b['impl']}" if b else "-")
        out.append([op, "best peer"] + best)
    return tabulate(out, headers=["op", "impl"] + [_n(n) for n in ns], tablefmt="rst")


def _pct(r):
    return f"{r['pct_copy']:.0f}" if r is not None and "pct_copy" in r else "-"


def small_table(rows):
    small = [r for r in rows if r.get("timing") == "host"]
    impls = ["cuda", "triton", "F", "compile", "liger", "eager"]
    keys = list(dict.fromkeys((r["op"], f"{r['M']}x{r['N']}") for r in small))
    out = []
    for op, shape in keys:
        cells = {r["impl"]: r for r in small if r["op"] == op and f"{r['M']}x{r['N']}" == shape}
        out.append([op, shape] + [f"{cells[i]['us']:.1f}" if i in cells and "us" in cells[i] else "-"
                                  for i in impls])
    return tabulate(out, headers=["op", "shape"] + impls, tablefmt="rst")


_KERNEL_OPS = (("rmsnorm", "fwd", "rms fwd"), ("rmsnorm", "fwd+bwd", "rms f+b"),
               ("rmsnorm", "res-fwd", "rms +res fwd"), ("rmsnorm", "fp8-delayed", "rms >e4m3 dly"),
               ("layernorm", "fwd", "ln fwd"), ("layernorm", "fwd+bwd", "ln f+b"),
               ("layernorm", "res-fwd", "ln +res fwd"), ("layernorm", "fp8-delayed", "ln >e4m3 dly"),
               ("rmsnorm", "fp8-T", "rms >e4m3+T"), ("layernorm", "fp8-T", "ln >e4m3+T"),
               ("rmsnorm", "res-fp8", "rms +res>e4m3"), ("layernorm", "res-fp8", "ln +res>e4m3"),
               ("rmsnorm", "cast-T", "castT e4m3"))  # a row only where the JSON has the mode


def kernel_table(data):
    """Kernel time (``benchmarks/profile_kernels.py --json``): % of copy per (op, impl, N)."""
    rows = data["rows"]
    ns = sorted({r["n"] for r in rows})
    out = []
    for norm, mode, label in _KERNEL_OPS:
        for impl in ("cuda", "triton"):
            cells = {r["n"]: r for r in rows if (r["norm"], r["mode"], r["impl"]) == (norm, mode, impl)}
            if cells:
                out.append([label, impl] + [f"{cells[n]['kernels_pct']:.0f}" if n in cells else "-"
                                            for n in ns])
    return tabulate(out, headers=["op", "impl"] + [_n(n) for n in ns], tablefmt="rst")


#: The issues' bars, % of copy in kernel time, by profile_kernels.py mode (the residual form to
#: e4m3 has none of its own).
BARS = {"fwd": 90, "fwd+bwd": 80, "res-fwd": 90, "fp8-delayed": 85, "fp8-T": 75, "cast-T": 80}


def _bar_cells(data):
    """{(label, impl, n): kernels_pct} of one profile_kernels.py JSON, the cells with a bar."""
    labels = {(norm, mode): label for norm, mode, label in _KERNEL_OPS}
    return {(labels[(r["norm"], r["mode"])], r["impl"], r["n"]): (r["kernels_pct"], BARS[r["mode"]])
            for r in data["rows"] if r["mode"] in BARS and (r["norm"], r["mode"]) in labels}


def bar_summary(data, against=None) -> str:
    """How many cells with a bar meet it (kernel time), the ones under it, and with ``against``
    (an earlier run's JSON) the cells that crossed their bar since, either way."""
    cells = _bar_cells(data)
    met = sum(pct >= bar for pct, bar in cells.values())
    out = [f"{met} of {len(cells)} cells with a bar meet it"]
    for (label, impl, n), (pct, bar) in sorted(cells.items(), key=lambda kv: (kv[0][0], kv[0][1], kv[0][2])):
        if pct < bar:
            out.append(f"under: {label} {impl} {_n(n)} {pct:.1f} (bar {bar})")
    if against is not None:
        old = _bar_cells(against)
        for key in sorted(set(cells) & set(old), key=lambda k: (k[0], k[1], k[2])):
            (pct, bar), (was, _) = cells[key], old[key]
            if (pct >= bar) != (was >= bar):
                label, impl, n = key
                out.append(f"{'over' if pct >= bar else 'under'} now: {label} {impl} {_n(n)} "
                           f"{was:.1f} -> {pct:.1f} (bar {bar})")
    return "\n".join(out)


def main(argv=None) -> int:
    args = list(argv or sys.argv[1:])
    if args and args[0] == "--kernels":  # one profile_kernels.py JSON
        print(kernel_table(json.loads(Path(args[1]).read_text())))
        return 0
    if args and args[0] == "--bars":  # one profile_kernels.py JSON [--against an earlier one]
        against = json.loads(Path(args[3]).read_text()) if args[2:3] == ["--against"] else None
        print(bar_summary(json.loads(Path(args[1]).read_text()), against))
        return 0
    rows = []
    for path in args:  # several runs: their rows together, each % of its own copy
        rows += _rows(json.loads(Path(path).read_text()))
    eng = [("cuda", "cuda"), ("triton", "triton")]
    print(large_table(rows, ["rms fwd", "rms f+b", "rms +res fwd", "ln fwd", "ln f+b", "ln +res fwd"], eng))
    print()
    print(large_table(rows, ["rms >e4m3 dly", "rms >e4m3 cur", "rms >e4m3+T", "ln >e4m3 dly",
                             "ln >e4m3 cur", "ln >e4m3+T", "castT e4m3"],
                      eng + [("cuda-int", "cuda-int"), ("triton-int", "triton-int"), ("cuda-ext", "cuda-ext"),
                             ("triton-ext", "triton-ext")], ("compile", "eager")))
    print()
    print(small_table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
