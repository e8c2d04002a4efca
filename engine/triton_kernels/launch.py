"""A lower-overhead launch path for engine's Triton kernels.

``kernel[grid](*args, **kwargs)`` (``JITFunction.run``) binds the arguments, builds Triton's
specialization key and the cache key, and checks the globals the kernel used, on every call:
26-41 µs per launch on the H200 machines' hosts, against 6-11 µs for the compiled kernel's own
launcher (``ci/launch_overhead.py``: ``benchmarks/results/h200_launch_overhead.log``, this path
25 µs where kernel[grid] took 41; ``h200_launch_overhead_s12.log``, with the int pointers below,
17 µs where kernel[grid] took 27 and the compiled launcher 7.6 with tensors, 5.8 with int
pointers). Norm calls are small and frequent, so :class:`Launcher`
keeps its own cache of compiled kernels, keyed by what Triton specialises on (or finer), and calls
the compiled launcher directly:

* every argument as Triton specialises it, or finer: a tensor by dtype and 16-byte alignment of
  its data pointer (:func:`tensors_key`); an int by ``== 1``, divisibility by 16 and 32/64-bit
  range; floats are not specialised (:func:`scalars_key`). The caller passes the tensors and the
  scalars apart (engine's kernels take their tensors first), so that the key is one ``map`` over
  the tensors in C, one OR of the pointers for their alignment and one pass over the few
  scalars: 2.7 µs where one pass per argument over all of them took 4.8 (21 arguments, CPU of
  the development machine);
* the constexpr values, ``num_warps`` and ``num_stages``;
* the current CUDA device.

A memo in front of that cache keys the same kernels by the scalars' values instead of their
specialisation (a tuple hashed in C, where ``scalars_key`` took 0.9 µs per launch), for the calls a
process repeats; tests/test_launch.py checks that a hit runs the kernel of the scalars'
specialisation.

Tensors go to the compiled launcher as their data pointers (ints): for a
tensor Triton's C launcher calls ``data_ptr()`` and ``cuPointerGetAttribute`` per argument, a
check that a pointer is a device pointer which engine's ops make before any launch (every tensor
of a call is on x's CUDA device: ``engine._norm_ops.check_norm_inputs`` and the FP8 entry points).

A miss goes through ``kernel[grid]`` (which compiles or finds the kernel, launches it, and returns
it) and caches the result. Under ``TRITON_INTERPRET=1`` (the kernel is then the interpreter's
function), whenever a Triton launch hook is set (profilers such as proton), and with
``FORCE_JIT``, every call takes ``kernel[grid]`` itself. tests/test_launch.py checks
the key against Triton's own specialisation.
"""

from __future__ import annotations

import ctypes
import functools
import inspect
import operator
from typing import Dict, Sequence

import torch
import triton
import triton.language as tl

try:  # triton >= 3.4
    from triton import knobs as _knobs
except ImportError:  # pragma: no cover - older triton has no hooks in this place
    _knobs = None

_I32_MIN, _I32_MAX = -(1 << 31), (1 << 31) - 1

#: True: every launch takes ``kernel[grid]`` (for A/B measurements, e.g. benchmarks/profile_kernels.py).
FORCE_JIT = False

#: Entries of a Launcher's memo of compiled kernels by the scalars' values before it is cleared.
MEMO_SIZE = 4096

#: Compile options every launch passes: multiply-adds fused (``enable_fp_fusion``). The kernels'
#: arithmetic is written for it (the backward's dz is two multiply-adds: benchmarks/NOTES.md, P38)
#: and the configs were measured with it; triton 3.9 warns that its default turns fusion off
#: in 3.10, which would change both the bits and the instruction count silently.
COMPILE_OPTIONS = {"enable_fp_fusion": True}


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


_SCALARS = (int, float)
_DATA_PTR = torch.Tensor.data_ptr
_DTYPE = operator.attrgetter("dtype")


def tensors_key(tensors: Sequence, ptrs: Sequence[int]) -> tuple:
    """What Triton's specialisation distinguishes about tensor arguments, or finer: each tensor's
    dtype where its data pointer (``ptrs``, in order) is 16-byte aligned, ``(dtype,)`` where not.
    One pass in C (``map``) in the common case of every pointer aligned, which one OR of the
    pointers tells."""
    if functools.reduce(operator.or_, ptrs, 0) & 15:
        return tuple([t.dtype if not p & 15 else (t.dtype,) for t, p in zip(tensors, ptrs)])
    return tuple(map(_DTYPE, tensors))


def _unsupported(a):
    raise TypeError(f"Launcher: unsupported argument type {type(a).__name__}")


def scalars_key(scalars: Sequence) -> tuple:
    """What Triton's specialisation distinguishes about int and float arguments, or finer. An int:
    ``(== 1) + 2 * (divisible by 16) + 4 * (fits in int32)``, also for parameters in
    ``do_not_specialize`` (Triton only looks at the range there; a finer key adds cache entries
    that point at the same compiled kernel, never a wrong one). A float: None. Anything else
    raises TypeError (a tensor here would otherwise share a float's key)."""
    return tuple([(v == 1) + 2 * (not v & 15) + 4 * (_I32_MIN <= v <= _I32_MAX) if type(v) is int
                  else None if type(v) is float else _unsupported(v) for v in scalars])


def arg_key(a):
    """The key of one argument (:func:`tensors_key` or :func:`scalars_key`); raises TypeError for
    a type the fast path does not take."""
    if type(a) in _SCALARS:
        return scalars_key((a,))[0]
    if not isinstance(a, torch.Tensor):
        _unsupported(a)
    return tensors_key((a,), (a.data_ptr(),))[0]


@functools.lru_cache(maxsize=1)
def _libcuda():
    return ctypes.CDLL("libcuda.so.1")


def resident_programs(kernel) -> int:
    """Programs of a compiled Triton kernel (``CompiledKernel``) that one multiprocessor holds at
    once: the CUDA driver's occupancy calculator (``cuOccupancyMaxActiveBlocksPerMultiprocessor``)
    on the kernel's registers, warps and shared memory. At least 1. Raises RuntimeError when the
    driver refuses."""
    init = getattr(kernel, "_init_handles", None)
    if init is not None:  # the module is loaded on first use (triton >= 3.2)
        init()
    md = kernel.metadata
    n = ctypes.c_int(0)
    rc = _libcuda().cuOccupancyMaxActiveBlocksPerMultiprocessor(
        ctypes.byref(n), ctypes.c_void_p(kernel.function), ctypes.c_int(md.num_warps * 32),
        ctypes.c_size_t(md.shared))
    if rc != 0:
        raise RuntimeError(f"cuOccupancyMaxActiveBlocksPerMultiprocessor failed ({rc}) for {kernel.name}")
    return max(1, n.value)


class Launcher:
    """Launch one ``@triton.jit`` kernel through a cache of compiled kernels (see the module).

    The kernel's parameters must come as its tensors, then its ints and floats, then its
    constexprs (engine's kernels do; constexprs last is checked here, the tensors-then-scalars
    split on every cache miss), so that the tensors' pointers, the scalars and the constexpr values
    (in signature order) are the full argument list the compiled launcher takes.
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
        # The compiled kernels of _cache again, keyed by the scalars' values instead of their
        # specialisation (scalars_key), for the calls a process repeats (the same shapes every
        # step). Equal values specialise alike, so a hit is the kernel _cache holds for them; a
        # scalar of another type but an equal value (1 and 1.0, True and 1) reaches the compiled
        # launcher as given, which converts it or raises as it would on the _cache path (an int
        # parameter refuses a float). Cleared when it reaches MEMO_SIZE entries (a process of
        # ever-new row counts); _cache keeps the kernels.
        self._memo: Dict[tuple, object] = {}
        # resident_per_sm's answers by _cache's key
        self._resident: Dict[tuple, int] = {}
        self._driver = None

    def constexprs(self, **constexprs) -> tuple:
        """The constexpr values in signature order, every one given by name, for :meth:`launch`
        (callers that launch the same configuration often build this tuple once)."""
        if len(constexprs) != len(self._constexpr_names):
            raise TypeError(f"{self.kernel.fn.__name__}: constexprs {sorted(constexprs)} given, "
                            f"{list(self._constexpr_names)} wanted")
        return tuple(map(constexprs.__getitem__, self._constexpr_names))

    def __call__(self, grid, tensors: Sequence, scalars: Sequence, num_warps: int, num_stages: int,
                 **constexprs):
        """Launch on ``grid`` programs (an int, or a tuple ``(x, y)`` for a 2-D grid): ``tensors``
        then ``scalars`` (ints and floats) are the runtime arguments in signature order (engine's
        kernels take their tensors first); every constexpr parameter is given by name."""
        self.launch(grid, tensors, scalars, num_warps, num_stages, self.constexprs(**constexprs))

    def launch(self, grid, tensors: Sequence, scalars: Sequence, num_warps: int, num_stages: int,
               constexprs: tuple):
        """:meth:`__call__` with the constexpr values as :meth:`constexprs` returns them."""
        if FORCE_JIT or self._interpreted or _hooks_set():
            self._slow(grid, tensors, scalars, constexprs, num_warps, num_stages)
            return
        drv = self._driver
        if drv is None:
            drv = self._driver = triton.runtime.driver.active
        device = drv.get_current_device()
        ptrs = list(map(_DATA_PTR, tensors))
        tkey = tensors_key(tensors, ptrs)
        # The scalars' values stand in for their specialisation (a finer key, see _memo): one hash
        # of the tuple in C where scalars_key's pass over them took 0.9 us per launch.
        memo_key = (device, constexprs, num_warps, num_stages, tkey, scalars)
        k = self._memo.get(memo_key)
        if k is None:
            key = (device, constexprs, num_warps, num_stages, tkey, scalars_key(scalars))
            k = self._cache.get(key)
            if k is None:
                self._cache[key] = self._slow(grid, tensors, scalars, constexprs, num_warps, num_stages)
                return
            if len(self._memo) >= MEMO_SIZE:
                self._memo.clear()
            self._memo[memo_key] = k
        gx, gy = (grid, 1) if type(grid) is int else grid
        k.run(gx, gy, 1, drv.get_current_stream(device), k.function, k.packed_metadata, None, None, None,
              *ptrs, *scalars, *constexprs)

    def resident_per_sm(self, tensors: Sequence, scalars: Sequence, num_warps: int, num_stages: int,
                        constexprs: tuple) -> int:
        """Programs of the kernel that a :meth:`launch` with these arguments runs which one
        multiprocessor holds at once (:func:`resident_programs`), compiling the kernel without
        launching it where no launch has yet; cached by the kernel's key. 0 in the interpreter
        (no multiprocessors to fill). Callers cap a persistent grid with it where CTAs queued past
        residency would break a promise (``sm_margin``: SMs left free for other kernels)."""
        if self._interpreted:
            return 0
        drv = self._driver
        if drv is None:
            drv = self._driver = triton.runtime.driver.active
        ptrs = list(map(_DATA_PTR, tensors))
        key = (drv.get_current_device(), constexprs, num_warps, num_stages, tensors_key(tensors, ptrs),
               scalars_key(scalars))
        r = self._resident.get(key)
        if r is None:
            k = self._cache.get(key)
            if k is None:
                kw = dict(zip(self._constexpr_names, constexprs))
                k = self._cache[key] = self.kernel.run(
                    *tensors, *scalars, **kw, grid=(1,), warmup=True, num_warps=num_warps,
                    num_stages=num_stages, **COMPILE_OPTIONS)
            r = self._resident[key] = resident_programs(k)
        return r

    def _slow(self, grid, tensors, scalars, constexprs, num_warps, num_stages):
        if not all(isinstance(t, torch.Tensor) for t in tensors):
            raise TypeError(f"{self.kernel.fn.__name__}: tensors must be torch.Tensors, got "
                            f"{[type(t).__name__ for t in tensors]}")
        scalars_key(scalars)  # raises for anything but ints and floats
        kw = dict(zip(self._constexpr_names, constexprs))
        grid = (grid,) if type(grid) is int else tuple(grid)
        return self.kernel[grid](*tensors, *scalars, **kw, num_warps=num_warps, num_stages=num_stages,
                                 **COMPILE_OPTIONS)
