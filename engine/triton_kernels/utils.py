"""Helpers shared by the Triton kernels: device facts, dtype mapping, the FP8 cast."""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl

from engine import backend
from engine.fp8 import FP8_DTYPES, fp8_format

#: Stand-in SM count for CPU tensors in the interpreter: small, so that persistent loops
#: run several iterations per program even on small test shapes.
INTERPRETER_SM_COUNT = 4


@functools.lru_cache(maxsize=None)
def _cuda_sm_count(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """Multiprocessor count of ``device`` (cached); the interpreter stand-in for CPU tensors."""
    if device.type == "cuda":
        return _cuda_sm_count(device.index if device.index is not None else torch.cuda.current_device())
    return INTERPRETER_SM_COUNT


#: Which card's launch defaults the Triton kernels take where the two cards measured apart
#: (benchmarks/NOTES.md P109): 0 (the default) the device's class (:func:`lean_dram`), 1 the lean
#: card's, 2 the wide card's. For A/B runs of the two sets on one device
#: (``benchmarks/profile_kernels.py --dram-class``, which also sets the CUDA extension's twin,
#: :func:`engine.cuda_backend.dram_class`). Set it before the first launch: the forward plans
#: cached since (``norms.FWD_PLANS``) keep the class they were made with until emptied
#: (``engine.backend.reset_for_tests``).
DRAM_CLASS = 0
#: Peak DRAM bandwidth per SM (GB/s) under which a card is lean: the H100 SXM has 25 (3.35 TB/s
#: over 132 SMs), the H200 37 (4.9 TB/s); the CUDA extension's kLeanDramGbpsPerSm.
LEAN_DRAM_GBPS_PER_SM = 30


@functools.lru_cache(maxsize=None)
def _dram_gbps_per_sm(index: int) -> float:
    props = triton.runtime.driver.active.utils.get_device_properties(index)
    gbps = 2.0 * props["mem_clock_rate"] * props["mem_bus_width"] / 8 / 1e6  # kHz x bits
    return gbps / max(1, props["multiprocessor_count"])


def lean_dram(device: torch.device) -> bool:
    """Whether launches on ``device`` take the lean card's defaults (:data:`DRAM_CLASS` where set):
    a GPU whose peak DRAM bandwidth (memory clock x bus width x 2) per SM is under
    :data:`LEAN_DRAM_GBPS_PER_SM` needs fewer bytes in flight per SM, and there a few launch
    choices measured otherwise than on the H200 the tables were tuned on. CPU tensors (the
    interpreter) and a device that reports no bandwidth are not lean."""
    if DRAM_CLASS:
        return DRAM_CLASS == 1
    if device.type != "cuda":
        return False
    gbps = _dram_gbps_per_sm(device.index if device.index is not None else torch.cuda.current_device())
    return 0 < gbps < LEAN_DRAM_GBPS_PER_SM


def persistent_grid(work_items: int, device: torch.device, sm_margin: int, programs_per_sm: int) -> int:
    """Programs for a persistent launch: ``(SMs - sm_margin) * programs_per_sm``, capped by the work.

    In the interpreter (CPU tensors) at most 2 programs per stand-in SM, so that the persistent
    loops of the test shapes run several iterations whatever the GPU table says."""
    if device.type != "cuda":
        programs_per_sm = min(programs_per_sm, 2)
    sms = max(1, sm_count(device) - max(0, sm_margin))
    return max(1, min(work_items, sms * programs_per_sm))


def margin_grid(grid: int, sm_margin: int, device: torch.device, launcher, launches) -> int:
    """``grid`` capped, under an sm_margin on a GPU, at the programs that SMs - sm_margin hold at
    once: ``launches`` are ``(tensors, scalars, num_warps, num_stages, constexprs)`` of the launches
    that take this grid, and the fewest resident programs among their kernels count
    (``Launcher.resident_per_sm``). Several of the norms' table entries launch more programs per SM
    than fit (e.g. 32 of 8 warps: 256 warps for an SM's 64), which queues programs on every SM, the
    margin's too, until the grid's tail: the SMs sm_margin promises free for other kernels
    (communication) would not be free. The grid changes no output bit of the forward (every row's
    arithmetic is its own); the backward's dW / dB partials follow the grid as at any sm_margin.
    sm_margin 0, and the interpreter: ``grid``."""
    if sm_margin <= 0 or device.type != "cuda":
        return grid
    per_sm = min(launcher.resident_per_sm(*a) for a in launches)
    return max(1, min(grid, max(1, sm_count(device) - sm_margin) * per_sm))


def is_fp8(dtype: torch.dtype) -> bool:
    return dtype in FP8_DTYPES


@functools.lru_cache(maxsize=None)
def _cuda_capability(index: int) -> tuple:
    return tuple(torch.cuda.get_device_capability(index))


def check_fp8_output(dtype: torch.dtype, device: torch.device) -> None:
    """Raise :class:`engine.backend.BackendUnavailableError` where Triton cannot write ``dtype``.

    Triton has no float8_e4m3fn ("fp8e4nv") type below compute capability 8.9: on an A100 its
    kernels fail to compile with a message about Triton's internal type names. float8_e5m2 compiles
    everywhere, and the CUDA backend built for sm_80 converts both formats (in software below sm_89).
    Nothing to check for CPU tensors (the interpreter) or other dtypes.
    """
    if dtype is not torch.float8_e4m3fn or device.type != "cuda":
        return
    cap = _cuda_capability(device.index if device.index is not None else torch.cuda.current_device())
    if cap < (8, 9):
        raise backend.BackendUnavailableError(
            f"the Triton backend cannot write float8_e4m3fn on this GPU (sm_{cap[0]}{cap[1]}): "
            f"Triton supports that format from sm_89 on. Unset the ENGINE_USE_*_TRITON flag of "
            f"this op to use the CUDA backend, or quantize to float8_e5m2."
        )


def fp8_consts(dtype: torch.dtype):
    """(fp8_max, mantissa_bits, min_normal_exp) for an FP8 dtype, zeros for anything else."""
    if not is_fp8(dtype):
        return 0.0, 0, 0
    f = fp8_format(dtype)
    return f.max, f.mantissa_bits, f.min_normal_exp


def interpreter_rounding() -> bool:
    """True under TRITON_INTERPRET=1, whose fp32 -> bf16 and fp32 -> fp8 casts do not round to
    nearest even (see :func:`_cast`, :func:`_fp8_saturate_cast` and tests/test_interpreter_pins.py)."""
    return backend.settings().triton_interpret


@triton.jit
def _round_to_fp8_grid(v, MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """Round fp32 ``v`` (already clamped to the format's range) to the FP8 grid, ties to even.

    The quantum is ``2**(max(exponent(v), MIN_EXP) - MANT)``; ``t + 1.5*2**23 - 1.5*2**23`` rounds
    ``t = |v| / quantum`` (<= 16) to an integer with the IEEE default rounding, ties to even; the sign
    is put back after, so that tiny negatives give -0 as the hardware cast does.
    Division and multiplication by a power of two are exact.
    """
    bits = v.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 127
    e = tl.maximum(e, MIN_EXP)
    quantum = ((e - MANT + 127) << 23).to(tl.float32, bitcast=True)
    t = tl.abs(v) / quantum
    r = ((t + 12582912.0) - 12582912.0) * quantum
    return tl.where(bits < 0, -r, r)  # keep the sign, of zero too


@triton.jit
def _fp8_saturate_cast(v, fp8_max, OUT_DTYPE: tl.constexpr, INTERPRETER: tl.constexpr,
                       MANT: tl.constexpr, MIN_EXP: tl.constexpr):
    """Saturating FP8 cast of fp32 ``v`` (already multiplied by the scale); NaN stays NaN.

    On the GPU the cast alone does it: Triton lowers fp32 -> fp8e4nv / fp8e5 to
    ``cvt.rn.satfinite.{e4m3,e5m2}x2.f32`` (round to nearest even, saturating to +-max, NaN to NaN;
    checked in the PTX of triton 3.6 for sm_90). A clamp before it cost two instructions per value
    and turned NaN into -max (``tl.maximum`` drops NaN). Under TRITON_INTERPRET the native cast
    neither saturates nor rounds ties to even (shared/TRITON_INTERPRETER.md), so ``INTERPRETER``
    clamps and rounds to the grid in fp32 first; the cast of an exactly representable value is then
    exact. The interpreter's e4m3 cast turns NaN into a finite value (384), so NaN lanes get 0x7F,
    a NaN in both formats, through a bitcast.
    """
    if INTERPRETER:
        r = _round_to_fp8_grid(tl.minimum(tl.maximum(v, -fp8_max), fp8_max), MANT, MIN_EXP)
        bits = r.to(OUT_DTYPE).to(tl.int8, bitcast=True)
        return tl.where(v != v, 0x7F, bits).to(tl.int8).to(OUT_DTYPE, bitcast=True)
    return v.to(OUT_DTYPE)


@triton.jit
def _cast(v, DTYPE: tl.constexpr, INTERPRETER: tl.constexpr):
    """``v.to(DTYPE)`` for a high-precision DTYPE, rounding to nearest even everywhere.

    The interpreter truncates fp32 -> bf16 (tests/test_interpreter_pins.py); with ``INTERPRETER``
    the value is first rounded to bf16's grid in integer arithmetic (add 0x7FFF plus the lowest kept
    bit, clear the low 16 bits), after which the truncating cast is exact. NaN is kept as is.
    """
    if INTERPRETER:
        if DTYPE == tl.bfloat16:
            bits = v.to(tl.int32, bitcast=True)
            bits = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16) << 16
            v = tl.where(v != v, v, bits.to(tl.float32, bitcast=True))
    return v.to(DTYPE)


@triton.jit
def _div_rn(a, b):
    """Correctly rounded fp32 ``a / b`` (Triton's ``/`` is an approximate division on the GPU);
    scale and scale_inv must match the other backends bit for bit."""
    return tl.math.div_rn(a + tl.zeros_like(b), b)


@triton.jit
def _scale_from_amax(amax, fp8_max, amax_epsilon):
    """Current scaling: ``fp8_max / max(amax, eps)``, or 1 when that is 0, NaN or not finite."""
    a = tl.maximum(amax, amax_epsilon)
    s = _div_rn(fp8_max, a)
    ok = (a > 0.0) & (s < float("inf")) & (s > 0.0)
    return tl.where(ok, s, 1.0)


@triton.jit
def _max_nan(a, b):
    return tl.maximum(a, b, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _abs_max_part(v, mask, MASKED: tl.constexpr, INTERPRETER: tl.constexpr, V: tl.constexpr):
    """max |v| over each run of ``V`` neighbouring columns of a 2-D ``[BM, BN]`` tile: a
    ``[BM, BN // V]`` fp32 partial that propagates NaN (``max.NaN.f32``: ``tl.max`` drops NaN
    on the GPU). With ``V`` the number of contiguous values a thread holds in the tile's layout
    (16 for an FP8 output: the store's 16-byte vectors), the reduction stays inside each thread; a
    persistent loop keeps the running max of these partials and reduces it across the program
    once, with :func:`_abs_max_all`, instead of once per row tile. Interpreter: the max of the
    int32 bits of |v| (see :func:`_abs_max`)."""
    a = tl.abs(v)
    if MASKED or INTERPRETER:
        a = tl.where(mask, a, 0.0)
    a3 = tl.reshape(a, [v.shape[0], v.shape[1] // V, V])
    if INTERPRETER:
        return tl.max(a3.to(tl.int32, bitcast=True), axis=2).to(tl.float32, bitcast=True)
    return tl.reduce(a3, 2, _max_nan)


@triton.jit
def _abs_max_all(part, INTERPRETER: tl.constexpr):
    """The scalar max of a non-negative (or NaN) partial from :func:`_abs_max_part`, NaN first."""
    if INTERPRETER:
        bits = part.to(tl.int32, bitcast=True)
        return tl.max(tl.max(bits, axis=1), axis=0).to(tl.float32, bitcast=True)
    return tl.reduce(tl.reduce(part, 1, _max_nan), 0, _max_nan)


@triton.jit
def _abs_max(v, mask, MASKED: tl.constexpr, INTERPRETER: tl.constexpr):
    """max |v| over a 2-D tile as an fp32 scalar that propagates NaN, as the reference and CUDA
    backends do (``tl.max`` drops it on the GPU): ``max.NaN.f32`` with an ``|v|`` operand, one
    instruction per value. ``MASKED``: zero the lanes outside ``mask``; without it the caller
    guarantees they hold 0 (loads with ``other=0``). :func:`_abs_max_all` of the partials of
    :func:`_abs_max_part` over single columns.

    The interpreter runs a custom combine function in Python per pair (minutes per test), and its
    ``tl.max`` drops NaN too, so there the max is taken over the int32 bits of ``|v|``: integer
    order is float order for non-negative floats, and a NaN (sign cleared) sorts above +inf.
    """
    return _abs_max_all(_abs_max_part(v, mask, MASKED, INTERPRETER, 1), INTERPRETER)


@triton.jit
def _atomic_amax(AMAX, amax):
    """Max-update the fp32 ``*AMAX`` with a non-negative (or NaN) fp32 ``amax`` as int32 bits:
    integer order equals float order for non-negative floats, and a NaN (sign cleared) sorts above
    +inf, so it reaches ``*AMAX``. Relaxed: the amax is read only after the kernel, and
    ``tl.atomic_max``'s default ``acq_rel`` cost each program a ``MEMBAR.ALL.GPU`` (its stores
    drained), an L1 invalidation and a barrier on the atomic's return (NOTES P174: up to 4.8
    points of copy at 32 programs per SM); relaxed it is one ``REDG``."""
    bits = amax.to(tl.int32, bitcast=True) & 0x7FFFFFFF
    tl.atomic_max(AMAX.to(tl.pointer_type(tl.int32)), bits, sem="relaxed")
