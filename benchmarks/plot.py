"""PNG plots of ``benchmarks/run.py`` results: GB/s against N per impl, one PNG per suite.

Usage::

    python benchmarks/plot.py results/h100.json [results/h200.json ...] --outdir benchmarks/results

One figure per suite (rmsnorm, layernorm, fp8), one panel per mode, log2 N axis, a line per impl
(colour) and per input file (line style), and each file's copy bandwidth as a horizontal line.
Needs matplotlib (a development dependency of the plots only).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

IMPL_COLOR = {"cuda": "C0", "triton": "C1", "cuda-int": "C9", "triton-int": "C3", "cuda-ext": "C8",
              "triton-ext": "C5", "eager": "0.55",
              "F": "C4", "compile": "C2", "liger": "C6"}
STYLES = ("-", "--", ":", "-.")
MARKERS = ("o", "s", "^", "D")


def _fmt_n(n: int) -> str:
    return f"{n // 1024}K" if n % 1024 == 0 else str(n)


def load(paths):
    runs = []
    for p in paths:
        d = json.loads(Path(p).read_text())
        runs.append((Path(p).stem, d["meta"], d["rows"]))
    return runs


def plot_suite(suite: str, runs, outdir: Path, metric: str) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ops = []
    for _, _, rows in runs:
        for r in rows:
            if r["suite"] == suite and r["timing"] == "device" and r["op"] not in ops:
                ops.append(r["op"])
    cols = min(3, len(ops))
    nrows = (len(ops) + cols - 1) // cols
    fig, axes = plt.subplots(nrows, cols, figsize=(6 * cols, 4.2 * nrows), squeeze=False)
    for ax, op in zip(axes.flat, ops):
        ns = set()
        for k, (name, meta, rows) in enumerate(runs):
            style, marker = STYLES[k % len(STYLES)], MARKERS[k % len(MARKERS)]
            sel = [r for r in rows if r["suite"] == suite and r["op"] == op and r["timing"] == "device"
                   and metric in r]
            for impl in dict.fromkeys(r["impl"] for r in sel):
                pts = sorted((r["N"], r[metric]) for r in sel if r["impl"] == impl)
                ns.update(n for n, _ in pts)
                label = impl if len(runs) == 1 else f"{impl} ({name})"
                ax.plot([n for n, _ in pts], [v for _, v in pts], linestyle=style, marker=marker,
                        markersize=4, color=IMPL_COLOR.get(impl), label=label)
            ceiling = meta["copy_gbps"] if metric == "gbps" else 100.0
            ax.axhline(ceiling, color="k", linestyle=style, linewidth=1,
                       label=f"copy {meta['copy_gbps']:.0f} GB/s" + ("" if len(runs) == 1 else f" ({name})"))
        ax.set_xscale("log", base=2)
        if ns:
            ticks = sorted(ns)
            ax.set_xticks(ticks)
            ax.set_xticklabels([_fmt_n(n) for n in ticks])
        ax.set_ylim(bottom=0)
        ax.set_title(op)
        ax.set_xlabel("N (hidden size), M*N fixed")
        ax.set_ylabel("GB/s (fewest bytes / median time)" if metric == "gbps" else "% of copy bandwidth")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7, ncol=2)
    for ax in list(axes.flat)[len(ops):]:
        ax.set_visible(False)
    heads = "; ".join(f"{m['device']} torch {m['torch']} triton {m['triton']}" for _, m, _ in runs)
    fig.suptitle(f"{suite} -- {heads}", fontsize=10)
    fig.tight_layout()
    out = outdir / f"{suite}.png"
    fig.savefig(out, dpi=110)
    plt.close(fig)
    return out


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("json", nargs="+", type=Path, help="run.py JSON files")
    p.add_argument("--outdir", type=Path, default=None, help="default: the first file's folder")
    p.add_argument("--metric", choices=("gbps", "pct_copy"), default="gbps")
    args = p.parse_args(argv)
    runs = load(args.json)
    outdir = args.outdir or args.json[0].parent
    outdir.mkdir(parents=True, exist_ok=True)
    suites = []
    for _, _, rows in runs:
        for r in rows:
            if r["timing"] == "device" and r["suite"] not in suites:
                suites.append(r["suite"])
    for suite in suites:
        print(plot_suite(suite, runs, outdir, args.metric))
    return 0


if __name__ == "__main__":
    sys.exit(main())
