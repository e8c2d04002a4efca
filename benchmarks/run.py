"""The benchmark sweep of the GPU session: engine's backends and their peers, GB/s and % of copy BW.

Usage (repository root)::

    python benchmarks/run.py --suite rmsnorm|layernorm|fp8|all --out $OUT/bench.json [--quick]
    python benchmarks/run.py --dry-run --suite all            # CPU, tiny shapes: code paths only
    TRITON_INTERPRET=1 python benchmarks/run.py --dry-run     # ... with "triton" in the interpreter

Suites: ``rmsnorm`` / ``layernorm``: fwd, fwd+bwd and residual+norm fwd at N = 1K..128K with
M*N = 64M, bf16, plus the small shapes 32x4096 and 256x8192 (fwd, host + device microseconds per
call). ``fp8``: norm -> e4m3 delayed and current scaling, with the transposed copy (external and
in-kernel transpose side by side) and cast_transpose. Every (mode, N) row times engine's ``cuda``
and ``triton`` backends and the peers in the same process; a row that fails records its error and
the sweep goes on. The JSON (rewritten after every shape) holds the device, versions, the copy
bandwidth and every row; the tables printed last give % of copy bandwidth (small shapes: us).
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tabulate import tabulate  # noqa: E402

from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402

SUITES = ("rmsnorm", "layernorm", "fp8")
_HEADER = {"cuda": "cuda", "triton": "triton", "cuda-int": "cu-int", "triton-int": "tr-int",
           "cuda-ext": "cu-ext", "triton-ext": "tr-ext",
           "eager": "eager", "F": "F", "compile": "compile", "liger": "liger"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--suite", choices=SUITES + ("all",), default="all")
    p.add_argument("--out", type=Path, default=None, help="JSON file (rewritten after every shape)")
    p.add_argument("--quick", action="store_true", help="N in {1K, 8K, 64K} only")
    p.add_argument("--dry-run", action="store_true", help="CPU-sized shapes, to check the code paths")
    p.add_argument("--n", type=str, default=None, help="comma-separated N list (overrides the sweep)")
    p.add_argument("--impls", type=str, default=None,
                   help=f"comma-separated subset of {','.join(C.IMPL_ORDER)}")
    p.add_argument("--no-compile", action="store_true", help="skip the torch.compile peer")
    p.add_argument("--no-small", action="store_true", help="skip the small-shape rows")
    p.add_argument("--fp8-norm", choices=("rmsnorm", "layernorm"), default="rmsnorm")
    p.add_argument("--warmup-ms", type=float, default=10.0)
    p.add_argument("--rep-ms", type=float, default=50.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--time-limit-s", type=float, default=540.0,
                   help="start no new shape after this many seconds (the device caps a command at 600)")
    p.add_argument("--compile-budget-s", type=float, default=None,
                   help="skip the compile peer once its first calls have taken this many seconds in all")
    return p.parse_args(argv)


def sweep(args) -> tuple:
    """(large shapes, small shapes) for the run."""
    if args.dry_run:
        ns = (256, 1024) if args.n is None else tuple(int(v) for v in args.n.split(","))
        return [H.large_shape(n, 64 * 1024) for n in ns], [(4, 512), (8, 1024)]
    if args.n is not None:
        ns = tuple(int(v) for v in args.n.split(","))
    else:
        ns = H.QUICK_N if args.quick else H.SWEEP_N
    return [H.large_shape(n) for n in ns], list(H.SMALL_SHAPES)


def wanted_impls(args, norm: str, mode: str) -> list:
    impls = list(C.impls_for(norm, mode))
    if args.impls:
        keep = set(args.impls.split(","))
        impls = [i for i in impls if i in keep]
    if args.no_compile:
        impls = [i for i in impls if i != "compile"]
    return impls


def measure(results: H.Results, suite: str, spec: C.Spec, inp, m: int, n: int, small: bool,
            args) -> dict:
    """Build, check and time one case; the row records the numbers or why there are none."""
    nb = C.nbytes(spec, m, n)
    row = {"suite": suite, "op": spec.label, "norm": spec.norm, "mode": spec.mode, "impl": spec.impl,
           "M": m, "N": n, "bytes": nb, "timing": "host" if small else "device"}
    try:
        unavailable = args.unavailable.get(spec.impl.split("-")[0])
        if unavailable:
            raise RuntimeError(unavailable)
        if spec.impl == "compile" and args.compile_budget_s is not None and \
                _compile_seconds(results) > args.compile_budget_s:
            raise C.Skip(f"compile budget of {args.compile_budget_s:.0f}s spent")
        case = C.build(spec, inp)
        row["setup_s"] = round(case.setup_s, 3)
        if case.backend:
            row["backend"] = case.backend
        errs = C.check(spec, inp, case.outputs(case.first))
        case.first = None
        row["err"] = {k: float(f"{v:.3g}") for k, v in errs.items()}
        row["check"] = "ok" if C.check_ok(errs) else "FAIL"
        dev_ms = H.bench(case.fn, warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        row["device_us"] = round(dev_ms * 1e3, 3)
        if small:
            quick = {"min_loop_ms": 2, "repeats": 2, "warmup": 2} if args.dry_run else {}
            us = H.host_loop_us(case.fn, **quick)
        else:
            us = dev_ms * 1e3
        row["us"] = round(us, 3)
        row["gbps"] = round(H.gbps(nb, us / 1e3), 1)
        row["pct_copy"] = round(100.0 * H.gbps(nb, us / 1e3) / results.meta["copy"]["gbps"], 1)
    except C.Skip as e:
        row["skipped"] = str(e)
    except Exception as e:  # a failing backend must not end the sweep
        row["error"] = H.short_error(e)
    finally:
        if spec.impl in C.ENGINE_IMPLS:
            H.reset_backend()
    results.add(row)
    return row


def _compile_seconds(results: H.Results) -> float:
    return sum(r.get("setup_s", 0.0) for r in results.rows if r["impl"] == "compile")


class TimeUp(BaseException):
    """The run's time limit passed (or SIGTERM came): report what was measured. A BaseException,
    so that the per-row ``except Exception`` does not swallow it."""


def cell(row: dict, small: bool = False) -> str:
    if "skipped" in row:
        return "-"
    if "error" in row:
        return "err"
    v = f"{row['us']:.1f}" if small else f"{row['pct_copy']:.0f}"
    return v + ("!" if row.get("check") == "FAIL" else "")


def run_suite(results: H.Results, suite: str, args, t_start: float) -> None:
    large, small = sweep(args)
    dev = H.device()
    if suite == "fp8":
        modes = [(args.fp8_norm, m) for m in C.FP8_MODES]
        small = []
    else:
        modes = [(suite, m) for m in C.NORM_MODES]
    if args.no_small:
        small = []
    todo = [(m, n, norm, mode, False) for (m, n) in large for (norm, mode) in modes]
    todo += [(m, n, suite, "fwd", True) for (m, n) in small]
    for m, n, norm, mode, is_small in todo:
        if time.perf_counter() - t_start > args.time_limit_s:
            raise TimeUp(f"time limit {args.time_limit_s:.0f}s reached before {suite} {mode} {m}x{n}")
        inp = C.make_inputs(norm, mode, m, n, dev, seed=args.seed + n)
        line = []
        for impl in wanted_impls(args, norm, mode):
            r = measure(results, suite, C.Spec(norm, mode, impl), inp, m, n, is_small, args)
            line.append(f"{impl}={cell(r, is_small)}")
        del inp
        H.free_memory()
        results.save()
        label = C.Spec(norm, mode, "eager").label
        print(f"[{time.perf_counter() - t_start:6.1f}s] {label:14s} {m}x{H.fmt_n(n):<5s} " + " ".join(line),
              flush=True)


def print_report(results: H.Results) -> None:
    meta = results.meta
    rows = results.rows
    errors = {}
    for r in rows:
        if "error" in r:
            errors.setdefault((r["impl"], r["error"]), []).append(f"{r['op']}@{H.fmt_n(r['N'])}")
    if errors:
        print("\nerrors (impl: error [count, first]):")
        for (impl, err), where in errors.items():
            print(f"  {impl}: {err[:110]} [{len(where)}, {where[0]}]")
    fails = [f"{r['impl']} {r['op']}@{H.fmt_n(r['N'])} {r['err']}" for r in rows if r.get("check") == "FAIL"]
    if fails:
        print(f"\ncheck FAILED ({len(fails)}; '!' in the tables): " + "; ".join(fails[:6]))
    order = [_HEADER[i] for i in C.IMPL_ORDER]
    print(f"\n{meta['device']} | torch {meta['torch']} | triton {meta['triton']} | CUDA {meta['cuda']} | "
          f"engine {meta['engine_commit']}")
    print(f"copy bandwidth {meta['copy_gbps']:.0f} GB/s (read+write); cells: % of it; "
          f"err = failed, - = n/a, ! = check failed")
    print("bar (PERF.md): norm fwd >= 90, fwd+bwd >= 80, norm->fp8 >= 85, +transposed >= 75 (% of copy); "
          "32x4096 fwd <= 10 us")
    if meta.get("stopped"):
        print(f"STOPPED EARLY ({meta['stopped']}): the tables are partial")
    for suite in SUITES:
        big = [r for r in rows if r["suite"] == suite and r["timing"] == "device"]
        if big:
            rank = {}
            for r in big:
                rank.setdefault(r["op"], len(rank))
            big.sort(key=lambda r: (rank[r["op"]], r["N"]))
            big = [dict(r, impl=_HEADER[r["impl"]], N=H.fmt_n(r["N"])) for r in big]
            hdr, table = H.pivot(big, ("op", "N"), "impl", cell, order)
            print(tabulate(table, headers=hdr, tablefmt="plain", stralign="right"))
    small = [dict(r, impl=_HEADER[r["impl"]], shape=f"{r['M']}x{r['N']}") for r in rows
             if r["timing"] == "host"]
    if small:
        print("small shapes, us per call (host + device, back-to-back calls):")
        hdr, table = H.pivot(small, ("op", "shape"), "impl", lambda r: cell(r, True), order)
        print(tabulate(table, headers=hdr, tablefmt="plain", stralign="right"))


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.dry_run:  # CPU numbers mean nothing: time as little as the code paths need
        args.warmup_ms, args.rep_ms = 0.0, min(args.rep_ms, 2.0)
    if not args.dry_run and not H.on_gpu():
        print("no CUDA device: use --dry-run for a CPU check of the code paths", file=sys.stderr)
        return 2
    t_start = time.perf_counter()
    meta = H.environment()
    meta["args"] = vars(args)
    meta["copy"] = H.copy_bandwidth()
    meta["copy_gbps"] = round(meta["copy"]["gbps"], 1)
    results = H.Results(args.out, meta)
    print(f"{meta['device']}: copy {meta['copy_gbps']:.0f} GB/s", flush=True)
    args.unavailable = {}
    if H.on_gpu():
        meta["backend_setup"] = {}
        for name in ("cuda", "triton"):  # the CUDA extension may JIT-build here: once, not per row
            t0 = time.perf_counter()
            try:
                H.use_backend(name)
                meta["backend_setup"][name] = f"ready in {time.perf_counter() - t0:.1f}s"
            except Exception as e:
                args.unavailable[name] = f"backend unavailable: {H.short_error(e)}"
                meta["backend_setup"][name] = args.unavailable[name]
            finally:
                H.reset_backend()
        print(f"backends: {meta['backend_setup']}", flush=True)
    suites = SUITES if args.suite == "all" else (args.suite,)
    suite_s = {}

    def on_term(signum, frame):
        raise TimeUp(f"signal {signum}")

    signal.signal(signal.SIGTERM, on_term)
    try:
        for suite in suites:
            t0 = time.perf_counter()
            run_suite(results, suite, args, t_start)
            suite_s[suite] = round(time.perf_counter() - t0, 1)
    except (TimeUp, KeyboardInterrupt) as e:
        meta["stopped"] = H.short_error(e)
        print(f"STOPPED: {meta['stopped']}", flush=True)
    meta["suite_seconds"] = suite_s
    meta["compile_seconds"] = round(_compile_seconds(results), 1)
    meta["total_seconds"] = round(time.perf_counter() - t_start, 1)
    results.save()
    print_report(results)
    print(f"total {meta['total_seconds']}s (suites {suite_s}; torch.compile first calls "
          f"{meta['compile_seconds']}s)" + (f"; JSON: {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
