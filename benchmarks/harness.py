"""Shared benchmark machinery: timing, the copy-bandwidth ceiling, byte counts, backend switching.

Method (shared PERF.md): the ops are memory-bound, so each is reported as GB/s over the fewest bytes
it must move (every input read once, every output written once) and as % of the device-to-device
copy bandwidth measured in the same process. Large shapes are timed on the device with
``triton.testing.do_bench`` (median, L2 flushed before each call); small shapes by a host loop
around N calls with a synchronize at each end, which is what a training step pays (host + device).

Everything also runs on CPU tensors (``--dry-run``), timed with ``time.perf_counter``, so the code
paths can be checked on a machine without a GPU; those numbers mean nothing.
"""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable, Dict, Iterable, List, Mapping, Optional, Sequence

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:  # `python benchmarks/run.py` puts benchmarks/, not the repo, on the path
    sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

import engine  # noqa: E402
from engine.backend import Backend, OpFamily  # noqa: E402

KI = 1024
#: Elements per large-shape input: 64M bf16 = 128 MB, twice the largest L2 of the H100/H200 class.
LARGE_ELEMENTS = 64 * KI * KI
#: The hidden sizes of the sweep, 1K .. 128K.
SWEEP_N = tuple(KI << i for i in range(8))
QUICK_N = (1 * KI, 8 * KI, 64 * KI)
#: (M, N) of the small-shape rows (host + device time per call).
SMALL_SHAPES = ((32, 4096), (256, 8192))

ENGINE_FAMILIES = (OpFamily.RMSNORM, OpFamily.LAYERNORM, OpFamily.CAST_TRANSPOSE)
_ENGINE_FLAGS = {
    OpFamily.RMSNORM: "ENGINE_USE_RMSNORM_TRITON",
    OpFamily.LAYERNORM: "ENGINE_USE_LAYERNORM_TRITON",
    OpFamily.CAST_TRANSPOSE: "ENGINE_USE_CAST_TRANSPOSE_TRITON",
}


# --- device ---------------------------------------------------------------------------------------

def on_gpu() -> bool:
    return torch.cuda.is_available()


def device() -> torch.device:
    return torch.device("cuda") if on_gpu() else torch.device("cpu")


def sync() -> None:
    if on_gpu():
        torch.cuda.synchronize()


def free_memory() -> None:
    """Return cached blocks between shapes so the sweep never holds more than one shape's tensors."""
    import gc

    gc.collect()
    if on_gpu():
        torch.cuda.synchronize()
        torch.cuda.empty_cache()


def large_shape(n: int, elements: int = LARGE_ELEMENTS) -> tuple:
    """(M, N) with M * N = ``elements`` (M >= 1)."""
    return max(1, elements // n), n


# --- timing ---------------------------------------------------------------------------------------

def bench(fn: Callable[[], object], *, warmup_ms: float = 10, rep_ms: float = 50) -> float:
    """Median time of one call of ``fn`` in milliseconds.

    GPU: ``triton.testing.do_bench`` (CUDA events around each call, L2 flushed before each; the
    arguments are milliseconds of warm-up and of repetition; the keyword names are the same in
    triton 3.6 and 3.9). CPU (dry runs): perf_counter around single calls.
    """
    if on_gpu():
        import triton.testing

        return float(triton.testing.do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median"))
    fn()
    times: List[float] = []
    deadline = time.perf_counter() + rep_ms / 1e3
    while not times or (time.perf_counter() < deadline and len(times) < 1000):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_graph(fn: Callable[[], object], *, warmup_ms: float = 10, rep_ms: float = 50) -> Optional[float]:
    """Median time in milliseconds of one replay of ``fn`` captured as a CUDA graph (``bench`` of
    ``graph.replay``: L2 flushed before each replay), or None where ``fn`` cannot be captured (CPU,
    or a capture error). The host's per-launch cost leaves the measure; the kernels, their gaps on
    the GPU and the launches the graph still makes stay in it. ``fn`` runs three times on a side
    stream first (allocator warm-up, lazy initialisation), as torch.cuda.graphs asks."""
    if not on_gpu():
        return None
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            fn()
    except Exception:  # noqa: BLE001 - not capturable: no graph measure for this row
        torch.cuda.synchronize()
        return None
    return bench(graph.replay, warmup_ms=warmup_ms, rep_ms=rep_ms)


def host_loop_us(fn: Callable[[], object], *, min_loop_ms: float = 20, repeats: int = 5,
                 warmup: int = 10) -> float:
    """Microseconds per call of ``fn`` issued back to back, host and device together.

    ``repeats`` loops of ``n`` calls, each bracketed by a device synchronize, no CUDA graph; ``n`` is
    sized so that a loop lasts about ``min_loop_ms``. The median loop's time over ``n``: launch-bound
    ops measure their host cost, device-bound ones their device time.
    """
    for _ in range(warmup):
        fn()
    sync()
    t0 = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - t0, 1e-6)
    n = int(max(10, min(100_000, (min_loop_ms / 1e3) / one)))
    per_call = []
    for _ in range(repeats):
        sync()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        sync()
        per_call.append((time.perf_counter() - t0) / n * 1e6)
    return statistics.median(per_call)


def copy_bandwidth(nbytes: Optional[int] = None) -> Dict[str, float]:
    """The memory ceiling: a device-to-device copy of a large buffer, counting bytes read + written.

    1 GiB on the GPU (far past any L2), 64 MiB on CPU. Returns ``{"gbps", "ms", "bytes"}``.
    """
    if nbytes is None:
        nbytes = (1 << 30) if on_gpu() else (64 << 20)
    ms = _time_copy(nbytes)
    free_memory()
    return {"gbps": gbps(2 * nbytes, ms), "ms": ms, "bytes": 2 * nbytes}


def _time_copy(nbytes: int) -> float:
    """Best of two medians of ``dst.copy_(src)`` over ``nbytes``-byte buffers, in ms."""
    src = torch.randint(0, 255, (nbytes,), dtype=torch.uint8, device=device())
    dst = torch.empty_like(src)
    return min(bench(lambda: dst.copy_(src), warmup_ms=25, rep_ms=100) for _ in range(2))


def gbps(nbytes: int, ms: float) -> float:
    return nbytes / (ms * 1e-3) / 1e9


# --- minimum bytes per op (shared PERF.md) --------------------------------------------------------
# x, y, dy, dx, residual: M*N elements; weight/bias: N. `e` arguments are element sizes in bytes.

def bytes_norm_fwd(m: int, n: int, *, x: int = 2, out: int = 2, w: int = 2, bias: bool = False,
                   residual: Optional[int] = None) -> int:
    """Forward: read x, write y, read weight (and bias). ``residual=e``: also read the residual and
    write residual_out, each of ``e`` bytes per element. RMSNorm bf16: 2*M*N*2 + N*2."""
    b = m * n * (x + out) + n * w * (2 if bias else 1)
    if residual is not None:
        b += 2 * m * n * residual
    return b


def bytes_norm_bwd(m: int, n: int, *, x: int = 2, w: int = 2, bias: bool = False) -> int:
    """Backward alone: read x and dy, write dx (3*M*N*e), read weight, write dweight (and dbias)."""
    return 3 * m * n * x + 2 * n * w + (n * w if bias else 0)


def bytes_norm_fwd_bwd(m: int, n: int, *, x: int = 2, w: int = 2, bias: bool = False) -> int:
    """Forward + backward: 5*M*N*e (x twice, y, dy, dx) + weight twice, dweight (+ bias, dbias)."""
    return 5 * m * n * x + 3 * n * w + (2 * n * w if bias else 0)


def bytes_norm_fp8(m: int, n: int, *, x: int = 2, w: int = 2, bias: bool = False,
                   transposed: bool = False) -> int:
    """Norm -> FP8: read x (e), write 1-byte data (+ 1-byte transposed copy), read weight (bias)."""
    return m * n * (x + 1 + (1 if transposed else 0)) + n * w * (2 if bias else 1)


def bytes_cast_transpose(m: int, n: int, *, x: int = 2, rowwise: bool = True,
                         columnwise: bool = True) -> int:
    """FP8 cast (+ transpose): read x, write rowwise and/or transposed 1-byte data."""
    return m * n * (x + int(rowwise) + int(columnwise))


# --- backend switching ----------------------------------------------------------------------------

def expected_backend(name: str, dev: torch.device) -> Backend:
    """What ``name`` ("cuda" / "triton") resolves to on ``dev``: itself on CUDA; on CPU the
    reference path, or the Triton interpreter for "triton" under TRITON_INTERPRET=1."""
    if dev.type == "cuda":
        return Backend(name)
    interp = os.environ.get("TRITON_INTERPRET", "") == "1"
    return Backend.TRITON if (name == "triton" and interp) else Backend.REFERENCE


def use_backend(name: str, *, external_transpose: Optional[bool] = None,
                families: Iterable[OpFamily] = ENGINE_FAMILIES) -> Backend:
    """Point engine's op families at backend ``name`` ("cuda" or "triton") inside this process.

    Flags are frozen per process, so this rebuilds the settings from ``os.environ`` with the
    family flags (and ``ENGINE_NORM_EXTERNAL_TRANSPOSE`` when given) overridden, via
    ``engine.backend.reset_for_tests``, then checks that ``families`` really resolve to it. Raises
    (e.g. ``BackendUnavailableError``) when the backend cannot run; returns the resolved backend.
    """
    if name not in ("cuda", "triton"):
        raise ValueError(f"backend must be 'cuda' or 'triton', got {name!r}")
    env = dict(os.environ)
    for flag in _ENGINE_FLAGS.values():
        env[flag] = "1" if name == "triton" else "0"
    if external_transpose is not None:
        env["ENGINE_NORM_EXTERNAL_TRANSPOSE"] = "1" if external_transpose else "0"
    engine.backend.reset_for_tests(env)
    dev = device()
    want = expected_backend(name, dev)
    for fam in families:
        got = engine.backend.select_backend(fam, dev)
        if got is not want:
            raise RuntimeError(f"{fam.value} resolved to {got.value}, wanted {want.value}")
    if external_transpose is not None:
        assert engine.backend.settings().norm_external_transpose == external_transpose
    return want


def reset_backend() -> None:
    """Back to the process environment's selection."""
    engine.backend.reset_for_tests()


# --- environment, results -------------------------------------------------------------------------

def _git_commit() -> str:
    """Short HEAD (+dirty); ``ENGINE_COMMIT`` overrides it (the device machine's copy of the tree
    may carry a stale .git: pass the commit from the checkout that sent it)."""
    if os.environ.get("ENGINE_COMMIT"):
        return os.environ["ENGINE_COMMIT"]
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                              text=True, timeout=10).stdout.strip()
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT,
                               capture_output=True, text=True, timeout=10).stdout.strip()
        return head + ("+dirty" if dirty else "") if head else "unknown"
    except Exception:  # no git on the device machine is fine
        return "unknown"


def environment() -> Dict[str, object]:
    """Device, library versions and the engine commit, for the JSON header."""
    import triton

    meta: Dict[str, object] = {
        "device": (torch.cuda.get_device_name() if on_gpu()
                   else f"cpu ({platform.processor() or platform.machine()})"),
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": torch.version.cuda,
        "python": platform.python_version(),
        "engine_commit": _git_commit(),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "argv": sys.argv,
        "triton_interpret": os.environ.get("TRITON_INTERPRET", ""),
    }
    if on_gpu():
        p = torch.cuda.get_device_properties(torch.cuda.current_device())
        meta["sm_count"] = p.multi_processor_count
        meta["memory_gib"] = round(p.total_memory / 2**30, 1)
        meta["l2_mb"] = round(getattr(p, "L2_cache_size", 0) / 1e6, 1)
    try:
        import importlib.metadata as md

        meta["liger_kernel"] = md.version("liger-kernel")
    except Exception:
        meta["liger_kernel"] = None
    return meta


class Results:
    """Rows plus a header, rewritten to ``path`` after every ``save`` (atomic replace), so a run cut
    off by a time limit still leaves every row measured before the cut."""

    def __init__(self, path: Optional[Path], meta: Dict[str, object]) -> None:
        self.path = Path(path) if path else None
        self.meta = meta
        self.rows: List[Dict[str, object]] = []

    def add(self, row: Dict[str, object]) -> None:
        self.rows.append(row)

    def save(self) -> None:
        if self.path is not None:
            write_json(self.path, {"meta": self.meta, "rows": self.rows})


def write_json(path: Path, obj: object) -> None:
    """Write ``obj`` to ``path`` through a temporary file and a rename (never a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=1, default=str))
    os.replace(tmp, path)


def short_error(e: BaseException, limit: int = 160) -> str:
    s = f"{type(e).__name__}: {e}".replace("\n", " ")
    return s if len(s) <= limit else s[: limit - 3] + "..."


def fmt_n(n: int) -> str:
    return f"{n // KI}K" if n % KI == 0 else str(n)


def pivot(rows: Sequence[Mapping[str, object]], key_cols: Sequence[str], col: str, value: Callable,
          col_order: Sequence[str]) -> tuple:
    """(headers, table) with one line per distinct ``key_cols`` tuple and one column per ``col`` value.

    ``value(row)`` gives the cell. Keys keep their first-seen order; columns follow ``col_order``,
    then any others in first-seen order; columns with no cell at all are dropped.
    """
    keys: Dict[tuple, Dict[str, str]] = {}
    seen: List[str] = []
    for r in rows:
        k = tuple(r[c] for c in key_cols)
        keys.setdefault(k, {})[str(r[col])] = value(r)
        if r[col] not in seen:
            seen.append(str(r[col]))
    cols = [c for c in col_order if c in seen] + [c for c in seen if c not in col_order]
    table = [list(k) + [cells.get(c, "") for c in cols] for k, cells in keys.items()]
    return list(key_cols) + cols, table
