"""Q75 (benchmarks/NOTES.md): the norm -> FP8 lab kernels of ``ci/fp8_lab.cu`` beside engine's CUDA and
Triton FP8 forwards, in the tables' measure (profile_kernels: summed kernel time per call, the median of
15 calls; % of the copy bandwidth of ``benchmarks/harness.copy_bandwidth`` at the minimum bytes of
``harness.bytes_norm_fp8``), bf16 x, e4m3 out with delayed scaling, M * N = 64M, one process.

    nvcc -O3 -std=c++17 -arch=sm_90 -shared -Xcompiler -fPIC -o /tmp/fp8_lab.so ci/fp8_lab.cu
    PYTHONPATH=$PWD python3 ci/fp8_lab.py --so /tmp/fp8_lab.so [--n 4096 8192 16384] [--norms rms ln]
        [--engine-so /tmp/fp8_lab_engine.so] [--impls triton cuda]

``--engine-so``: engine's lean FP8 kernel built stand-alone (ci/fp8_lab_engine.cu, Q75c), timed and
checked like the lab's kernels at 4 vectors per thread (its only layout since P181). An A/B of two
trees builds this tree's ci/fp8_lab_engine.cu twice, the older header first on the include path
(-I/tmp/old), so that both builds share this launcher. ``--impls``: engine's own forwards timed
beside them (cuda needs the built extension; without it the first call JIT-compiles it).

Every lab launch is checked: its bytes against a float64 norm cast to e4m3 (saturating; bytes that
differ must be one e4m3 step apart: a rounding boundary of the fp32 arithmetic), its amax against the
float64 max |y|. A lab variant that fails its check is printed with FAIL, and the exit status is 1.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import harness as H  # noqa: E402
from benchmarks.profile_kernels import device_us_per_call  # noqa: E402

SCALE = 32.0
EPS = 1e-5


def reference(ln: bool, x: torch.Tensor, g: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """float64 y (before the scale)"""
    xd = x.double()
    if ln:
        mean = xd.mean(-1, keepdim=True)
        var = (xd - mean).pow(2).mean(-1, keepdim=True)
        return (xd - mean) * torch.rsqrt(var + EPS) * g.double() + b.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + EPS) * g.double()


def e4m3_step(v: torch.Tensor) -> torch.Tensor:
    """The e4m3 step at |v| (2^-9 below the normal range, 2^(e - 3) above)."""
    e = torch.floor(torch.log2(v.abs().clamp_min(2.0 ** -6)))
    return torch.exp2(e - 3)


def check(y8: torch.Tensor, amax: float, ref: torch.Tensor) -> tuple[bool, str]:
    q_ref = (ref * SCALE).clamp(-448.0, 448.0).float().to(torch.float8_e4m3fn)
    differ = y8.view(torch.uint8) != q_ref.view(torch.uint8)
    nd = int(differ.sum())
    worst = 0.0
    if nd:
        a, b = y8.float()[differ], q_ref.float()[differ]
        worst = float(((a - b).abs() / e4m3_step(b)).max())
    amax_ref = float(ref.abs().max())
    amax_rel = abs(amax - amax_ref) / amax_ref
    ok = worst <= 1.0 and amax_rel < 1e-5 and not torch.isnan(y8.float()).any()
    return ok, f"{nd} bytes off (worst {worst:.1f} steps), amax rel {amax_rel:.1e}"


def lab_inputs(n: int):
    """(m, x, gb) of a width: m = 64M / n bf16 rows of N(0, 1), seeded by n; gb = gamma in
    [0.5, 1.5) then beta of N(0, 0.2^2), bf16 (also ci/lean_lab.py's)."""
    m = (64 << 20) // n
    torch.manual_seed(n)
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    gb = torch.cat([torch.rand(n, device="cuda") + 0.5, torch.randn(n, device="cuda") * 0.2]).to(torch.bfloat16)
    return m, x, gb


def copy_header() -> float:
    """The copy bandwidth of this process (GB/s), printed as the log's first line."""
    copy = H.copy_bandwidth()["gbps"]
    print(f"{torch.cuda.get_device_name()}: copy bandwidth {copy:.0f} GB/s; kernel time, % of copy")
    return copy


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--so", required=True, help="the library built from ci/fp8_lab.cu")
    ap.add_argument("--n", type=int, nargs="*", default=[4096, 8192, 16384])
    ap.add_argument("--norms", nargs="*", default=["ln", "rms"], choices=["rms", "ln"])
    ap.add_argument("--configs", type=int, nargs="*", help="lab config ids (default: all)")
    ap.add_argument("--per-sm", type=int, nargs="*", default=[0],
                    help="CTAs per SM of the lab grids (0: the resident CTAs)")
    ap.add_argument("--reps", type=int, default=2, help="alternations of the whole set per (N, norm)")
    ap.add_argument("--engine-so", nargs="*", default=[],
                    help="ci/fp8_lab_engine.cu built (engine's lean FP8 kernel stand-alone), one or more builds "
                         "(e.g. of two trees' headers: an A/B in one process), labelled by file name")
    ap.add_argument("--impls", nargs="*", default=["triton"], choices=["cuda", "triton"],
                    help="engine's forwards timed beside the lab (default: triton)")
    args = ap.parse_args(argv)
    if not H.on_gpu():
        print("fp8_lab: needs a GPU")
        return 0
    import engine
    from engine.fp8 import Float8Quantizer

    lib = ctypes.CDLL(os.path.abspath(args.so))
    lib.fp8_lab_launch.restype = ctypes.c_longlong
    lib.fp8_lab_launch.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_longlong] + [ctypes.c_void_p] * 5 + [
        ctypes.c_longlong, ctypes.c_int, ctypes.c_float, ctypes.c_void_p, ctypes.POINTER(ctypes.c_int)]
    engs = []
    for path in args.engine_so:
        eng = ctypes.CDLL(os.path.abspath(path))
        eng.fp8_engine_launch.restype = ctypes.c_longlong
        eng.fp8_engine_launch.argtypes = [ctypes.c_int] + [ctypes.c_void_p] * 8 + [
            ctypes.c_longlong, ctypes.c_int, ctypes.c_void_p]
        engs.append((Path(path).stem, eng))
    ncfg = lib.fp8_lab_num_configs()
    names = []
    for i in range(ncfg):
        buf = ctypes.create_string_buffer(96)
        lib.fp8_lab_describe(i, buf, 96)
        names.append(buf.value.decode())
    copy = copy_header()
    failed = 0
    stream = ctypes.c_void_p(torch.cuda.current_stream().cuda_stream)
    for n in args.n:
        m, x, gb = lab_inputs(n)
        g, b = gb[:n], gb[n:]
        y8 = torch.empty(m, n, device="cuda", dtype=torch.float8_e4m3fn)
        amax = torch.zeros(1, device="cuda")
        stats = torch.empty(2 * m, device="cuda")  # rsigma, then mu (engine's kernel; the lab's ENG & 4)
        for kind in args.norms:
            ln = kind == "ln"
            nbytes = H.bytes_norm_fp8(m, n, bias=ln)
            ref = reference(ln, x, g, b)

            def pct(us: float) -> float:
                return 100.0 * nbytes / (us * 1e3) / copy

            def run(launch, label: str, check_it: bool, extra: str = "") -> int:
                """One variant: poisoned output, a launch (grid < 0: not run), the bytes and amax
                checked (``check_it``), timed; prints a row; returns the grid, -1 if it failed."""
                nonlocal failed
                y8.view(torch.uint8).fill_(0x7F)  # e4m3 NaN: every byte must be written
                amax.zero_()
                grid = launch()
                if grid < 0:
                    return grid
                torch.cuda.synchronize()
                ok, msg = check(y8, float(amax), ref) if check_it else (True, "")
                failed += not ok
                us = device_us_per_call(launch)
                print(f"{label} grid {grid:5d}{extra} {us:8.2f} us {pct(us):6.1f} %"
                      f"{'  ' + msg if msg else ''}{'  FAIL' if not ok else ''}")
                return grid

            for rep in range(args.reps):
                for impl in args.impls:
                    flag = "1" if impl == "triton" else "0"
                    try:
                        engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": flag,
                                                        "ENGINE_USE_LAYERNORM_TRITON": flag})
                        q = Float8Quantizer(torch.full((1,), SCALE, device="cuda"), torch.zeros(1, device="cuda"),
                                            torch.float8_e4m3fn)
                        fn = ((lambda: engine.layernorm(x, g, b, EPS, quantizer=q)) if ln
                              else (lambda: engine.rmsnorm(x, g, EPS, quantizer=q)))
                        fn()
                        us = device_us_per_call(fn)
                        print(f"N={n:6d} {kind:3s} rep {rep} engine {impl:6s} {us:8.2f} us {pct(us):6.1f} %")
                    except Exception as e:  # e.g. no CUDA extension built: the lab rows still run
                        print(f"N={n:6d} {kind:3s} rep {rep} engine {impl:6s} unavailable: {H.short_error(e)}")
                engine.backend.reset_for_tests()
                for tag, eng in engs:
                    sc, sinv = torch.full((1,), SCALE, device="cuda"), torch.empty(1, device="cuda")

                    def launch_engine():
                        return eng.fp8_engine_launch(int(ln), x.data_ptr(), gb.data_ptr(), y8.data_ptr(),
                                                     stats[m:].data_ptr(), stats[:m].data_ptr(), sc.data_ptr(),
                                                     amax.data_ptr(), sinv.data_ptr(), m, n, stream)

                    label = "engine-lean" if len(engs) == 1 else f"engine-lean {tag}"
                    run(launch_engine, f"N={n:6d} {kind:3s} rep {rep} {label} nv 4", rep == 0)
                for cid in (args.configs if args.configs is not None else range(ncfg)):
                    for per_sm in args.per_sm:
                        regs = ctypes.c_int(0)

                        def launch():
                            return lib.fp8_lab_launch(cid, int(ln), per_sm, x.data_ptr(), gb.data_ptr(),
                                                      y8.data_ptr(), amax.data_ptr(), stats.data_ptr(), m, n, SCALE,
                                                      stream, ctypes.byref(regs))

                        label = f"N={n:6d} {kind:3s} rep {rep} lab {cid:2d} {names[cid]} per_sm {per_sm}"
                        grid = run(launch, label, rep == 0, extra=f" {regs.value:3d} regs")
                        if grid < 0:
                            if rep == 0 and per_sm == args.per_sm[0]:
                                print(f"{label}: {'does not fit' if grid == -1 else 'launch error'}")
                            break
            ref = None  # frees the float64 reference before the next width
    print(f"fp8_lab: {failed} failed checks")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
