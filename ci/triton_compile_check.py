"""Compile every Triton kernel variant engine launches for sm_90, on a machine without a GPU.

The L0 suite runs the Triton kernels in the interpreter, which executes their Python and never
compiles them: an error of Triton's front end or of its backends (an unsupported construct, a
constexpr Triton does not wrap, a type mismatch) shows up only on a GPU. This script drives
engine's real Triton launch paths (``engine.triton_kernels``: norm forward and backward in every
mode, cast_transpose, fp8_transpose) with CPU tensors, records what each launch would have been
(kernel, argument types, constexpr values, num_warps, num_stages) instead of launching, and
compiles each distinct variant with ``triton.compile`` for an sm_90 target, through PTX to a cubin
(triton's bundled ptxas). It must run with TRITON_INTERPRET unset, so that the kernels are
JIT functions.

    python ci/triton_compile_check.py            # all variants; exit 1 if any fails to compile
    python ci/triton_compile_check.py --list     # the variants, without compiling

Each variant's PTX is also checked for atomics with acquire / release semantics
(:func:`ptx_problems`): ``tl.atomic_*``'s default ``sem="acq_rel"`` compiles to ``MEMBAR.ALL.GPU``
(every store of the program drained) and ``CCTL.IVALL`` (L1 invalidated) around the atomic, once
per program, where engine's amax atomics need none (NOTES P174).

It checks the triton version it runs under (CI: the newest from the package index); the GPU
machine's version is checked by L1, which compiles and runs the same launches.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import torch  # noqa: E402
import triton  # noqa: E402

from engine.triton_kernels import launch as launch_mod  # noqa: E402

_TORCH_TO_TRITON = {
    torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16",
    torch.float8_e4m3fn: "fp8e4nv", torch.float8_e5m2: "fp8e5", torch.uint8: "u8", torch.int8: "i8",
    torch.int64: "i64",
}


def _arg_spec(param, a) -> tuple:
    """(type, attribute) of one runtime argument as Triton's launcher specialises it: the type
    string, ``"D"`` where a pointer is 16-byte aligned or an int divisible by 16 (``tt.divisibility``
    16: vector loads and stores), ``("constexpr", 1)`` for an int equal to 1. Without the
    attributes the compiled kernel is not the one the GPU runs (scalar 2-byte loads where the GPU
    gets 16-byte vectors). Triton's own function, honouring ``do_not_specialize``."""
    from triton._C.libtriton import native_specialize_impl
    from triton.backends.compiler import BaseBackend

    if type(a) is bool or not (type(a) in (int, float) or isinstance(a, torch.Tensor)):
        raise TypeError(f"unsupported launch argument {type(a).__name__}")
    if isinstance(a, torch.Tensor) and a.dtype not in _TORCH_TO_TRITON:
        raise TypeError(f"unsupported tensor dtype {a.dtype}")
    ty, attr = native_specialize_impl(BaseBackend, a, False, not param.do_not_specialize,
                                      not param.do_not_specialize_on_alignment)
    return ty, attr


class Recorder:
    """Stands in for Launcher.launch (every launch goes through it): records each launch's compile
    key instead of launching."""

    def __init__(self):
        self.variants = {}

    def __call__(self, launcher, grid, tensors, scalars, num_warps, num_stages, constexprs):
        if not all(isinstance(a, torch.Tensor) for a in tensors) or any(
                isinstance(a, torch.Tensor) for a in scalars):
            raise TypeError(f"{launcher.kernel.fn.__name__}: tensors and scalars mixed up")
        args = tuple(tensors) + tuple(scalars)
        fn = launcher.kernel
        names = [p.name for p in fn.params]
        n_rt = len(names) - len(launcher._constexpr_names)
        rt_params = [p for p in fn.params if not p.is_constexpr]
        if len(args) != n_rt:
            raise TypeError(f"{fn.fn.__name__}: {len(args)} runtime arguments, {n_rt} wanted")
        sig = tuple(_arg_spec(p, a) for p, a in zip(rt_params, args))
        if len(constexprs) != len(launcher._constexpr_names):
            raise TypeError(f"{fn.fn.__name__}: {len(constexprs)} constexprs, {launcher._constexpr_names} wanted")
        const = tuple(zip(launcher._constexpr_names, constexprs))
        key = (fn.fn.__name__, sig, const, num_warps, num_stages)
        self.variants.setdefault(key, fn)


def drive(rec: Recorder) -> None:
    """Run engine's Triton launch paths over the dtypes, modes and row widths they dispatch on.
    The tensors are CPU tensors; the device-dependent constexprs (the partial-sum reduction's
    column block, the split backward's programs per row) are pinned to their GPU values."""
    from engine.triton_kernels import norms, norms_common, transpose, utils

    # the reduction's tile for 132 SMs (its partials here have few rows; the GPU's sets below)
    norms_common._reduce_tile = lambda part: norms_common.reduce_tile(*part.shape, 132)
    norms.split_groups_run = lambda device: True  # the split backward's GPU variants (G > 1)
    utils.INTERPRETER_SM_COUNT = 132  # an H100 / H200's SMs: G up to 132 (no compile key holds a grid)

    f32, bf16, f16 = torch.float32, torch.bfloat16, torch.float16
    e4m3, e5m2 = torch.float8_e4m3fn, torch.float8_e5m2

    def t(shape, dtype):
        return torch.empty(shape, dtype=dtype)

    m = 3
    # 18432 and 40960: rows between the powers of two, whose blocked chunks FWD_CHUNK_FILL halves;
    # 5120 and 12288: the backward's head + tail tiles (BWD_TAIL) of both heads
    widths = [760, 1024, 2048, 4096, 5120, 8192, 12288, 16384, 18432, 32768, 40960, 65536, 131072]
    # each card class's launch defaults (utils.DRAM_CLASS: 2 wide, the H200's; 1 lean, the H100's;
    # NOTES P109 / P110), the plans emptied between them (their keys hold no class)
    for dram_class in (2, 1):
        utils.DRAM_CLASS = dram_class
        norms.FWD_PLANS.clear()
        for n in widths:
            for rms in (True, False):
                for x_dt, out_dt, w_dt, res_dt in ((bf16, bf16, bf16, None), (f16, f16, f32, None),
                                                   (f32, f32, f32, None), (bf16, bf16, bf16, bf16),
                                                   (bf16, f32, bf16, f32), (bf16, e4m3, bf16, None),
                                                   (bf16, e5m2, bf16, bf16)):
                    fp8 = out_dt in (e4m3, e5m2)
                    for current in ((False, True) if fp8 else (False,)):
                        for trans in ((False, True) if fp8 and n <= 8192 else (False,)):
                            x, w = t((m, n), x_dt), t((n,), w_dt)
                            b = None if rms else t((n,), w_dt)
                            res = t((m, n), res_dt) if res_dt is not None else None
                            res_out = t((m, n), res_dt) if res is not None else None
                            norms.norm_fwd(
                                x, w, b, res, 1e-5, t((m, n), out_dt), res_out,
                                None if rms else t((m,), f32), t((m,), f32),
                                t((1,), f32) if fp8 else None, t((1,), f32) if fp8 else None,
                                t((1,), f32) if fp8 else None, t((n, m), out_dt) if trans else None,
                                is_rms_norm=rms, zero_centered_gamma=not rms, current_scaling=current,
                                amax_epsilon=0.0, sm_margin=0)
                    if fp8:
                        continue
                    dres = t((m, n), res_dt) if res_dt is not None else None
                    norms.norm_bwd(
                        t((m, n), out_dt), t((m, n), x_dt), None if rms else t((m,), f32), t((m,), f32),
                        t((n,), w_dt), dres, t((m, n), x_dt),
                        t((m, n), res_dt) if res_dt not in (None, x_dt) else None,
                        t((n,), w_dt), None if rms else t((n,), w_dt),
                        is_rms_norm=rms, zero_centered_gamma=rms, sm_margin=0)
    utils.DRAM_CLASS = 0
    for n in (17, 1024, 4096, 131072):
        for x_dt in (bf16, f16, f32):
            for out_dt in (e4m3, e5m2):
                for current in (False, True):
                    for with_t in (False, True):
                        transpose.cast_transpose(
                            t((m, n), x_dt), t((1,), f32), t((1,), f32), t((1,), f32),
                            t((m, n), out_dt), t((n, m), out_dt) if with_t else None,
                            current_scaling=current, amax_epsilon=0.0)
        for order in (1, 2):  # the tile orders (NOTES P114)
            transpose.FP8_TRANSPOSE_ORDER = order
            transpose.fp8_transpose(t((m, n), e4m3), t((n, m), e4m3))
        transpose.FP8_TRANSPOSE_ORDER = 0
    # the partial-sum reduction's tiles (REDUCE_SPREAD's default rule, NOTES P170) at the
    # backward's partial rows on 132 SMs (1-4 programs per SM, or the split backward's row
    # groups), both set counts, every width
    for n in widths:
        for k in (1, 2):
            for p in (8, 16, 33, 66, 132, 264, 528):
                norms_common.reduce_partials(t((k, p, n), f32), t((n,), bf16),
                                             t((n,), bf16) if k == 2 else None)
    for mn in (18, 20, 24, 32):  # copies of rows of M % 16 = 2, 4, 8, 0 bytes (T_ALIGN; NOTES P134)
        transpose.cast_transpose(t((mn, 4096), bf16), t((1,), f32), t((1,), f32), t((1,), f32),
                                 t((mn, 4096), e4m3), t((4096, mn), e4m3), current_scaling=False,
                                 amax_epsilon=0.0)
        for order in (1, 2):
            transpose.FP8_TRANSPOSE_ORDER = order
            transpose.fp8_transpose(t((mn, 4096), e4m3), t((4096, mn), e4m3))
        transpose.FP8_TRANSPOSE_ORDER = 0


def compile_variant(key, fn, target):
    from triton.compiler import ASTSource

    name, sig, const, num_warps, num_stages = key
    params = fn.params
    signature, constexprs = {}, {}
    attrs = {}
    rt = iter(sig)
    const_d = dict(const)
    backend = triton.compiler.make_backend(target)
    for i, p in enumerate(params):
        if p.is_constexpr:
            signature[p.name] = "constexpr"
            constexprs[(i,)] = const_d[p.name]
            continue
        ty, attr = next(rt)
        signature[p.name] = ty
        if ty == "constexpr":  # an int equal to 1
            constexprs[(i,)] = attr
        elif isinstance(attr, str):
            attrs[(i,)] = backend.parse_attr(attr)
    src = ASTSource(fn, signature, constexprs, attrs)
    options = {"num_warps": num_warps, "num_stages": num_stages, **launch_mod.COMPILE_OPTIONS}
    return triton.compile(src, target=target, options=options)


#: gpu-scope atomics that order memory (NOTES P174): the amax max-updates are read only after the
#: kernel, so they are relaxed (``utils._atomic_amax``); an ordering atomic costs each program a
#: MEMBAR.ALL.GPU, an L1 invalidation and a barrier on its return.
_ORDERING_ATOMIC = re.compile(r"\b(atom|red)\.global\.(gpu\.)?(acq_rel|acquire|release)\b")


def ptx_problems(ptx: str) -> list:
    """What is wrong with a variant's PTX: each atomic with acquire / release semantics."""
    return [f"ordering atomic: {line.strip()}" for line in ptx.splitlines() if _ORDERING_ATOMIC.search(line)]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--list", action="store_true", help="list the variants, do not compile")
    ap.add_argument("--arch", type=int, default=90,
                    help="compute capability to compile for (default 90)")
    args = ap.parse_args(argv)
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        sys.exit("triton_compile_check: unset TRITON_INTERPRET (the kernels must be JIT functions)")

    rec = Recorder()
    orig = launch_mod.Launcher.launch
    launch_mod.Launcher.launch = lambda self, grid, t, s, nw, ns, c: rec(self, grid, t, s, nw, ns, c)
    try:
        drive(rec)
    finally:
        launch_mod.Launcher.launch = orig
    print(f"triton {triton.__version__}: {len(rec.variants)} kernel variants")
    if args.list:
        for key in sorted(rec.variants, key=str):
            print(" ", key[0], key[3], key[4], dict(key[2]))
        return 0
    from triton.backends.compiler import GPUTarget

    target = GPUTarget("cuda", args.arch, 32)
    failed = 0
    t0 = time.time()
    for key, fn in sorted(rec.variants.items(), key=lambda kv: str(kv[0])):
        try:
            problems = ptx_problems(compile_variant(key, fn, target).asm["ptx"])
            if problems:
                raise RuntimeError("\n".join(problems[:3]))
        except Exception as e:  # noqa: BLE001 - report every failing variant, then fail
            failed += 1
            msg = str(e).strip().splitlines()
            print(f"FAILED {key[0]} warps={key[3]} stages={key[4]} {dict(key[2])}\n  "
                  + "\n  ".join(msg[-6:]))
    print(f"compiled {len(rec.variants) - failed}/{len(rec.variants)} for sm_{args.arch} "
          f"in {time.time() - t0:.0f} s")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
