"""Config sweep of the Triton norm kernels: the best NormConfig per (N, op), next to the heuristic's.

Usage (repository root)::

    python benchmarks/tune.py --out $OUT/tune.json                 # GPU: N = 1K..128K, M*N = 64M, bf16
    python benchmarks/tune.py --dry-run                            # CPU, Triton interpreter, tiny shapes

Ops: ``fwd`` (bf16 -> bf16), ``bwd`` (dx, dweight; the partial-dW reduce included), ``fwd-fp8``
(bf16 -> e4m3 rowwise, delayed scaling), ``fwd-fp8T`` (bf16 -> e4m3 rowwise + transposed, the
in-kernel transpose path, delayed scaling) and ``fwd-res`` (bf16 x + a bf16 residual -> bf16 y and
residual_out, the candidates of ``fwd``). Each candidate is
launched through ``engine.triton_kernels.norms.launch_fwd`` / ``launch_bwd`` with ``config=``, its
output poisoned beforehand and checked against ``engine.reference`` (fp32) afterwards, then timed
with do_bench (median), or with ``--kernel-time`` by the summed device time of its kernels (the
table's metric). Search: stage 1 over (block_m, block_n, blocked, num_warps) at two programs
per SM (16 warps' worth for 1- and 2-warp programs); stage 2 sweeps programs_per_sm (1..32: 32 is
about one program per tile, i.e. not persistent, at M*N = 64M for small tiles) for the three best;
stage 3 num_stages in {1, 2, 4} (3 is the default) for the best one. Candidates:

* row in registers (``blocked=False``, ``block_n = next_pow2(N)``): ``block_m`` in {1, 2, 4, 8, 16}
  with ``block_m * block_n <= 32K`` (16K for bwd), ``num_warps`` in {1, 2, 4, 8, 16, 32} keeping
  8..64 elements per thread (4..32 for bwd and fwd-fp8, whose epilogue holds more registers);
* blocked two-pass (N >= 4K): chunk ``block_n`` in {2048, 4096, 8192, 16384, 32768} up to N,
  ``block_m`` in {1, 2} (torch.compile's kernels at 8K-32K are this shape: one row per program,
  pass 2 re-reading from L2; ci/inductor_code.py, h200_inductor_configs.log), for bwd {1, 2, 4, 8};
* fwd-fp8T: by bands (``--band-rows``, default ``norms.BAND_ROWS``) the fwd-fp8 candidates with
  ``block_m`` dividing the band; with ``--band-rows 0`` (the tile's own transposed stores)
  ``block_m`` in {16, 32, 64}, ``block_n`` in {64, 128, 256}, ``num_warps`` in {4, 8};
* the backward's head + tail register tiles (N between the powers of two, ``--kinds tail`` alone):
  ``block_n = next_pow2(N) / 2`` and a tail tile of the rest (``tail=True``, ``norms._tail_n``;
  "2x4096+t" at N = 5120), as a register tile or one blocked chunk ("2x4096+tB"), ``block_m`` in
  {1, 2, 4}, 4-32 values per thread;
* the split backward (bwd from 16K; ``split=True``): slices of 4096, 8192 or 16384
  columns at 8-64 elements per thread, one program per SM (no stage 2); ``--kinds split`` tries
  only these.

A compile per (block_m, block_n, blocked, num_warps) dominates the time (about a second each on an
H100), so ``--max-seconds`` stops trying new candidates when spent; what was measured is reported.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

if "--dry-run" in sys.argv:  # the interpreter must be chosen before triton is imported
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402
from tabulate import tabulate  # noqa: E402

from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402
from engine import reference  # noqa: E402
from engine.triton_kernels import norms  # noqa: E402
from engine.triton_kernels import norms_common as nc  # noqa: E402
from engine.triton_kernels.norms_common import NormConfig  # noqa: E402
from engine.triton_kernels.utils import lean_dram  # noqa: E402

OPS = ("fwd", "bwd", "fwd-fp8", "fwd-fp8T", "fwd-res")
FP8 = torch.float8_e4m3fn
TOL = {"y": 1e-2, "dx": 1e-2, "dw": 1e-2, "db": 1e-2, "q": 0.1, "qt": 0.0}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", type=Path, default=None, help="JSON file")
    p.add_argument("--dry-run", action="store_true",
                   help="CPU tensors in the Triton interpreter (TRITON_INTERPRET=1), tiny shapes")
    p.add_argument("--n", type=str, default=None, help="comma-separated N list (default: the sweep)")
    p.add_argument("--ops", type=str, default=",".join(OPS), help=f"subset of {','.join(OPS)}")
    p.add_argument("--norm", choices=("rmsnorm", "layernorm"), default="rmsnorm")
    p.add_argument("--band-rows", type=int, choices=(0, 16, 32), default=None,
                   help="fwd-fp8T: rows per band of the transposed copy (engine.triton_kernels.norms."
                        "BAND_ROWS; 0: the tile's own transposed stores, the path before bands)")
    p.add_argument("--warmup-ms", type=float, default=5.0)
    p.add_argument("--rep-ms", type=float, default=20.0)
    p.add_argument("--kinds", choices=("all", "split", "tail"), default="all",
                   help="split: only the split backward's candidates (bwd from 16K); tail: only the "
                        "backward's head + tail register tiles (N between the powers of two)")
    p.add_argument("--max-seconds", type=float, default=220.0,
                   help="try no new candidate after this many seconds")
    p.add_argument("--kernel-time", action="store_true",
                   help="time each config by the summed device time of its kernels (the profiler's "
                        "median of 15 calls, as profile_kernels.py and ci/cfg_exp.py measure the "
                        "table) instead of do_bench's wall time, which also counts the launches and "
                        "the partials' allocation (NOTES P190b: a tile ranked 1.22x by do_bench read "
                        "0.98x in kernel time); GPU only")
    args = p.parse_args(argv)
    if args.kernel_time and args.dry_run:
        p.error("--kernel-time needs a GPU (the profiler's device events); not with --dry-run")
    return args


def cfg_str(c: NormConfig) -> str:
    return f"{c.block_m}x{c.block_n}{'+t' if getattr(c, 'tail', False) else ''}{'B' if c.blocked else ''}{'S' if c.split else ''} w{c.num_warps} p{c.programs_per_sm}" + (
        f" s{c.num_stages}" if hasattr(c, "num_stages") else "") + (" P" if getattr(c, "prefetch", False) else "") + (
        " R0" if not getattr(c, "row_phases", True) else "")


def _warps(tile: int, lo: int, hi: int, dry: bool) -> list:
    """num_warps in {1, 2, 4, 8, 16, 32} giving lo..hi elements per thread on a tile of ``tile``
    elements (dry runs: 4, whatever the tile). One or two warps keep a row's sums in warp shuffles
    (Triton spreads a 16-bit row over a warp per 256 columns, and a sum across warps goes through
    shared memory and barriers)."""
    if dry:
        return [4]
    return [w for w in (1, 2, 4, 8, 16, 32) if lo <= tile // (32 * w) <= hi]


def _stage1_pps(num_warps: int) -> int:
    """Programs per SM in stage 1: 2, or 16 warps' worth for 1- and 2-warp programs (at 2 they
    would leave the SM nearly idle and never reach stage 2's sweep)."""
    return 2 if num_warps >= 4 else 16 // num_warps


def split_candidates(n: int, dry: bool) -> list:
    """The split backward's configs (one program per SM, its only grid): slices of 4K-16K columns
    (the row over G = N / slice programs) at 8-64 elements per thread; dry runs: one slice of the
    whole row (G = 1, the interpreter's only case)."""
    if dry:
        return [NormConfig(1, triton.next_power_of_2(n), False, 4, 1, split=True)]
    return [NormConfig(1, sl, False, w, 1, split=True)
            for sl in (4096, 8192, 16384) if sl < n for w in _warps(sl, 8, 64, False)]


def tail_candidates(op: str, n: int, dry: bool) -> list:
    """The backward's tiles of a head of next_pow2(N) / 2 columns and a tail tile of the rest
    (``tail=True``, norms._tail_n) for N between the powers of two, as a register tile or the
    blocked path's one chunk: 1-4 rows at 4-32 values per thread (of the lanes that head and tail
    hold); none for a power of two or another op."""
    p2 = triton.next_power_of_2(n)
    if op != "bwd" or n == p2:
        return []
    head = p2 // 2
    lanes = head + triton.next_power_of_2(n - head)
    return [NormConfig(bm, head, blocked, w, _stage1_pps(w), tail=True)
            for blocked in (False, True) for bm in ((1, 2) if dry else (1, 2, 4)) if bm * lanes <= 32768
            for w in _warps(bm * lanes, 4, 32, dry)]


def candidates(op: str, n: int, dry: bool, kinds: str = "all") -> list:
    """Stage-1 configs (two programs per SM) of ``op`` at row width ``n``; the split backward's
    (:func:`split_candidates`) from 16K, and only those with ``kinds == "split"``; the head + tail
    tiles (:func:`tail_candidates`), and only those with ``kinds == "tail"``."""
    p2 = triton.next_power_of_2(n)
    split = split_candidates(n, dry) if op == "bwd" and n >= (256 if dry else 16384) else []
    tail = tail_candidates(op, n, dry)
    if kinds == "split":
        return split
    if kinds == "tail":
        return tail
    out = []
    if op == "fwd-fp8T" and not norms.BAND_ROWS:  # the tile's own transposed stores
        for bm in (16, 32, 64):
            for bn in (64, 128, 256):
                for w in (4, 8):
                    out.append(NormConfig(bm, min(bn, p2), n > min(bn, p2), w, 2))
    else:
        # fwd-fp8T by bands (norms.BAND_ROWS): the rowwise FP8 tiles, then each band transposed
        # values per thread of a tile: fwd-fp8 up to 64 since session 54 (NOTES Q67: RMSNorm 2K's
        # 2 x 2048 tile at 2 warps, 64 per thread, read 88 % of copy against the entry's 83)
        max_tile, (lo, hi) = {"fwd": (32768, (8, 64)), "fwd-res": (32768, (8, 64)),
                              "fwd-fp8": (32768, (4, 64)), "fwd-fp8T": (32768, (4, 32))}.get(op, (16384, (4, 32)))
        if p2 <= max_tile:
            for bm in (1, 2, 4, 8, 16):
                if bm * p2 <= max_tile and (op != "fwd-fp8T" or norms.BAND_ROWS % bm == 0):
                    tiles = [NormConfig(bm, p2, False, w, _stage1_pps(w)) for w in _warps(bm * p2, lo, hi, dry)]
                    out += tiles
                    if op in ("fwd", "fwd-fp8") and not dry:
                        # the same tiles with the next tile's x prefetched (NOTES P175: +9 to +10
                        # points at RMSNorm e4m3 16K and LayerNorm e4m3 2K over the entries)
                        out += [dataclasses.replace(c, prefetch=True) for c in tiles]
        chunks = (64, 128) if dry else (2048, 4096, 8192, 16384, 32768)
        # a width between the powers of two also gets the largest power of two that divides it
        # (5120: 1024, 18432: 2048), so that some blocked tile has no masked lanes (NOTES Q89)
        even = n & -n
        if not dry and even < p2 and even >= 1024:
            chunks = tuple(sorted({even, *chunks}))
        if n >= (256 if dry else 4096):
            for chunk in (c for c in chunks if c <= p2):
                # the backward's blocked tiles also with 4-8 rows: its dW/dB partials are read and
                # written per row tile and chunk, so more rows per tile amortise them
                for bm in ((1, 2, 4, 8) if op == "bwd" else (1, 2)):
                    out += [NormConfig(bm, chunk, True, w, _stage1_pps(w))
                            for w in _warps(bm * chunk, lo // 2, hi, dry)]
    out = list(dict.fromkeys(out))
    if dry:  # the interpreter is slow: one of each kind
        out = [c for c in out if not c.blocked][:1] + [c for c in out if c.blocked][:1]
    return out + tail[:1 if dry else None] + split


def heuristic(op: str, n: int, rms: bool, lean: bool = False) -> NormConfig:
    """The config the launcher takes for ``op`` at width ``n`` on a card of this class (``lean``:
    utils.lean_dram of the device; the lean card's own entries come first, as in the launcher)."""
    if op == "bwd":
        return nc.bwd_config(n, torch.bfloat16, rms)
    return nc.fwd_config(n, torch.bfloat16, op == "fwd-fp8T" and not norms.BAND_ROWS, fp8=op.startswith("fwd-fp8"), rms=rms,
                         residual=op == "fwd-res", lean=lean)


class Problem:
    """Inputs, outputs and fp32 references of one (op, M, N); ``run(cfg)`` launches one config."""

    def __init__(self, op: str, m: int, n: int, rms: bool, dev: torch.device) -> None:
        self.op, self.m, self.n, self.rms = op, m, n, rms
        inp = C.make_inputs("rmsnorm" if rms else "layernorm", "fwd+bwd", m, n, dev)
        self.x, self.w, self.b, self.dy = inp["x"], inp["w"], inp.get("b"), inp["dy"]
        # fwd-res: a bf16 residual; the norm's input is z = x + r rounded (residual_out)
        self.r = torch.randn_like(self.x) if op == "fwd-res" else None
        self.res_out = torch.empty_like(self.x) if op == "fwd-res" else None
        self.eps = C.RMS_EPS if rms else C.LN_EPS
        f32 = dict(dtype=torch.float32, device=dev)
        self.mu = None if rms else torch.empty(m, **f32)
        self.rsigma = torch.empty(m, **f32)
        self.y_ref = torch.empty(m, n, **f32)
        self._ref_fwd(self.y_ref)
        if op in ("fwd", "fwd-res"):
            self.out = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            self.nbytes = H.bytes_norm_fwd(m, n, bias=not rms, residual=2 if op == "fwd-res" else None)
        elif op in ("fwd-fp8", "fwd-fp8T"):
            self.scale = torch.full((1,), C.DELAYED_SCALE, **f32)
            self.amax = torch.zeros(1, **f32)
            self.scale_inv = torch.empty(1, **f32)
            self.q = torch.empty(m, n, dtype=FP8, device=dev)
            self.qt = torch.empty(n, m, dtype=FP8, device=dev) if op == "fwd-fp8T" else None
            self.nbytes = H.bytes_norm_fp8(m, n, bias=not rms, transposed=op == "fwd-fp8T")
        else:
            self.dx = torch.empty(m, n, dtype=torch.bfloat16, device=dev)
            self.dw = torch.empty(n, dtype=torch.bfloat16, device=dev)
            self.db = None if rms else torch.empty(n, dtype=torch.bfloat16, device=dev)
            self.dx_ref = torch.empty(m, n, **f32)
            self.dw_ref = torch.empty(n, **f32)
            self.db_ref = None if rms else torch.empty(n, **f32)
            reference.norm_bwd(self.dy, self.x, self.mu, self.rsigma, self.w, None, self.dx_ref, None,
                               self.dw_ref, self.db_ref, is_rms_norm=rms, zero_centered_gamma=False,
                               sm_margin=0)
            self.nbytes = H.bytes_norm_bwd(m, n, bias=not rms)

    def _ref_fwd(self, out: torch.Tensor) -> None:
        res_out = None if self.r is None else torch.empty_like(self.x)
        reference.norm_fwd(self.x, self.w, self.b, self.r, self.eps, out, res_out, self.mu, self.rsigma,
                           None, None, None, None, is_rms_norm=self.rms, zero_centered_gamma=False,
                           current_scaling=False, amax_epsilon=0.0, sm_margin=0)

    def run(self, cfg: NormConfig) -> None:
        kw = dict(is_rms_norm=self.rms, zero_centered_gamma=False, sm_margin=0, config=cfg)
        if self.op == "bwd":
            norms.launch_bwd(self.dy, self.x, self.mu, self.rsigma, self.w, None, self.dx, None, self.dw,
                             self.db, **kw)
            return
        fp8 = self.op.startswith("fwd-fp8")
        norms.launch_fwd(
            self.x, self.w, self.b, self.r, self.eps, self.q if fp8 else self.out, self.res_out, self.mu,
            self.rsigma,
            self.scale if fp8 else None, self.amax if fp8 else None, self.scale_inv if fp8 else None,
            self.qt if self.op == "fwd-fp8T" else None, current_scaling=False, amax_epsilon=0.0, **kw)

    def poison(self) -> None:
        if self.op in ("fwd", "fwd-res"):
            self.out.fill_(float("nan"))
            if self.res_out is not None:
                self.res_out.fill_(float("nan"))
        elif self.op == "bwd":
            for t in (self.dx, self.dw, self.db):
                if t is not None:
                    t.fill_(float("nan"))
        else:
            self.q.view(torch.uint8).fill_(0x7F)  # e4m3fn NaN
            if self.qt is not None:
                self.qt.view(torch.uint8).fill_(0x7F)

    def errors(self) -> dict:
        if self.op in ("fwd", "fwd-res"):
            return {"y": C._rel(self.out, self.y_ref)}
        if self.op == "bwd":
            errs = {"dx": C._rel(self.dx, self.dx_ref), "dw": C._rel(self.dw, self.dw_ref)}
            if self.db is not None:
                errs["db"] = C._rel(self.db, self.db_ref)
            return errs
        errs = {"q": C._rel(self.q.double() * self.scale_inv.double(), self.y_ref)}
        if self.qt is not None:
            errs["qt"] = 0.0 if torch.equal(self.qt.view(torch.uint8), self.q.t().view(torch.uint8)) else 1.0
        return errs


def try_config(prob: Problem, cfg: NormConfig, args, copy_gbps: float) -> dict:
    rec = {"config": asdict(cfg), "cfg": cfg_str(cfg)}
    try:
        prob.poison()
        prob.run(cfg)
        H.sync()
        errs = prob.errors()
        rec["err"] = {k: float(f"{v:.3g}") for k, v in errs.items()}
        if not all(v <= TOL[k] for k, v in errs.items()):
            rec["error"] = f"check failed {rec['err']}"
            return rec
        if args.kernel_time:
            from benchmarks.profile_kernels import device_us_per_call

            ms = device_us_per_call(lambda: prob.run(cfg)) * 1e-3
        else:
            ms = H.bench(lambda: prob.run(cfg), warmup_ms=args.warmup_ms, rep_ms=args.rep_ms)
        rec["us"] = round(ms * 1e3, 2)
        rec["gbps"] = round(H.gbps(prob.nbytes, ms), 1)
        rec["pct_copy"] = round(100 * rec["gbps"] / copy_gbps, 1)
    except Exception as e:
        rec["error"] = H.short_error(e)
    return rec


def tune_one(op: str, m: int, n: int, args, copy_gbps: float, t_start: float) -> dict:
    prob = Problem(op, m, n, args.norm == "rmsnorm", H.device())
    heur = heuristic(op, n, args.norm == "rmsnorm", lean_dram(H.device()))
    res = {"op": op, "M": m, "N": n, "heuristic": try_config(prob, heur, args, copy_gbps), "tried": []}
    tried = {heur: res["heuristic"]}
    skipped = 0

    def measure(configs) -> None:
        """Time each untried config, counting those the time budget leaves out."""
        nonlocal skipped
        for cfg in configs:
            if cfg in tried:
                continue
            if time.perf_counter() - t_start > args.max_seconds:
                skipped += 1
                continue
            tried[cfg] = try_config(prob, cfg, args, copy_gbps)

    def ranked():
        return sorted((c for c, r in tried.items() if "us" in r), key=lambda c: tried[c]["us"])

    # Stage 1: the candidate grid at two programs per SM.
    measure(candidates(op, n, args.dry_run, args.kinds))
    # Stage 2: programs per SM for the best three (not the split backward's: one per SM).
    pps_values = (1, 2) if args.dry_run else ((1, 2, 4) if op == "fwd-fp8T" and not norms.BAND_ROWS
                                              else (1, 2, 4, 8, 16, 32))
    measure([replace(base, programs_per_sm=pps)
             for base in [c for c in ranked() if not c.split][: 1 if args.dry_run else 3] for pps in pps_values])
    # Stage 3: pipelining depth of the best so far (a recompile each).
    good = ranked()
    if good and hasattr(good[0], "num_stages"):
        measure([replace(good[0], num_stages=st) for st in ((1, 2) if args.dry_run else (1, 2, 4))])
    res["tried"] = list(tried.values())
    res["skipped_for_time"] = skipped
    good = [r for r in tried.values() if "us" in r]
    res["best"] = min(good, key=lambda r: r["us"]) if good else None
    prob = None  # drop the inputs (the measure closure holds the same cell) before freeing
    H.free_memory()
    return res


def main(argv=None) -> int:
    args = parse_args(argv)
    if not args.dry_run and not H.on_gpu():
        print("no CUDA device: use --dry-run (Triton interpreter on CPU)", file=sys.stderr)
        return 2
    if args.dry_run:
        args.warmup_ms, args.rep_ms, args.max_seconds = 0.0, 0.0, float("inf")
    if args.dry_run and os.environ.get("TRITON_INTERPRET") != "1":
        print("--dry-run needs TRITON_INTERPRET=1 before triton is imported", file=sys.stderr)
        return 2
    if args.band_rows is not None:
        norms.BAND_ROWS = args.band_rows
    t_start = time.perf_counter()
    ops = [o for o in args.ops.split(",") if o]
    if args.n:
        ns = [int(v) for v in args.n.split(",")]
    else:
        ns = [256, 1024] if args.dry_run else list(H.SWEEP_N)
    elements = 4 * 1024 if args.dry_run else H.LARGE_ELEMENTS
    meta = H.environment()
    meta["args"] = vars(args)
    meta["copy"] = H.copy_bandwidth(1 << 20 if args.dry_run else None)
    copy_gbps = meta["copy"]["gbps"]
    print(f"{meta['device']}: copy {copy_gbps:.0f} GB/s; norm {args.norm}, ops {ops}, N {ns}", flush=True)
    results = []
    for n in ns:
        m, _ = H.large_shape(n, elements)
        for op in ops:
            r = tune_one(op, m, n, args, copy_gbps, t_start)
            results.append(r)
            b, h = r["best"], r["heuristic"]
            print(f"[{time.perf_counter() - t_start:6.1f}s] {op:8s} N={H.fmt_n(n):>4s} "
                  f"tried {len(r['tried'])}"
                  f" best {b['cfg'] + ' ' + str(b['pct_copy']) + '%' if b else 'none'}"
                  f" | heuristic {h.get('pct_copy', h.get('error', ''))}", flush=True)
            if args.out:
                H.write_json(args.out, {"meta": meta, "results": results})
    meta["total_seconds"] = round(time.perf_counter() - t_start, 1)
    if args.out:
        H.write_json(args.out, {"meta": meta, "results": results})
    errors = {}
    for r in results:
        for t in r["tried"]:
            if "error" in t:
                errors.setdefault(t["error"][:100], []).append(f"{r['op']}@{H.fmt_n(r['N'])} {t['cfg']}")
    if errors:
        print("\nfailed candidates (error [count, first]):")
        for e, where in list(errors.items())[:10]:
            print(f"  {e} [{len(where)}, {where[0]}]")
    table = []
    for r in results:
        b, h = r["best"], r["heuristic"]
        hp = h.get("pct_copy")
        table.append([r["op"], H.fmt_n(r["N"]), b["cfg"] if b else "-", b["pct_copy"] if b else "-",
                      h["cfg"], hp if hp is not None else "err",
                      f"{h['us'] / b['us']:.2f}x" if b and "us" in h else "-",
                      len(r["tried"]), r["skipped_for_time"] or ""])
    print(f"\n{meta['device']} | torch {meta['torch']} | triton {meta['triton']} | {args.norm} bf16 | "
          f"copy {copy_gbps:.0f} GB/s; % = of copy bandwidth")
    print("cfg = block_m x block_n (B: blocked) w: warps p: programs per SM s: stages; "
          "gain = heuristic time / best time")
    print(tabulate(table, headers=["op", "N", "best", "%", "heuristic", "%", "gain", "tried", "skipped"],
                   tablefmt="plain"))
    print(f"total {meta['total_seconds']}s" + (f"; JSON: {args.out}" if args.out else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
