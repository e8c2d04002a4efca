"""Where does the host time of a small norm call go? (run by hand on the device machine)

Prints µs per call (host loop, synchronize at both ends) of: the public call on each backend,
F.rms_norm, the raw Triton ``kernel[grid](...)`` launch with the same arguments, the compiled
kernel's launcher called directly (``CompiledKernel.run``: the floor for any Triton launch path),
and the torch pieces the wrapper uses (empty, current stream).
"""

import time

import torch
import torch.nn.functional as F

import engine
from engine.triton_kernels import norms as nm


def per_call_us(fn, n=2000):
    for _ in range(50):
        fn()
    torch.cuda.synchronize()
    best = float("inf")
    for _ in range(5):
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        torch.cuda.synchronize()
        best = min(best, (time.perf_counter() - t0) / n * 1e6)
    return best


def main():
    m, n = 32, 4096
    x = torch.randn(m, n, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, device="cuda", dtype=torch.bfloat16)
    rows = {}
    for backend in ("cuda", "triton"):
        engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1" if backend == "triton" else "0"})
        try:
            engine.rmsnorm(x, w)
        except engine.backend.BackendUnavailableError as e:  # the CUDA extension is not built
            print(f"engine.rmsnorm ({backend}): {e}")
            continue
        rows[f"engine.rmsnorm ({backend})"] = per_call_us(lambda: engine.rmsnorm(x, w))
        with torch.no_grad():
            rows[f"engine.rmsnorm no_grad ({backend})"] = per_call_us(lambda: engine.rmsnorm(x, w))
    rows["F.rms_norm"] = per_call_us(lambda: F.rms_norm(x, (n,), w, 1e-6))

    # Capture the Triton launch the public call makes, then replay it three ways.
    captured = {}
    real = nm._FWD

    def spy(grid, tensors, scalars, num_warps, num_stages, constexprs):
        captured.update(grid=grid, tensors=tensors, scalars=scalars, nw=num_warps, ns=num_stages,
                        c=dict(zip(real._constexpr_names, constexprs)))
        type(real).launch(real, grid, tensors, scalars, num_warps, num_stages, constexprs)

    engine.backend.reset_for_tests({"ENGINE_USE_RMSNORM_TRITON": "1"})
    real.launch = spy  # the instance attribute shadows the method for this capture
    try:
        engine.rmsnorm(x, w)
    finally:
        del real.launch
    grid, tensors, scalars, nw, ns, c = (captured[k] for k in ("grid", "tensors", "scalars", "nw", "ns", "c"))
    args = tuple(tensors) + tuple(scalars)
    jit = nm._norm_fwd_kernel
    k = jit[(grid,)](*args, **c, num_warps=nw, num_stages=ns)
    rows["kernel[grid](...) (JITFunction.run)"] = per_call_us(lambda: jit[(grid,)](*args, **c, num_warps=nw, num_stages=ns))
    rows["Launcher (engine fast path)"] = per_call_us(lambda: real(grid, tensors, scalars, nw, ns, **c))
    full = list(args) + [c[p.name] for p in jit.params if p.is_constexpr]
    full_ptrs = [a.data_ptr() if hasattr(a, "data_ptr") else a for a in full]
    stream = torch.cuda.current_stream().cuda_stream
    run, fn, meta = k.run, k.function, k.packed_metadata

    def direct():
        run(grid, 1, 1, stream, fn, meta, None, None, None, *full)

    rows["CompiledKernel.run direct"] = per_call_us(direct)

    def direct_ptrs():
        run(grid, 1, 1, stream, fn, meta, None, None, None, *full_ptrs)

    rows["CompiledKernel.run direct, int pointers"] = per_call_us(direct_ptrs)
    rows["torch.empty(32x4096 bf16)"] = per_call_us(lambda: torch.empty((m, n), device="cuda", dtype=torch.bfloat16))
    rows["torch.cuda.current_stream().cuda_stream"] = per_call_us(lambda: torch.cuda.current_stream().cuda_stream)
    rows["x.data_ptr()"] = per_call_us(lambda: x.data_ptr())
    for k_, v in rows.items():
        print(f"{k_:45s} {v:7.2f} us")


if __name__ == "__main__":
    main()
