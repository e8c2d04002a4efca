"""Write the Triton code torch.compile generates for a benchmark peer, and its kernels' launch configs.

The ``compile`` peer of benchmarks/cases.py beats engine's kernels in some rows (e.g. RMSNorm fwd at
32K); this shows what Inductor chose there (persistent or looped reduction, block sizes, warps,
grid) so that a config can be compared, not guessed. GPU only (Inductor emits C++ for CPU tensors).

    python ci/inductor_code.py --out DIR rmsnorm:fwd:32768 layernorm:fwd:8192

For each case: ``DIR/inductor_<norm>_<mode>_<N>.py`` (the generated module) and one summary line
per Triton kernel on stdout (its name, the reduction hint, num_warps, the block sizes of its launch).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
from torch._inductor.utils import run_and_get_code  # noqa: E402

from benchmarks import cases as C  # noqa: E402
from benchmarks import harness as H  # noqa: E402


def summarize(code: str) -> list:
    """One line per ``@triton.jit`` kernel of a generated module: name, heuristics decorator
    (persistent / looped reduction, num_warps) and the block constants."""
    out = []
    for m in re.finditer(r"@triton_heuristics\.(\w+)\((.*?)\)\n@triton\.jit\ndef (\w+)\((.*?)\):",
                         code, re.S):
        kind, deco, name, sig = m.groups()
        warps = re.findall(r"num_warps['\"]?\s*[:=]\s*(\d+)", deco)
        hint = re.findall(r"reduction_hint=ReductionHint\.(\w+)", deco)
        out.append(f"{name}: {kind} hint={hint[0] if hint else '-'} "
                   f"warps={','.join(warps) or '(autotuned)'} signature=({sig.strip()})")
    for m in re.finditer(r"(\w+)\.run\((.*?)\)", code):
        out.append(f"  launch {m.group(1)}({m.group(2)[-120:]})")
    return out


def chosen_configs(seen: set) -> list:
    """The config each Inductor kernel loaded since the last call runs with (after its runtime
    autotuning): the ``launchers`` of the CachingAutotuner objects in the modules of Inductor's
    code cache that are not in ``seen`` (which this adds them to)."""
    from torch._inductor.codecache import PyCodeCache

    mods = getattr(PyCodeCache, "modules", None) or list(getattr(PyCodeCache, "cache", {}).values())
    out = []
    for mod in mods:
        if id(mod) in seen:
            continue
        seen.add(id(mod))
        for name, obj in vars(mod).items():
            for ln in getattr(obj, "launchers", None) or []:
                cfg = getattr(ln, "config", None)
                out.append(f"chosen {name}: {cfg}")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", nargs="+", help="norm:mode:N, e.g. rmsnorm:fwd:32768")
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("inductor_code: needs a GPU")
        return 0
    args.out.mkdir(parents=True, exist_ok=True)
    seen: set = set()
    for case in args.cases:
        norm, mode, n = case.split(":")
        m, n = H.large_shape(int(n))
        inp = C.make_inputs(norm, mode, m, n, H.device())
        fn = C.compiled_fn(norm, mode)
        args_ = [inp["x"], inp["w"], inp.get("b")] + [inp[k] for k in ("r", "scale", "amax") if k in inp]
        _, codes = run_and_get_code(fn, *args_)
        path = args.out / f"inductor_{norm}_{mode.replace('+', '_')}_{n}.py"
        path.write_text("\n\n# ======== next module ========\n\n".join(codes))
        print(f"== {norm} {mode} {m}x{n}: {path.name}")
        for code in codes:
            for line in summarize(code):
                print("  " + line)
        for line in chosen_configs(seen):
            print("  " + line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
