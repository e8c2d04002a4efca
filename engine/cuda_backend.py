"""CUDA C++ backend: the op contracts of :mod:`engine.reference`, run by the compiled extension.

Each contract function has exactly the signature of its reference twin and is a thin call into
``engine._C`` (built from ``engine/csrc``): the extension checks the tensors, releases the GIL and
launches on the current stream. There is deliberately no per-call Python work beyond one device
check (host overhead is part of the small-shape budget).

The extension is the prebuilt ``engine._C`` when setup.py built it; otherwise it is compiled on
first use with ``torch.utils.cpp_extension.load`` (sources and flags from :mod:`engine._build`,
architectures from ``ENGINE_CUDA_ARCHS`` via :func:`engine.backend.settings`, cached in torch's
extension directory, ``TORCH_EXTENSIONS_DIR`` or ``~/.cache/torch_extensions``).
:func:`ensure_available` raises :class:`engine.backend.BackendUnavailableError` saying how to fix
it when that cannot work (torch without CUDA, no visible GPU, no nvcc, a failed build).
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
import os
import threading
from typing import Optional, Tuple

import torch

from engine.backend import BackendUnavailableError, settings
from engine.reference import check_out_t_modes

Tensor = torch.Tensor

__all__ = ["ensure_available", "norm_fwd", "norm_fwd_alloc", "norm_bwd", "norm_bwd_alloc",
           "norm_fwd_fp8_alloc", "cast_transpose", "cast_transpose_alloc", "fp8_transpose",
           "max_cluster_size", "norm_fwd_vectors", "norm_bwd_elems", "norm_bwd_reduce_vec",
           "norm_bwd_cta_threads",
           "norm_fwd_general_loop", "norm_fwd_blocked_from", "norm_fwd_grid_per_sm",
           "norm_bwd_stream_from", "norm_bwd_stream_threads", "norm_fwd_stream_from",
           "norm_fwd_stream_threads", "norm_fwd_band", "norm_fwd_lean", "norm_fwd_fp8_lean", "norm_fwd_blocked_shape", "fp8_transpose_order", "dram_class", "device_dram_class",
           "IN_KERNEL_TRANSPOSE_MAX_N", "SMALL_COPY_ROWS", "FEW_ROWS_PER_SM",
           "FEW_ROWS_PER_SM_FP16"]

#: Per norm, with ENGINE_NORM_EXTERNAL_TRANSPOSE unset: rows of at most this many elements ask the
#: norm kernel for the FP8 transposed copy with ``out_t_auto`` (the extension then takes the faster
#: path by the width and the card's class: the band kernel where it applies and won; the register
#: path's tile up to 1024, in-kernel against external 72 / 65 % of copy on the H200 for RMSNorm at
#: 1K; the tiled transpose after the norm elsewhere; engine/csrc/normalization/norm_fwd_band.cuh:
#: fwd_band_cfg), wider rows ask for the tiled transpose after the norm (``out_t_after``), which the
#: extension runs in the same call. The band kernel takes rows of up
#: to 16384 (benchmarks/NOTES.md P104, P105, P117).
IN_KERNEL_TRANSPOSE_MAX_N = {"rmsnorm": 16384, "layernorm": 16384}
#: With ENGINE_NORM_EXTERNAL_TRANSPOSE unset, copies of at most this many rows (and
#: engine._norm_ops.SMALL_COPY_VALUES) come from the tiled transpose after the norm: at 8192 rows
#: the band kernel and the register path's tile win again (8192 x 1024: 12.4 against 13.4-13.7
#: us on both cards; benchmarks/NOTES.md Q32, Q33).
SMALL_COPY_ROWS = 4096
#: The forward's register path gives a bf16 row of 1K-8K 4 vectors of x per thread instead of 8
#: where the call has at most this many rows per SM the launch may use (the extension's
#: kFewRowsPerSm, norm_fwd_launch.cuh, which tests/test_norm_contract.py checks this against):
#: with few rows the kernel's time is one CTA's instruction stream (benchmarks/NOTES.md Q35-Q37,
#: P146-P147). Informational: changing it here changes nothing in the extension.
FEW_ROWS_PER_SM = 8
#: The same for an fp16 row of more than 1K (kFewRowsPerSmF16): 1 row per SM, where 4 vectors
#: gained at 32-128 rows and lost from 512 (benchmarks/NOTES.md Q42, P148); fp16 rows of up to
#: 1K keep 8 vectors (not measured).
FEW_ROWS_PER_SM_FP16 = 1

_log = logging.getLogger("engine.cuda_backend")
_lock = threading.Lock()
_ext = None  # the loaded extension module
_failure: Optional[BackendUnavailableError] = None  # a failed load/build, re-raised (not retried)
_JIT_NAME = "engine_C"


def _repo_root() -> str:
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _jit_build():
    from torch.utils import cpp_extension

    from engine import _build

    cuda_home = cpp_extension.CUDA_HOME
    nvcc = os.path.join(cuda_home, "bin", "nvcc") if cuda_home else None
    if nvcc is None or not os.path.exists(nvcc):
        raise BackendUnavailableError(
            "engine: the CUDA extension is not built and cannot be compiled: nvcc was not found "
            f"(CUDA_HOME={cuda_home!r}). Install the CUDA toolkit matching torch's CUDA "
            f"{torch.version.cuda} and set CUDA_HOME (or put nvcc on PATH), or install a build of "
            "engine that includes the extension (pip install . on a machine with nvcc). To use "
            "the Triton kernels instead, set ENGINE_USE_RMSNORM_TRITON=1 / "
            "ENGINE_USE_LAYERNORM_TRITON=1 / ENGINE_USE_CAST_TRANSPOSE_TRITON=1."
        )
    root = _repo_root()
    archs = settings().cuda_archs
    msg = "engine: compiling the CUDA extension on first use (a few minutes)..."
    _log.warning(msg)
    try:
        return cpp_extension.load(
            name=_JIT_NAME,
            sources=_build.sources(root),
            extra_include_paths=_build.include_dirs(root),
            extra_cflags=_build.cxx_flags(),
            extra_cuda_cflags=_build.nvcc_flags(archs),
            verbose=False,
        )
    except Exception as e:  # compiler errors, linker errors, bad ENGINE_CUDA_ARCHS
        raise BackendUnavailableError(
            f"engine: compiling the CUDA extension failed ({type(e).__name__}: {e}). Check that "
            f"nvcc ({nvcc}) matches torch's CUDA {torch.version.cuda} and that ENGINE_CUDA_ARCHS "
            f"({archs or 'unset: 9.0'}) names your GPU's architecture; or select the Triton "
            "backend with ENGINE_USE_*_TRITON=1."
        ) from e


def ensure_available() -> None:
    """Load (or JIT-build) the extension; raise :class:`BackendUnavailableError` with a fix if not.

    Idempotent and thread-safe; after the first success it costs one global lookup.
    """
    global _ext, _failure
    if _ext is not None:
        return
    with _lock:
        if _ext is not None:
            return
        if _failure is not None:  # a build takes minutes: fail fast with the first error
            raise _failure
        try:
            _ext = _load()
        except BackendUnavailableError as e:
            _failure = e
            raise


def _load():
    """The extension module: prebuilt engine._C, else a JIT build; raises BackendUnavailableError."""
    if torch.version.cuda is None:
        raise BackendUnavailableError(
            f"engine: the CUDA backend needs a CUDA build of PyTorch, this one is "
            f"{torch.__version__} without CUDA. Install a CUDA build of torch, or use CPU "
            "tensors (reference backend)."
        )
    if not torch.cuda.is_available():
        raise BackendUnavailableError(
            "engine: the CUDA backend needs a visible GPU, torch.cuda.is_available() is False. "
            "Check the driver and CUDA_VISIBLE_DEVICES, or use CPU tensors."
        )
    if importlib.util.find_spec("engine._C") is None:  # not prebuilt (editable install): JIT
        return _jit_build()
    try:
        from engine import _C as ext  # prebuilt by setup.py
    except ImportError as e:
        _log.warning("engine: the prebuilt extension engine._C does not load (%s); building it "
                     "instead", e)
        ext = _jit_build()
    return ext


def _ext_or_load():
    if _ext is None:
        ensure_available()
    return _ext


#: How the binding's message of a failed output allocation begins (bindings.cpp: kOom).
_OOM = "engine: out of memory: "


def _raise(msg: str) -> None:
    """The binding returns "" on success, else the message of a bad argument or a CUDA failure
    (RuntimeError), or of an output it could not allocate (torch.OutOfMemoryError, as torch.empty
    would raise)."""
    if msg.startswith(_OOM):
        raise torch.OutOfMemoryError(msg)
    raise RuntimeError(msg)


def _outputs(result: tuple) -> tuple:
    """The outputs of an allocating entry's ``(message, *outputs)``; raises for a message."""
    if result[0]:
        _raise(result[0])
    return result[1:]


def _not_cuda(fn: str, name: str, t) -> None:
    where = t.device if isinstance(t, torch.Tensor) else type(t).__name__
    raise ValueError(
        f"engine.cuda_backend.{fn}: {name} must be a CUDA tensor, got {where}; the CUDA backend "
        "runs on CUDA tensors only (CPU tensors use engine.reference)"
    )


def norm_fwd_alloc(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    out_dtype: Optional[torch.dtype],
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    sm_margin: int,
) -> Tuple[Tensor, Optional[Tensor], Optional[Tensor], Tensor]:
    """The high-precision :func:`norm_fwd` with its outputs allocated by the extension in the same
    call: ``(out, residual_out, mu, rsigma)``, out in ``out_dtype`` (x's dtype where None),
    residual_out in the residual's dtype (None without one), mu for LayerNorm (None for RMSNorm),
    all from torch's caching allocator on x's device and stream. One host call where allocating
    from Python takes one per output (``engine._norm_ops.norm_fwd`` uses it; small shapes are
    host-bound). Positional arguments: it sits on the per-call path."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("norm_fwd_alloc", "x", x)
    out, _, _, res_out, mu, rsigma = _outputs((_ext or _ext_or_load()).norm_fwd_alloc(
        x, weight, bias, residual, eps, out_dtype, None, None, False, is_rms_norm,
        zero_centered_gamma, False, 0.0, sm_margin, False, False))
    return out, res_out, mu, rsigma


def norm_fwd_fp8_alloc(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    scale: Tensor,
    amax: Tensor,
    eps: float,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    fp8_dtype: torch.dtype,
    columnwise: bool,
    current_scaling: bool,
    amax_epsilon: float,
    sm_margin: int,
    out_t_auto: bool,
    out_t_after: bool,
) -> Tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor], Optional[Tensor], Tensor]:
    """The FP8 :func:`norm_fwd` with its outputs allocated by the extension in the same call, as
    :func:`norm_fwd_alloc`: ``(data, data_t, scale_inv, residual_out, mu, rsigma)``, data in
    ``fp8_dtype``, data_t (``[N, M]``) with ``columnwise`` (else None), scale_inv of one fp32
    element. ``out_t_auto`` / ``out_t_after`` as in :func:`norm_fwd`. Positional arguments."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("norm_fwd_fp8_alloc", "x", x)
    check_out_t_modes(out_t_auto, out_t_after)
    return _outputs((_ext or _ext_or_load()).norm_fwd_alloc(
        x, weight, bias, residual, eps, fp8_dtype, scale, amax, columnwise, is_rms_norm,
        zero_centered_gamma, current_scaling, amax_epsilon, sm_margin, out_t_auto, out_t_after))


def norm_fwd(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    residual: Optional[Tensor],
    eps: float,
    out: Tensor,
    residual_out: Optional[Tensor],
    mu: Optional[Tensor],
    rsigma: Tensor,
    scale: Optional[Tensor],
    amax: Optional[Tensor],
    scale_inv: Optional[Tensor],
    out_t: Optional[Tensor],
    *,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    current_scaling: bool,
    amax_epsilon: float,
    sm_margin: int,
    out_t_auto: bool = False,
    out_t_after: bool = False,
) -> None:
    """Norm forward; see :func:`engine.reference.norm_fwd` for the contract. With ``out_t_auto``
    the transposed copy comes from the band kernel where it applies and the card's defaults take it
    (FP8 with delayed scaling, a 16-bit x without a residual, rows of 1025-16384;
    :func:`norm_fwd_band`), the register path's tile for rows of up to 1024, the tiled transpose
    after the norm otherwise; with ``out_t_after`` from the tiled transpose after the norm, run by
    the extension in the same call; with neither, from the norm kernel where its path has one.
    Wherever M % 16 != 0 with M even the copy comes from the tiled transpose in every case (its
    runs are 2-, 4- or 8-byte aligned; the in-kernel copies would store them in bytes: NOTES
    P135, P137). Whether a copy is made can choose the norm's kernel: on a lean
    card delayed scaling without one takes the register path's clusters at RMSNorm 16K-32K and
    LayerNorm 32K, with one the streamed kernel (benchmarks/NOTES.md P133)."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("norm_fwd", "x", x)
    check_out_t_modes(out_t_auto, out_t_after)
    err = (_ext or _ext_or_load()).norm_fwd(
        x, weight, bias, residual, eps, out, residual_out, mu, rsigma, scale, amax, scale_inv,
        out_t, is_rms_norm, zero_centered_gamma, current_scaling, amax_epsilon, sm_margin,
        out_t_auto, out_t_after,
    )
    if err:
        _raise(err)


def norm_bwd_alloc(
    dy: Tensor,
    x: Tensor,
    mu: Optional[Tensor],
    rsigma: Tensor,
    weight: Tensor,
    dresidual: Optional[Tensor],
    has_bias: bool,
    dx_dtype: torch.dtype,
    dres_dtype: Optional[torch.dtype],
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    sm_margin: int,
) -> Tuple[Tensor, Optional[Tensor], Tensor, Optional[Tensor]]:
    """:func:`norm_bwd` with its outputs allocated by the extension in the same call, as
    :func:`norm_fwd_alloc`: ``(dx, dres, dweight, dbias)``, dx in ``dx_dtype``, dres in
    ``dres_dtype`` where it is given and differs from ``dx_dtype`` (else None: dx serves), dweight
    and (with ``has_bias``) dbias in weight's dtype. Positional arguments."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("norm_bwd_alloc", "x", x)
    return _outputs((_ext or _ext_or_load()).norm_bwd_alloc(
        dy, x, mu, rsigma, weight, dresidual, has_bias, dx_dtype, dres_dtype, is_rms_norm,
        zero_centered_gamma, sm_margin))


def norm_bwd(
    dy: Tensor,
    x: Tensor,
    mu: Optional[Tensor],
    rsigma: Tensor,
    weight: Tensor,
    dresidual: Optional[Tensor],
    dx: Tensor,
    dres: Optional[Tensor],
    dweight: Tensor,
    dbias: Optional[Tensor],
    *,
    is_rms_norm: bool,
    zero_centered_gamma: bool,
    sm_margin: int,
) -> None:
    """Norm backward; see :func:`engine.reference.norm_bwd` for the contract."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("norm_bwd", "x", x)
    err = (_ext or _ext_or_load()).norm_bwd(
        dy, x, mu, rsigma, weight, dresidual, dx, dres, dweight, dbias, is_rms_norm,
        zero_centered_gamma, sm_margin,
    )
    if err:
        _raise(err)


def cast_transpose_alloc(
    x: Tensor,
    scale: Tensor,
    amax: Tensor,
    fp8_dtype: torch.dtype,
    rowwise: bool,
    columnwise: bool,
    current_scaling: bool,
    amax_epsilon: float,
) -> Tuple[Optional[Tensor], Optional[Tensor], Tensor]:
    """:func:`cast_transpose` with its outputs allocated by the extension in the same call:
    ``(out, out_t, scale_inv)``, out ``[M, N]`` with ``rowwise`` and out_t ``[N, M]`` with
    ``columnwise`` (else None) in ``fp8_dtype``, scale_inv of one fp32 element. Positional
    arguments."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("cast_transpose_alloc", "x", x)
    return _outputs((_ext or _ext_or_load()).cast_transpose_alloc(
        x, scale, amax, fp8_dtype, rowwise, columnwise, current_scaling, amax_epsilon))


def cast_transpose(
    x: Tensor,
    scale: Tensor,
    amax: Tensor,
    scale_inv: Tensor,
    out: Optional[Tensor],
    out_t: Optional[Tensor],
    *,
    current_scaling: bool,
    amax_epsilon: float,
) -> None:
    """FP8 cast with fused amax and optional transpose; see :func:`engine.reference.cast_transpose`."""
    if not getattr(x, "is_cuda", False):
        _not_cuda("cast_transpose", "x", x)
    err = (_ext or _ext_or_load()).cast_transpose(
        x, scale, amax, scale_inv, out, out_t, current_scaling, amax_epsilon
    )
    if err:
        _raise(err)


def fp8_transpose(data: Tensor, out_t: Tensor) -> None:
    """Bitwise tiled transpose of 1-byte data; see :func:`engine.reference.fp8_transpose`."""
    if not getattr(data, "is_cuda", False):
        _not_cuda("fp8_transpose", "data", data)
    err = (_ext or _ext_or_load()).fp8_transpose(data, out_t)
    if err:
        _raise(err)


@contextlib.contextmanager
def _knob(setter: str, n: int):
    """Set a process-wide launch knob of the extension for the ``with`` block, then restore it."""
    ext = _ext or _ext_or_load()
    prev = getattr(ext, setter)(n)
    try:
        yield
    finally:
        getattr(ext, setter)(prev)


def max_cluster_size(n: int):
    """Context manager: inside the ``with`` block the CUDA norm kernels split a wide row over
    thread-block clusters of at most ``n`` CTAs (sm_90 only): 1, 2, 4, 8 or 16, or 0, the default,
    for 16 where the device holds a 16-CTA cluster at one CTA per SM (a non-portable size; the
    H100 and H200 do) and 8 elsewhere. An explicit 16 on a device that cannot hold such a cluster
    makes the launch raise. ``n = 1`` keeps every row inside one CTA, the paths used before
    clusters (and on devices or builds without them), so that tests and benchmarks can run both on
    one GPU. Process-wide, not thread-safe; restores the previous value on exit. A bad ``n`` raises
    ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2, 4, 8, 16):
        raise ValueError(f"max_cluster_size: n must be 0, 1, 2, 4, 8 or 16, got {n!r}")
    return _knob("set_max_cluster_size", n)


def norm_fwd_vectors(n: int):
    """Context manager: inside the ``with`` block the CUDA norm forward's register path (a row
    inside one CTA, 16-bit x and residual stream) gives each thread ``n`` 16-byte vectors of a row
    (4 or 8), or ``n = 0``, the default, the launcher's choice (for bf16: 4 for rows of 520-1024
    elements, where a row is then one warp, and for wider rows of at most 8K in calls of at most
    ``FEW_ROWS_PER_SM`` (8) rows per SM, where the kernel's time is one CTA's instructions; for
    fp16 the wider rows in calls of at most ``FEW_ROWS_PER_SM_FP16`` (1) row per SM; 8
    otherwise: benchmarks/NOTES.md, P6, P146-P148). Fewer vectors per thread means more
    threads per row and more CTAs per SM; rows that would need more than 256 threads at ``n``
    keep 8. For tests and A/B benchmarks of the layouts on one GPU.
    Process-wide, not thread-safe; restores the previous value on exit. A bad ``n`` raises
    ValueError at the call."""
    if type(n) is not int or n not in (0, 4, 8):
        raise ValueError(f"norm_fwd_vectors: n must be 0, 4 or 8, got {n!r}")
    return _knob("set_norm_fwd_vectors", n)


def norm_bwd_elems(n: int):
    """Context manager: inside the ``with`` block the CUDA norm backward's register path (16-bit
    x and dy) holds ``n`` values of a row per thread (16 or 32), or ``n = 0``, the default, the
    launcher's choice (32 in one CTA for rows of 4K-8K, 16 up to 32K, 32 and 64 past:
    benchmarks/NOTES.md, P11 and P14; at 16 the rows of 8K-16K run in one CTA of up to 1024
    threads, the others in clusters: ``norm_bwd_cta_threads``). At 32, rows past 4K take 32
    values per thread: one CTA per row to 8K, thread-block clusters of half the size beyond, the
    dweight / dbias partials in shared memory; at 16, rows wider than 16-value clusters hold take
    the blocked kernel. For tests and A/B benchmarks of the layouts on one GPU. Process-wide, not
    thread-safe; restores the previous value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 16, 32):
        raise ValueError(f"norm_bwd_elems: n must be 0, 16 or 32, got {n!r}")
    return _knob("set_norm_bwd_elems", n)


def norm_bwd_reduce_vec(n: int):
    """Context manager: inside the ``with`` block the CUDA norm backward's dweight / dbias
    reduction (the sum of the backward CTAs' fp32 partial rows) runs its sliced kernel at ``n``
    columns per thread: 1 (CTAs of 32 columns), 4 (one 16-byte load per partial row, CTAs of 128
    columns striding over the column blocks); or ``n = 0``, the default: the flat kernel (each
    thread sums its 4 columns over all partial rows) where there are at most 16 partial rows and
    the 128-column blocks outnumber the sliced kernel's grid (4 CTAs per SM and set),
    else 4 where the 128-column blocks of dweight and dbias cover the SMs and 1 otherwise
    (benchmarks/NOTES.md, P171, P172). Every form adds a column's partials in the same order: the
    bits do not change. For tests and A/B benchmarks on one GPU.
    Process-wide, not thread-safe; restores the previous value on exit. A bad ``n`` raises
    ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 4):
        raise ValueError(f"norm_bwd_reduce_vec: n must be 0, 1 or 4, got {n!r}")
    return _knob("set_norm_bwd_reduce_vec", n)


def norm_bwd_cta_threads(n: int):
    """Context manager: inside the ``with`` block the CUDA norm backward's register path (16-bit
    x and dy) runs 16 values per thread in one CTA per row, without a thread-block cluster, as
    ``n`` says: 1024, rows that need 513-1024 threads (bf16 8K-16K) in one CTA of up to 1024
    threads (LayerNorm's with its dweight / dbias partials in shared memory, to fit the 64
    registers of 1024 threads); 512, rows of 257-512 threads (bf16 4K-8K), both norms, in one
    CTA of up to 512 (5 points slower at 8K than the default's 32 values per thread in 256
    threads); 256, neither (the layouts of ``norm_bwd_elems``); 0, the default, as 1024
    (benchmarks/NOTES.md, P34 and P37). For tests
    and A/B benchmarks of the layouts on one GPU. Process-wide, not thread-safe; restores the
    previous value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 256, 512, 1024):
        raise ValueError(f"norm_bwd_cta_threads: n must be 0, 256, 512 or 1024, got {n!r}")
    return _knob("set_norm_bwd_cta_threads", n)


def norm_fwd_general_loop(n: int):
    """Context manager: with ``n = 1`` inside the ``with`` block the CUDA norm forward's register
    kernels run their general row loop (every mode and output; run-time tests per slot) for
    every launch; ``n = 0``, the default, runs the fast loop where it applies (FP8 outputs with
    delayed scaling in the 256-thread builds: benchmarks/NOTES.md, P15 and P16). Both compute the
    same bits. For tests and A/B benchmarks on one GPU. Process-wide, not thread-safe; restores
    the previous value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 1):
        raise ValueError(f"norm_fwd_general_loop: n must be 0 or 1, got {n!r}")
    return _knob("set_norm_fwd_general_loop", n)


def norm_fwd_blocked_from(n: int):
    """Context manager: inside the ``with`` block the CUDA norm forward runs its blocked kernel
    (two passes over each row, the second re-reading it from L2; CTAs sized to the row, at most
    512 threads, as many per SM as fit)
    for rows of ``n`` columns and more where x and the residual stream share a dtype and allow
    16-byte vectors, instead of the register path or a thread-block cluster (a width past every
    row, e.g. ``1 << 30``: never, the paths before session 15); ``n = 0``, the default, the
    launcher's choice: the fused residual add of a 16-bit x to a non-FP8 output at 2K-16K
    columns (where an FP8 output keeps the register path, at 16K the stream, and is then within
    one FP8 step of the fp32 output's cast; 16K since P130), an RMSNorm FP8 output of a 16-bit
    x without a residual at 4K-16K on a lean card (:func:`device_dram_class` 1, the H100; the
    H200 keeps the register path and the stream there, P116; where the other outputs keep the
    register path, so that the FP8 output is within one FP8 step of the fp32 output's cast), and
    from 32K, whatever the output dtype, where the streamed kernel does not take it
    (``norm_fwd_stream_from``; by default it does not take a residual of x's dtype at 32K-64K)
    (benchmarks/NOTES.md, P44, P45, P53, P89, P91, P96, P100, P102, P103 and P130); an ``n > 0``
    takes precedence over the streamed kernel. For tests and A/B benchmarks of the paths on one
    GPU. Process-wide, not thread-safe; restores the previous value on exit. A bad ``n`` (not an
    int, or negative) raises ValueError at the call."""
    if type(n) is not int or n < 0:
        raise ValueError(f"norm_fwd_blocked_from: n must be an int >= 0, got {n!r}")
    return _knob("set_norm_fwd_blocked_from", n)


def norm_fwd_grid_per_sm(n: int):
    """Context manager: inside the ``with`` block the CUDA norm forward's register path (rows
    that fit one CTA, no thread-block cluster) launches ``n`` CTAs per SM (1 to 64, capped at its
    row blocks); where more are launched than fit an SM at once, the block scheduler starts each
    as another ends, and each loops over its share of the rows. ``n = 0``, the default, is the
    launcher's choice (``fwd_grid_per_sm`` in engine/csrc/normalization/norm_fwd_launch.cuh): 16
    for a non-FP8 output without a residual (both norms; 32 for rows of up to 1K), the resident
    CTAs (a persistent grid) for the rest, as measured on the H200 (benchmarks/NOTES.md, P46, P82,
    P166, P167). Under an ``sm_margin`` no more than the resident CTAs per SM (NOTES P164: a grid
    past residency leaves no SM free).
    The grid changes no row's arithmetic: every output bit is the same. For tests and A/B
    benchmarks on one GPU. Process-wide, not thread-safe; restores the previous value on exit. A
    bad ``n`` (not an int in 0..64) raises ValueError at the call."""
    if type(n) is not int or not 0 <= n <= 64:
        raise ValueError(f"norm_fwd_grid_per_sm: n must be an int in 0..64, got {n!r}")
    return _knob("set_norm_fwd_grid_per_sm", n)


def norm_bwd_stream_from(n: int):
    """Context manager: inside the ``with`` block the CUDA norm backward runs its streamed
    cluster kernel for rows of ``n`` columns and more where x and dy are 16-bit and allow 16-byte
    vectors (on a GPU with thread-block clusters): the row is split over a cluster and each CTA
    copies its slice of the next two rows into shared memory (cp.async) while it reduces one row
    and writes the previous row's dx (engine/csrc/normalization/norm_bwd_stream.cuh). A width
    past every row (e.g. ``1 << 30``) never takes it: the paths before session 17; ``n = 0``, the
    default, is the launcher's choice (``bwd_take_stream``: from 4096 columns, where it measured
    faster on the H200, benchmarks/NOTES.md P49-P52). For tests and A/B benchmarks of the
    paths on one GPU. Process-wide, not thread-safe; restores the previous value on exit. A bad
    ``n`` (not an int, or negative) raises ValueError at the call."""
    if type(n) is not int or n < 0:
        raise ValueError(f"norm_bwd_stream_from: n must be an int >= 0, got {n!r}")
    return _knob("set_norm_bwd_stream_from", n)


def norm_fwd_stream_from(n: int):
    """Context manager: inside the ``with`` block the CUDA norm forward runs its streamed cluster
    kernel for rows of ``n`` columns and more where x is 16-bit, without a residual or with a
    residual of x's dtype, and allows 16-byte vectors (on a GPU with thread-block clusters), for
    high-precision outputs, delayed scaling and current scaling's statistics pass: the row is
    split over a cluster and each CTA copies its slice of the next two rows (and of their
    residual) into shared memory (cp.async) while it reduces one row and writes an earlier one
    (engine/csrc/normalization/norm_fwd_stream.cuh). A width past every row (e.g. ``1 << 30``)
    never takes it: the paths before session 18; an ``n > 0`` applies to every output dtype,
    with a residual or without. ``n = 0``, the default, is the launcher's choice
    (``fwd_take_stream``: from 32768 columns, both norms (P101, P102; on a card that is not
    lean LayerNorm's 16-bit outputs without a residual from past 32768, the clusters taking
    32K, P131); RMSNorm's FP8 outputs,
    delayed and current scaling, from 16384, and on a lean card (the H100) past 16384, below which
    the blocked kernel takes them from 4096 (``norm_fwd_blocked_from``); LayerNorm's FP8 outputs
    from 8192 on a card that is not lean (the H200, P116); on a lean card an FP8 output in delayed
    scaling with no transposed copy (``out_t`` None) only past 32768, both norms, the clusters
    taking RMSNorm's 16K-32K and LayerNorm's 32K (P133); a residual of x's dtype from 16384, both norms, before the
    blocked kernel, except at 32K-64K (the blocked kernel there, every output dtype) and, for a
    non-FP8 output, at 16384 itself (the blocked kernel's one chunk, P130); an ``n > 0`` keeps
    the stream at those widths too; benchmarks/NOTES.md P56, P89, P90, P96, P103, and NOTES
    P59/P67/P68 measurements (RMSNorm 16K e4m3 75.0 -> 81.7)). At RMSNorm 4K-32K (16K-32K on a
    card that is not lean), at LayerNorm 8K-32K on a card that is not lean, and with a residual at 2K-16K, an
    FP8 output is then within one FP8 step of the cast of the same call's fp32 output (which
    takes another kernel), not its exact cast. For tests and A/B
    benchmarks of the paths on one GPU. Process-wide, not thread-safe; restores the previous
    value on exit. A bad ``n`` (not an int, or negative) raises ValueError at the call."""
    if type(n) is not int or n < 0:
        raise ValueError(f"norm_fwd_stream_from: n must be an int >= 0, got {n!r}")
    return _knob("set_norm_fwd_stream_from", n)


def norm_fwd_stream_threads(n: int):
    """Context manager: inside the ``with`` block the CUDA forward's streamed kernel (above) runs
    CTAs of at most ``n`` threads (128, 256 or 512): its cluster is the smallest power of two
    whose CTAs of at most ``n`` threads hold the row at 32 values per thread, so a smaller ``n``
    means a larger cluster of smaller CTAs, more of them per SM. ``n = 0``, the default, is the
    launcher's choice (benchmarks/NOTES.md P56). With a residual the CTAs hold at most 256 threads
    whatever ``n`` (their stages hold x and the residual; NOTES P89). For tests and A/B benchmarks. Process-wide, not
    thread-safe; restores the previous value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 128, 256, 512):
        raise ValueError(f"norm_fwd_stream_threads: n must be 0, 128, 256 or 512, got {n!r}")
    return _knob("set_norm_fwd_stream_threads", n)


def norm_fwd_lean(n: int):
    """Context manager: inside the ``with`` block ``n = 1`` keeps the CUDA norm forward's register
    kernel for the rows its lean kernel takes by default (engine/csrc/normalization/
    norm_fwd_lean.cuh: a 16-bit x without a residual to a non-FP8 output, rows of 4096-16384
    columns at 8 vectors per thread, and of 32768 for RMSNorm on a card that is not lean, the
    H200, and for LayerNorm on a lean one, the H100: benchmarks/NOTES.md P154); ``n = 0``, the
    default, runs the lean kernel there; ``n = 2`` also at 32768 for both norms on any card
    (before the streamed kernel and the clusters, as one 512-thread CTA per row; for A/B runs);
    ``n = 3`` as 2, with those rows over a cluster of two 256-thread CTAs (the default's form for
    RMSNorm on a card that is not lean, where :func:`max_cluster_size` allows a cluster: P155).
    The lean kernel gives the register kernel's bits at one CTA per row (it adds each row's
    values in the register kernel's order); it runs 2 CTAs of 256 threads per SM with no
    per-CTA prologue (benchmarks/NOTES.md, Q43, Q44, P150).
    For tests and A/B benchmarks on one GPU. Process-wide, not thread-safe; restores the previous
    value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2, 3):
        raise ValueError(f"norm_fwd_lean: n must be 0, 1, 2 or 3, got {n!r}")
    return _knob("set_norm_fwd_lean", n)


def norm_fwd_fp8_lean(n: int):
    """Context manager: which widths the CUDA norm forward's lean FP8 kernel takes inside the
    ``with`` block (engine/csrc/normalization/norm_fwd_fp8_lean.cuh: a 16-bit x without a residual,
    weights of x's dtype, RMSNorm without a bias or LayerNorm, to an FP8 output in delayed scaling
    with no transposed copy asked of the kernel; one 512-thread CTA per SM, the next row loaded at
    the top of this row's work, gamma and beta held in fp32 registers, 4 vectors of x per thread).
    ``n = 0`` (the default): where it measured faster than the register and streamed kernels on
    the H200 (benchmarks/NOTES.md P181b, P186c), on a card that is not lean (``dram_class`` 2):
    RMSNorm's rows of 4096, 8192, 12288 and 16384 columns, LayerNorm's of 4096, 6144 and 8192;
    ``n = 1`` never; ``n = 2`` at every width whose row groups it fills (a multiple of 1024 columns
    up to 16384), on either card, before the register, streamed and blocked kernels. Its bytes are the register
    kernel's at 4 vectors per thread (the same order of each row's sums), so where it runs an FP8
    output is within one FP8 step of the cast of the same call's fp32 output (8 vectors per
    thread), at rounding boundaries only. For tests and A/B benchmarks. Process-wide, not thread-safe; restores the previous value on exit. A bad ``n``
    raises ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2):
        raise ValueError(f"norm_fwd_fp8_lean: n must be 0, 1 or 2, got {n!r}")
    return _knob("set_norm_fwd_fp8_lean", n)


def norm_fwd_blocked_shape(n: int):
    """Context manager: inside the ``with`` block the CUDA forward's blocked kernel, on the rows
    with a fused residual add of a 16-bit x (of x's dtype) to a non-FP8 output, which it takes by
    default at 2K-16K, runs in the shape ``n`` says: ``1`` four 16-byte vectors per thread per
    chunk on the resident grid (the shape before P162), ``2`` two vectors per thread (CTAs of
    twice the threads, up to 512, so rows of up to 8192 columns; wider rows keep four), ``3`` the
    same on a grid of 32 CTAs per SM, ``4`` four vectors per thread on a grid of 32 CTAs per SM;
    ``0`` (the default) the shape by width, as measured on the H200 (benchmarks/NOTES.md P162: 2
    to 2K, 3 to 4K and at RMSNorm 8K, 4 at LayerNorm 8K and at 16K, 1 wider). For tests and A/B
    benchmarks. Process-wide, not thread-safe; restores the previous value on exit. A bad ``n``
    raises ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2, 3, 4):
        raise ValueError(f"norm_fwd_blocked_shape: n must be 0, 1, 2, 3 or 4, got {n!r}")
    return _knob("set_norm_fwd_blocked_shape", n)


def norm_fwd_band(n: int):
    """Context manager: inside the ``with`` block the CUDA forward's band kernel (an FP8 output
    with its transposed copy written by the norm kernel, delayed scaling, a 16-bit x without a
    residual; engine/csrc/normalization/norm_fwd_band.cuh) runs as ``n`` says: ``1`` never (the
    register path's tile or the tiled transpose after the norm, as before it); ``2`` to ``4`` one
    configuration at every width whose cluster of at most 16 CTAs fits: ``2`` bands of 32 rows x
    512 columns per CTA whose FP8 tiles have shared memory of their own (one CTA per SM; rows of up
    to 8192), ``3`` the same with the tile written over its band's stage (two CTAs per SM), ``4``
    32 x 1024 with the tile in the stage (one CTA per SM; up to 16384); ``0`` (the default) the
    launcher's choice (from 1025 columns;
    benchmarks/NOTES.md P104, P117). It
    applies only where the transposed copy is asked of the norm kernel (``data_t`` passed to
    :func:`norm_fwd`; ``ENGINE_NORM_EXTERNAL_TRANSPOSE`` and ``engine._norm_ops.external_transpose``
    decide). For tests and A/B benchmarks. Process-wide, not thread-safe; restores the previous
    value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in range(5):
        raise ValueError(f"norm_fwd_band: n must be an int in 0..4, got {n!r}")
    return _knob("set_norm_fwd_band", n)


def fp8_transpose_order(n: int):
    """Context manager: inside the ``with`` block the tiled FP8 transpose (:func:`fp8_transpose`,
    and the transposed copy made after a norm's rowwise FP8 output) walks its tiles as ``n`` says:
    ``1`` from the first rows to the last, ``2`` from the last rows to the first with streaming
    stores of the transposed copy (it reads first what a norm wrote last, the likeliest still in
    L2; benchmarks/NOTES.md P114), ``0`` (the default) the launcher's choice: ``1`` on CUDA (the
    reverse order measured -1.5 to +2 points on the H100's + T rows), while Triton's twin
    (``engine.triton_kernels.transpose.FP8_TRANSPOSE_ORDER``) takes ``2`` by default. The bytes
    are the same either way. For tests and A/B benchmarks. Process-wide, not thread-safe; restores the previous
    value on exit. A bad ``n`` raises ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2):
        raise ValueError(f"fp8_transpose_order: n must be 0, 1 or 2, got {n!r}")
    return _knob("set_fp8_transpose_order", n)


def dram_class(n: int):
    """Context manager: inside the ``with`` block the CUDA launchers take the launch defaults of
    card class ``n`` where the two cards measured apart (benchmarks/NOTES.md P109): ``1`` a card of
    lean DRAM bandwidth per SM (under 30 GB/s per SM: the H100 SXM, 25), ``2`` a wide one (the
    H200, 37), ``0`` (the default) the current device's class from its peak DRAM bandwidth. The
    lean card's defaults: the band kernel's layout with tiles of their own (``norm_fwd_band(2)``'s
    layout; a wide card takes ``3``'s) and its configuration of 1024 columns per CTA
    (``norm_fwd_band(4)``'s) for the FP8 + transposed rows of RMSNorm at 8K-16K and LayerNorm at
    1K-16K (a wide card takes the tiled transpose there unless asked in-kernel; NOTES P117), from
    64K the streamed forward's CTA of a 16-CTA
    cluster (128 threads at 64K, 256 at 128K; every output dtype alike), and session 30's kernel
    choices for FP8 outputs without a residual: RMSNorm's rows of 4K-16K on the blocked kernel,
    LayerNorm's on the register path up to 32K (a wide card keeps RMSNorm's on the register path
    below 16K and streams LayerNorm's from 8K; NOTES P116), the clusters for an FP8 output in
    delayed scaling without a transposed copy at RMSNorm 16K-32K and LayerNorm 32K (a wide card
    streams them; NOTES P133), and the streamed kernel for LayerNorm's 16-bit rows of 32K without
    a residual (a wide card takes the clusters there; NOTES P131). The Triton kernels' twin
    is ``engine.triton_kernels.utils.DRAM_CLASS``. For A/B benchmarks of the two sets on one GPU.
    Process-wide, not thread-safe; restores the previous value on exit. A bad ``n`` raises
    ValueError at the call."""
    if type(n) is not int or n not in (0, 1, 2):
        raise ValueError(f"dram_class: n must be 0, 1 or 2, got {n!r}")
    return _knob("set_dram_class", n)


def device_dram_class() -> int:
    """The card class (1 lean, 2 wide; :func:`dram_class`) the current CUDA device's launches take
    now: the :func:`dram_class` block's value inside one, else the device's own."""
    return int((_ext or _ext_or_load()).dram_class())


def norm_bwd_stream_threads(n: int):
    """Context manager: inside the ``with`` block the CUDA backward's streamed kernel (above) runs
    CTAs of at most ``n`` threads (128, 256 or 512): its cluster is the smallest power of two
    whose CTAs of at most ``n`` threads hold the row at 16 values per thread, so a smaller ``n``
    means a larger cluster of smaller CTAs. ``n = 0``, the default, is 512. For tests and A/B
    benchmarks. Process-wide, not thread-safe; restores the previous value on exit. A bad ``n``
    raises ValueError at the call."""
    if type(n) is not int or n not in (0, 128, 256, 512):
        raise ValueError(f"norm_bwd_stream_threads: n must be 0, 128, 256 or 512, got {n!r}")
    return _knob("set_norm_bwd_stream_threads", n)
