"""A lower-overhead launch path for engine's Triton kernels.

``kernel[grid](*args, **kwargs)`` (``JITFunction.run``) binds the arguments, builds Triton's
specialization key and the cache key, and checks the globals the kernel used, on every call:
26-41 µs per launch on the H200 machines' hosts, against 7-11 µs for the compiled kernel's own
launcher (``ci/launch_overhead.py``, ``benchmarks/results/h200_launch_overhead.log``: this path
takes 25 µs where kernel[grid] took 41). Norm calls are small and frequent, so :class:`Launcher`
keeps its own cache of compiled kernels, keyed by what Triton specialises on (or finer), and calls
the compiled launcher directly:

* every argument as Triton specialises it, or finer (:func:`args_key`): a tensor by dtype and
  16-byte alignment of its data pointer; an int by ``== 1``, divisibility by 16 and 32/64-bit
  range; floats are not specialised;
* the constexpr values, ``num_warps`` and ``num_stages``;
* the current CUDA device.

A miss goes through ``kernel[grid]`` (which compiles or finds the kernel, launches it, and returns
it) and caches the result. Under ``TRITON_INTERPRET=1`` (the kernel is then the interpreter's
function), whenever a Triton launch hook is set (profilers such as proton), and with
``FORCE_JIT``, every call takes ``kernel[grid]`` itself. tests/test_launch.py checks
the key against Triton's own specialisation.
"""

from __future__ import annotations

import inspect
from typing import Dict, Sequence

import triton
import triton.language as tl

try:  # triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton has no hooks in this place
    _knobs = None

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

#: True: every launch takes ``kernel[grid]`` (for A/B measurements, e.g. benchmarks/profile_kernels.py).
FORCE_JIT = False


def _hook_set(hook) -> bool:
    """A launch hook is set: a callable, or a non-empty HookChain (triton 3.6+ keeps an empty chain)."""
    if hook is None:
        return False
    calls = getattr(hook, "calls", None)
    return not isinstance(calls, list) or len(calls) > 0


def _hooks_set() -> bool:
    if _knobs is None:
        return False
    rt = _knobs.runtime
    return _hook_set(rt.launch_enter_hook) or _hook_set(rt.launch_exit_hook)


def args_key(args: Sequence) -> tuple:
    """What Triton's specialisation distinguishes about each runtime argument, or finer.

    Tensors: (dtype, data pointer 16-byte aligned). Ints: (== 1, divisible by 16, fits in int32),
    also for parameters in ``do_not_specialize`` (Triton only looks at the range there; a finer key
    adds cache entries that point at the same compiled kernel, never a wrong one). Floats: None.
    One list comprehension: a function call per argument costs more than the rest of a launch.
    """
    return tuple([(a == 1, not a & 15, _I32_MIN <= a <= _I32_MAX) if type(a) is int
                  else None if type(a) is float else (a.dtype, not a.data_ptr() & 15) for a in args])


def arg_key(a):
    """:func:`args_key` of one argument; raises TypeError for a type the fast path does not take."""
    if type(a) not in (int, float) and not hasattr(a, "data_ptr"):
        raise TypeError(f"Launcher: unsupported argument type {type(a).__name__}")
    return args_key((a,))[0]


class Launcher:
    """Launch one ``@triton.jit`` kernel through a cache of compiled kernels (see the module).

    The kernel's constexpr parameters must come last in its signature (engine's kernels do), so
    that ``args`` (the runtime arguments, in order) followed by the constexpr values (in signature
    order) is the full argument list the compiled launcher takes.
    """

    def __init__(self, kernel):
        self.kernel = kernel
        params = getattr(kernel, "params", None)
        if params is not None:  # JITFunction
            names = [p.name for p in params]
            constexpr = [p.is_constexpr for p in params]
        else:  # the interpreter's InterpretedFunction: no specialisation, always the slow path
            sig = inspect.signature(kernel.fn).parameters.values()
            names = [p.name for p in sig]
            constexpr = [p.annotation is tl.constexpr or "constexpr" in str(p.annotation) for p in sig]
        n_rt = constexpr.count(False)
        if any(constexpr[:n_rt]):
            raise ValueError(f"{kernel.fn.__name__}: constexpr parameters must come last")
        self._constexpr_names = tuple(names[n_rt:])
        self._interpreted = params is None
        self._cache: Dict[tuple, object] = {}
        self._driver = None

    def __call__(self, grid, args: Sequence, num_warps: int, num_stages: int, **constexprs):
        """Launch on ``grid`` programs (an int, or a tuple ``(x, y)`` for a 2-D grid): ``args`` are
        the runtime arguments in signature order; every constexpr parameter is given by name."""
        if len(constexprs) != len(self._constexpr_names):
            raise TypeError(f"{self.kernel.fn.__name__}: constexprs {sorted(constexprs)} given, "
                            f"{list(self._constexpr_names)} wanted")
        constexprs = tuple(map(constexprs.__getitem__, self._constexpr_names))
        if FORCE_JIT or self._interpreted or _hooks_set():
            self._slow(grid, args, constexprs, num_warps, num_stages)
            return
        drv = self._driver
        if drv is None:
            drv = self._driver = triton.runtime.driver.active
        device = drv.get_current_device()
        key = (device, constexprs, num_warps, num_stages, args_key(args))
        k = self._cache.get(key)
        if k is None:
            self._cache[key] = self._slow(grid, args, constexprs, num_warps, num_stages)
            return
        gx, gy = (grid, 1) if type(grid) is int else grid
        k.run(gx, gy, 1, drv.get_current_stream(device), k.function, k.packed_metadata, None, None, None,
              *args, *constexprs)

    def _slow(self, grid, args, constexprs, num_warps, num_stages):
        kw = dict(zip(self._constexpr_names, constexprs))
        grid = (grid,) if type(grid) is int else tuple(grid)
        return self.kernel[grid](*args, **kw, num_warps=num_warps, num_stages=num_stages)
