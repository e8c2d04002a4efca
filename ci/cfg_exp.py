"""Kernel time of explicit Triton launch configs of one op beside the launcher's own (NOTES Q67).

benchmarks/tune.py screens a fixed candidate grid by timed runs; this measures chosen configs the
way benchmarks/profile_kernels.py measures the table (the summed device time of one call's
kernels, the median of 15 calls, M * N = 64M, bf16 in), each checked against the fp32 reference
(tune.py's Problem and tolerances) and, for FP8 outputs, byte for byte against the launcher's
config (the fraction that differ: other tiles sum a row in another order), and the amax of each
against the reference's. Rounds alternate the configs; a config string is tune.py's
(``1x16384B w8 p32 s3``: rows per tile x columns, B = blocked, warps, programs per SM, stages;
a trailing `` P``: the register forward's prefetch of the next tile, NormConfig.prefetch, NOTES P175).

    python3 ci/cfg_exp.py --op fwd-fp8 --norm rmsnorm --n 16384 --rounds 2 \\
        --configs "1x16384B w8 p32 s3" "1x16384B w16 p8 s3"     # on the GPU machine

Each config's compiled kernel is printed with its registers, spilled bytes and resident programs
per SM. ``--maxnreg N`` (diagnostic, NOTES Q69) compiles every kernel of the run, the launcher's
config included, with at most N registers per thread (triton's ``maxnreg``): a register-bound
config then fits more programs per SM, at the cost of any spills it prints.

``--amax-slots`` (diagnostic, NOTES Q68): the FP8 forward's per-program amax atomics spread over
64 addresses instead of one, to measure what many programs ending on one address cost.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402
from benchmarks.tune import TOL, Problem, cfg_str, heuristic  # noqa: E402
from engine.triton_kernels import launch as launch_mod  # noqa: E402
from engine.triton_kernels.norms_common import NormConfig  # noqa: E402
from engine.triton_kernels.utils import lean_dram  # noqa: E402

_CFG = re.compile(r"^(\d+)x(\d+)(\+t)?(B?) w(\d+) p(\d+) s(\d+)( P)?( R0)?$")
#: --amax-slots: the slots the forward's per-program amax atomics spread over (NOTES Q68).
AMAX_SLOTS = tl.constexpr(64)


@triton.jit
def _atomic_amax_slots(AMAX, amax):
    """utils._atomic_amax into slot program_id % AMAX_SLOTS of a buffer of AMAX_SLOTS floats (the
    same int32-bits max), so that no more than 1 / AMAX_SLOTS of the programs meet on one address."""
    bits = amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.atomic_max(AMAX.to(tl.pointer_type(tl.int32)) + tl.program_id(0) % AMAX_SLOTS, bits, sem="relaxed")


def spread_amax() -> None:
    """Diagnostic, before any norm kernel compiles in this process: the Triton forward's amax
    atomics go to AMAX_SLOTS addresses (_atomic_amax_slots) instead of one, the amax being their
    max afterwards. Not the launcher's code: it measures what the one address costs when many
    programs end on it (Q67: FP8 configs lose 3.6-5.5 ns per added program)."""
    from engine.triton_kernels import norms

    norms._atomic_amax = _atomic_amax_slots


def compiled_since(before: dict) -> list:
    """The kernels the norm launchers compiled since ``before`` (:func:`launcher_caches`)."""
    now = launcher_caches()
    return [k for key, k in now.items() if key not in before]


def launcher_caches() -> dict:
    """Every compiled kernel held by the norm launchers, by (launcher, cache key)."""
    from engine.triton_kernels import norms

    return {(name, key): k for name in ("_FWD", "_FWD_T", "_BWD", "_BWD_SPLIT")
            for key, k in getattr(norms, name)._cache.items()}


def resources(kernel) -> str:
    """Registers per thread, spilled bytes and resident programs per SM of a compiled kernel."""
    kernel._init_handles()
    return (f"{kernel.n_regs} regs, {kernel.n_spills} B spilled, "
            f"{launch_mod.resident_programs(kernel)} per SM")


def parse_cfg(text: str) -> NormConfig:
    """A NormConfig from tune.py's string form; ValueError for anything else."""
    m = _CFG.match(text.strip())
    if not m:
        raise ValueError(f"config {text!r}: want e.g. '1x16384B w8 p32 s3'")
    bm, bn, tail, blocked, w, p, s, pre, r0 = m.groups()
    return NormConfig(int(bm), int(bn), blocked == "B", int(w), int(p), int(s), prefetch=pre is not None,
                      tail=tail is not None, row_phases=r0 is None)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--op", required=True, choices=("fwd", "fwd-res", "fwd-fp8", "bwd"))
    ap.add_argument("--norm", choices=("rmsnorm", "layernorm"), default="rmsnorm")
    ap.add_argument("--n", type=int, required=True)
    ap.add_argument("--configs", nargs="+", required=True, help="tune.py config strings")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the whole list")
    ap.add_argument("--amax-slots", action="store_true",
                    help=f"diagnostic (fwd-fp8): the programs' amax atomics over {AMAX_SLOTS.value} "
                         "addresses, not one (spread_amax; the amax checked as their max)")
    ap.add_argument("--maxnreg", type=int, default=0,
                    help="diagnostic: compile every kernel of the run with at most this many "
                         "registers per thread (triton's maxnreg; 0: triton's choice)")
    args = ap.parse_args(argv)
    if args.amax_slots and args.op != "fwd-fp8":
        ap.error("--amax-slots is for --op fwd-fp8")
    configs = [parse_cfg(c) for c in args.configs]  # bad strings fail before any GPU work
    if any(c.prefetch for c in configs) and args.op not in ("fwd", "fwd-fp8"):
        ap.error("' P' (the prefetch) is for --op fwd / fwd-fp8")
    if not H.on_gpu():
        print("cfg_exp: needs a GPU (kernel time)")
        return 2
    dev = H.device()
    rms = args.norm == "rmsnorm"
    copy = H.copy_bandwidth()["gbps"]
    prob = Problem(args.op, (1 << 26) // args.n, args.n, rms, dev)
    if args.maxnreg:
        launch_mod.COMPILE_OPTIONS["maxnreg"] = args.maxnreg  # before anything compiles
    if args.amax_slots:
        spread_amax()
        prob.amax = torch.zeros(AMAX_SLOTS.value, dtype=torch.float32, device=dev)
    amax_ref = prob.y_ref.abs().max().item()
    heur = heuristic(args.op, args.n, rms, lean_dram(dev))
    order = [heur] + [c for c in dict.fromkeys(configs) if c != heur]
    print(f"{args.norm} {args.op} N={args.n} M={prob.m}: copy {copy:.0f} GB/s; launcher's {cfg_str(heur)}"
          + (f"; maxnreg {args.maxnreg}" if args.maxnreg else ""))
    ref_bytes = None
    ok = {}
    for cfg in order:  # correctness first: the reference, and the launcher's bytes for FP8
        prob.poison()
        if args.op == "fwd-fp8":
            prob.amax.zero_()  # each config's own amax (delayed scaling max-updates it)
        before = launcher_caches()
        try:
            prob.run(cfg)
            H.sync()
        except Exception as e:  # a config Triton cannot build (registers, shared memory)
            print(f"  {cfg_str(cfg):24s} failed: {H.short_error(e)}")
            continue
        errs = prob.errors()
        if args.op == "fwd-fp8":
            errs["amax"] = abs(prob.amax.max().item() - amax_ref) / amax_ref
        good = all(v <= TOL.get(k, 1e-5) for k, v in errs.items())
        differ = ""
        if args.op == "fwd-fp8":  # another tile sums a row in another order: rsigma's last bit
            got = prob.q.view(torch.uint8).clone()
            if ref_bytes is None:
                ref_bytes = got
            differ = f", bytes unlike the launcher's: {(got != ref_bytes).float().mean().item():.2e}"
        ok[cfg] = good
        res = "; ".join(resources(k) for k in compiled_since(before)) or "a kernel compiled before"
        print(f"  {cfg_str(cfg):24s} {'ok' if good else 'WRONG'}: {errs}{differ} [{res}]")
    for r in range(args.rounds):
        for cfg in (c for c in order if ok.get(c)):
            us = device_us_per_call(lambda: prob.run(cfg))
            pct = 100 * H.gbps(prob.nbytes, us * 1e-3) / copy
            tag = "launcher" if cfg == heur else ""
            print(f"  round {r + 1} {cfg_str(cfg):24s} {us:8.1f} us = {pct:5.1f} % {tag}")
    return 0 if all(ok.get(c, False) for c in order) else 1


if __name__ == "__main__":
    sys.exit(main())
