"""Host microseconds per engine call: the Python between the user's call and the kernels.

    TRITON_INTERPRET=1 python ci/host_overhead.py [--min-loop-ms 50] [--repeats 5]   # CPU machine
    python ci/host_overhead.py --backends triton cuda                          # GPU machine
    python ci/host_overhead.py --backends cuda cuda-pyalloc --rounds 5 --device-time   # an A/B

On a CPU-only machine (``TRITON_INTERPRET=1``) every Triton ``Launcher`` of engine takes its fast
path (cache hit, then the compiled kernel's ``run``) with a stand-in compiled kernel whose ``run``
does nothing and a stand-in driver, so what is timed is all of engine's Python up to the launch:
input checks, allocations, plans, autograd, the launcher's key. The C launch (~7-11 us on the
H200 hosts: ``h200_launch_overhead.log``) and the CUDA caching allocator's cost over the CPU one
come on top on a GPU. On a GPU machine the cases run for real on small CUDA tensors (kernels of a
few us, so the host sets the pace), per backend. Each line is ``benchmarks.harness.host_loop_us``:
the median of ``--repeats`` loops of calls issued back to back for ``--min-loop-ms`` each
(synchronised at both ends on a GPU); ``F.rms_norm`` /
``F.layer_norm`` on the same tensors are a yardstick of the host's speed.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


class _Driver:
    """Stands in for ``triton.runtime.driver.active``: device 0, stream 0."""

    @staticmethod
    def get_current_device():
        return 0

    @staticmethod
    def get_current_stream(device):
        return 0


class _Compiled:
    """Stands in for a compiled kernel: ``run`` takes the launch's arguments and does nothing."""

    function = None
    packed_metadata = None

    def run(self, *args):
        return None


def stub_launchers():
    """Make every Launcher of engine's Triton kernels take its fast path with a no-op kernel."""
    from engine.triton_kernels import launch, norms, norms_common, transpose

    launchers = [v for mod in (norms, norms_common, transpose) for v in vars(mod).values()
                 if isinstance(v, launch.Launcher)]
    for la in launchers:
        la._interpreted = False
        la._driver = _Driver()
        la._slow = lambda *a, **k: _Compiled()
    return launchers


def cases(m: int, n: int, device: str = "cpu"):
    import torch
    import torch.nn.functional as F

    import engine
    from engine.fp8 import Float8Quantizer

    torch.manual_seed(0)
    kw = {"dtype": torch.bfloat16, "device": device}
    x = torch.randn(m, n, **kw)
    w = torch.randn(n, **kw)
    b = torch.randn(n, **kw)
    r = torch.randn(m, n, **kw)
    xg = x.clone().requires_grad_(True)
    wg = w.clone().requires_grad_(True)
    bg = b.clone().requires_grad_(True)
    dy = torch.randn(m, n, **kw)
    one, zero = torch.ones(1, device=device), torch.zeros(1, device=device)
    q = Float8Quantizer(one, zero, torch.float8_e4m3fn)
    qt = Float8Quantizer(one.clone(), zero.clone(), torch.float8_e4m3fn, columnwise=True)

    def nograd(f):
        def g():
            with torch.no_grad():
                return f()
        return g

    return [
        ("F.rms_norm fwd (yardstick)", nograd(lambda: F.rms_norm(x, (n,), w, 1e-6))),
        ("F.layer_norm fwd (yardstick)", nograd(lambda: F.layer_norm(x, (n,), w, b, 1e-5))),
        ("rmsnorm fwd, no grad", nograd(lambda: engine.rmsnorm(x, w))),
        ("layernorm fwd, no grad", nograd(lambda: engine.layernorm(x, w, b))),
        ("rmsnorm +residual fwd, no grad", nograd(lambda: engine.rmsnorm(x, w, residual=r))),
        ("rmsnorm fwd (grad enabled)", lambda: engine.rmsnorm(xg, wg)),
        ("rmsnorm fwd+bwd", lambda: torch.autograd.grad(engine.rmsnorm(xg, wg), (xg, wg), dy)),
        ("layernorm fwd+bwd", lambda: torch.autograd.grad(engine.layernorm(xg, wg, bg), (xg, wg, bg), dy)),
        ("rmsnorm e4m3 delayed", nograd(lambda: engine.rmsnorm(x, w, quantizer=q))),
        ("layernorm e4m3 delayed + T", nograd(lambda: engine.layernorm(x, w, b, quantizer=qt))),
        ("cast_transpose e4m3", nograd(lambda: engine.cast_transpose(x, qt))),
    ]


_FLAGS = ("ENGINE_USE_RMSNORM_TRITON", "ENGINE_USE_LAYERNORM_TRITON", "ENGINE_USE_CAST_TRANSPOSE_TRITON")


@contextlib.contextmanager
def python_alloc():
    """The CUDA backend as before its allocating entries (``norm_fwd_alloc``, ``norm_bwd_alloc``,
    ``norm_fwd_fp8_alloc``, ``cast_transpose_alloc``): the outputs come from torch.empty in Python
    (``engine._norm_ops`` and ``engine.transpose`` take that path where the backend has no such
    entry). For A/B runs of the host path in one process."""
    from engine import cuda_backend

    names = ("norm_fwd_alloc", "norm_bwd_alloc", "norm_fwd_fp8_alloc", "cast_transpose_alloc")
    saved = {name: getattr(cuda_backend, name) for name in names}
    for name in names:
        delattr(cuda_backend, name)
    try:
        yield
    finally:
        for name, fn in saved.items():
            setattr(cuda_backend, name, fn)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--m", type=int, default=32)
    ap.add_argument("--n", type=int, default=4096)
    ap.add_argument("--min-loop-ms", type=float, default=50.0,
                    help="each timed loop issues calls back to back for about this long")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--backends", nargs="*", default=["triton"], choices=["triton", "cuda", "cuda-pyalloc"],
                    help="on a GPU machine: the backends to time (cuda needs the built extension; "
                         "cuda-pyalloc: the CUDA backend with its outputs allocated in Python, python_alloc)")
    ap.add_argument("--rounds", type=int, default=1,
                    help="time the backends in turn this many times (the hosts' speed moves between "
                         "seconds: compare backends within a round)")
    ap.add_argument("--device-time", action="store_true",
                    help="on a GPU machine: also the device time of the kernels of one call, per backend")
    args = ap.parse_args(argv)
    import torch

    from benchmarks.harness import host_loop_us
    from engine import backend

    gpu = torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET", "0") in ("", "0")
    if not gpu:
        if os.environ.get("TRITON_INTERPRET") != "1":
            print("host_overhead: no GPU; set TRITON_INTERPRET=1 (the Triton backend serves CPU tensors only there)")
            return 2
        stub_launchers()
        args.backends = ["triton"]
        args.device_time = False
    where = (f"{torch.cuda.get_device_name()}, real launches" if gpu else "CPU, kernel launches stubbed")
    print(f"# host us per call, median of {args.repeats} loops of ~{args.min_loop_ms:g} ms, [{args.m}, {args.n}] bf16, "
          f"{where}; {args.rounds} round(s) of {' '.join(args.backends)}")
    table: dict = {}
    dev: dict = {}

    def use(be):
        env = dict(os.environ)
        env.update({f: "1" if be == "triton" else "0" for f in _FLAGS})
        backend.reset_for_tests(env)
        return python_alloc() if be == "cuda-pyalloc" else contextlib.nullcontext()

    # Each case in turn, its backends alternated round by round: the A/B of a case is seconds
    # apart, where the hosts' speed moves by up to 1.8x (benchmarks/NOTES.md Q30).
    for name, fn in cases(args.m, args.n, "cuda" if gpu else "cpu"):
        bes = args.backends[:1] if "yardstick" in name else args.backends
        for _ in range(args.rounds):
            for be in bes:
                with use(be):
                    us = host_loop_us(fn, min_loop_ms=args.min_loop_ms, repeats=args.repeats, warmup=50)
                    table.setdefault(name, {}).setdefault(be, []).append(us)
                    if args.device_time and name not in dev.get(be, {}):
                        from benchmarks.profile_kernels import device_us_per_call

                        dev.setdefault(be, {})[name] = device_us_per_call(fn)
    backend.reset_for_tests()
    for be in args.backends:
        print(f"## backend {be}" + ("; device us per call in [ ]" if be in dev else ""))
        for name, row in table.items():
            if be in row:
                cell = " ".join(f"{us:8.2f}" for us in row[be])
                d = f"  [{dev[be][name]:.2f}]" if name in dev.get(be, {}) else ""
                print(f"{name:34s} {cell}{d}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
