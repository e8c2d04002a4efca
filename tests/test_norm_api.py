"""Public API: functionals, modules, autograd, residual, state_dict, errors, torch.compile, CUDA graphs."""

from __future__ import annotations

import pytest
import torch

import engine

from conftest import DEVICE, ON_GPU
from reference import norm_fwd as ref_fwd
from reference import residual_sum
from tolerances import BWD, FWD, REDUCTION, rel_err

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NORMS = [pytest.param(True, id="rms"), pytest.param(False, id="ln")]


def call(is_rms, x, w, b=None, eps=1e-5, **kw):
    if is_rms:
        return engine.rmsnorm(x, w, eps, **kw)
    return engine.layernorm(x, w, b, eps, **kw)


def oracle_grads(is_rms, x, w, b, r, dy, dres, eps, zcg):
    """float64 autograd through ``norm(x + r)`` (residual_out rounded as stored)."""
    x64 = x.double().detach().requires_grad_(True)
    w64 = w.double().detach().requires_grad_(True)
    b64 = None if b is None else b.double().detach().requires_grad_(True)
    r64 = None if r is None else r.double().detach().requires_grad_(True)
    z = x64 if r is None else x64 + r64
    n = w.numel()
    y = ref_fwd(z.reshape(-1, n), w64.reshape(n), None if b64 is None else b64.reshape(n), eps,
                is_rms, zcg)["y"].reshape(x.shape)
    loss = (y * dy.double()).sum()
    if r is not None:
        loss = loss + (z * dres.double()).sum()
    loss.backward()
    return x64.grad, w64.grad, None if b64 is None else b64.grad, None if r64 is None else r64.grad


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_autograd_3d(backend, is_rms, residual):
    """fwd + bwd through the functional on [B, S, H] inputs vs float64 autograd."""
    b_, s, n = 3, 5, 96
    eps = 1e-5
    x = torch.randn(b_, s, n, device=DEVICE, dtype=BF16, requires_grad=True)
    w = (torch.rand(n, device=DEVICE) + 0.5).requires_grad_(True)
    b = None if is_rms else torch.randn(n, device=DEVICE, requires_grad=True)
    r = torch.randn(b_, s, n, device=DEVICE, dtype=F32, requires_grad=True) if residual else None
    res = call(is_rms, x, w, b, eps, residual=r)
    y, res_out = (res if residual else (res, None))
    assert y.shape == x.shape and y.dtype == BF16
    dy = torch.randn_like(y)
    dres = torch.randn_like(res_out) if residual else None
    torch.autograd.backward([y, res_out] if residual else [y], [dy, dres] if residual else [dy])
    gx, gw, gb, gr = oracle_grads(is_rms, x.detach(), w.detach(), None if b is None else b.detach(),
                                  None if r is None else r.detach(), dy, dres, eps, False)
    z = x.detach() if r is None else residual_sum(x.detach(), r.detach())
    y_ref = ref_fwd(z.reshape(-1, n), w.detach(), None if b is None else b.detach(), eps, is_rms)["y"]
    torch.testing.assert_close(y.double().reshape(-1, n), y_ref, **FWD[BF16])
    torch.testing.assert_close(x.grad.double(), gx, **BWD[BF16])
    assert rel_err(w.grad, gw) < REDUCTION[F32]
    if b is not None:
        assert rel_err(b.grad, gb) < REDUCTION[F32]
    if residual:
        assert res_out.dtype == F32
        torch.testing.assert_close(res_out, z, rtol=0, atol=0)
        torch.testing.assert_close(r.grad.double(), gr, **BWD[F32])


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
@pytest.mark.parametrize("shape", [(4, 16), (3, 4, 16)], ids=["x_is_normalized_shape", "x_3d"])
def test_autograd_2d_weight(backend, is_rms, residual, shape):
    """fwd + bwd with a 2-D normalized shape ([4, 16], N = 64) vs float64 autograd, including an x
    of exactly that shape: a 2-D x whose rows are not the norm's rows (it is one row of 64), so the
    output's gradient (here with a row pitch of 32) must become [1, 64] before the backward kernel
    (a copy: it cannot be viewed so)."""
    eps = 1e-5
    x = torch.randn(*shape, device=DEVICE, dtype=F32, requires_grad=True)
    w = (torch.rand(4, 16, device=DEVICE) + 0.5).requires_grad_(True)
    b = None if is_rms else torch.randn(4, 16, device=DEVICE, requires_grad=True)
    r = torch.randn(*shape, device=DEVICE, dtype=F32, requires_grad=True) if residual else None
    res = call(is_rms, x, w, b, eps, residual=r)
    y, res_out = (res if residual else (res, None))
    assert y.shape == x.shape
    # dy with rows of 16 at a pitch of 32 (unit stride in the last dim, as the kernels take it)
    dy = torch.randn(*shape[:-1], 32, device=DEVICE, dtype=F32)[..., :16]
    dres = torch.randn_like(res_out) if residual else None
    torch.autograd.backward([y, res_out] if residual else [y], [dy, dres] if residual else [dy])
    gx, gw, gb, gr = oracle_grads(is_rms, x.detach(), w.detach(), None if b is None else b.detach(),
                                  None if r is None else r.detach(), dy, dres, eps, False)
    torch.testing.assert_close(x.grad.double(), gx, **BWD[F32])
    assert w.grad.shape == w.shape and rel_err(w.grad, gw) < REDUCTION[F32]
    if b is not None:
        assert b.grad.shape == b.shape and rel_err(b.grad, gb) < REDUCTION[F32]
    if residual:
        torch.testing.assert_close(r.grad.double(), gr, **BWD[F32])


@pytest.mark.parametrize("is_rms", NORMS)
def test_only_residual_out_used(backend, is_rms):
    """A graph that uses residual_out but not the norm output still gets the right gradient."""
    n = 64
    x = torch.randn(4, n, device=DEVICE, requires_grad=True)
    r = torch.randn(4, n, device=DEVICE, requires_grad=True)
    w = torch.ones(n, device=DEVICE, requires_grad=True)
    _, res_out = call(is_rms, x, w, residual=r)
    res_out.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x))
    torch.testing.assert_close(r.grad, torch.ones_like(r))


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("res_dtype", [BF16, F32], ids=["bf16_res", "fp32_res"])
def test_only_norm_output_used_with_residual(backend, is_rms, res_dtype):
    """With a residual, a graph that uses the norm output but not residual_out: the backward gets
    no gradient for residual_out (None, not a tensor of zeros: _NormFunction does not materialise
    it) and dx = dresidual is the norm's input gradient alone."""
    n, eps = 200, 1e-5
    x = torch.randn(7, n, device=DEVICE, dtype=BF16, requires_grad=True)
    r = torch.randn(7, n, device=DEVICE, dtype=res_dtype, requires_grad=True)
    w = (torch.rand(n, device=DEVICE) + 0.5).requires_grad_(True)
    b = None if is_rms else torch.randn(n, device=DEVICE, requires_grad=True)
    y, _ = call(is_rms, x, w, b, eps, residual=r)
    dy = torch.randn_like(y)
    y.backward(dy)
    # the oracle normalises residual_out as stored (rounded to the residual's dtype)
    z = residual_sum(x.detach(), r.detach())
    gz, gw, gb, _ = oracle_grads(is_rms, z, w.detach(), None if b is None else b.detach(), None, dy,
                                 None, eps, False)
    torch.testing.assert_close(x.grad.double(), gz, **BWD[BF16])
    torch.testing.assert_close(r.grad.double(), gz, **BWD[res_dtype])
    assert rel_err(w.grad, gw) < REDUCTION[F32]
    if b is not None:
        assert rel_err(b.grad, gb) < REDUCTION[F32]


def test_out_dtype_bf16_in_fp32_out(backend):
    x = torch.randn(6, 130, device=DEVICE, dtype=BF16)
    w = torch.randn(130, device=DEVICE, dtype=BF16)
    y = engine.rmsnorm(x, w, 1e-6, out_dtype=F32)
    assert y.dtype == F32
    torch.testing.assert_close(y.double(), ref_fwd(x, w, None, 1e-6, True)["y"], **FWD[F32])


@pytest.mark.parametrize("is_rms", NORMS)
def test_dgamma_bitwise_deterministic(backend, is_rms):
    """Two identical backward runs give bitwise identical dweight (and dbias): no float atomics."""
    n = 1000
    x = torch.randn(333, n, device=DEVICE, dtype=BF16)
    w = torch.randn(n, device=DEVICE, requires_grad=True)
    b = None if is_rms else torch.randn(n, device=DEVICE, requires_grad=True)
    dy = torch.randn(333, n, device=DEVICE, dtype=BF16)
    grads = []
    for _ in range(2):
        w.grad = None
        if b is not None:
            b.grad = None
        call(is_rms, x, w, b).backward(dy)
        grads.append((w.grad.clone(), None if b is None else b.grad.clone()))
    assert torch.equal(grads[0][0], grads[1][0])
    if b is not None:
        assert torch.equal(grads[0][1], grads[1][1])


def test_modules_match_torch_state_dict(backend):
    """engine.RMSNorm / LayerNorm load torch.nn weights (and back) and compute the same thing."""
    n = 48
    x = torch.randn(2, 7, n, device=DEVICE)
    t_rms = torch.nn.RMSNorm(n, eps=1e-6, device=DEVICE)
    t_ln = torch.nn.LayerNorm(n, eps=1e-5, device=DEVICE)
    with torch.no_grad():
        for p in list(t_rms.parameters()) + list(t_ln.parameters()):
            p.copy_(torch.randn_like(p))
    e_rms = engine.RMSNorm(n, eps=1e-6, device=DEVICE)
    e_ln = engine.LayerNorm(n, eps=1e-5, device=DEVICE)
    e_rms.load_state_dict(t_rms.state_dict())
    e_ln.load_state_dict(t_ln.state_dict())
    torch.testing.assert_close(e_rms(x), t_rms(x), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(e_ln(x), t_ln(x), rtol=1e-5, atol=1e-5)
    back_rms = torch.nn.RMSNorm(n, device=DEVICE)
    back_rms.load_state_dict(e_rms.state_dict())
    assert torch.equal(back_rms.weight, t_rms.weight)
    no_bias = engine.LayerNorm(n, bias=False, device=DEVICE)
    assert set(no_bias.state_dict()) == set(torch.nn.LayerNorm(n, bias=False).state_dict())


def test_module_init_and_zero_centered(backend):
    m = engine.RMSNorm(32, zero_centered_gamma=True, device=DEVICE)
    assert torch.equal(m.weight, torch.zeros(32, device=DEVICE))
    ln = engine.LayerNorm((4, 8), device=DEVICE)
    assert torch.equal(ln.weight, torch.ones(4, 8, device=DEVICE)) and torch.equal(ln.bias, torch.zeros(4, 8, device=DEVICE))
    x = torch.randn(3, 4, 8, device=DEVICE)
    ref = torch.nn.functional.layer_norm(x, (4, 8), eps=1e-5)
    torch.testing.assert_close(ln(x), ref, rtol=1e-5, atol=1e-5)
    # regression: a 2-D input whose two dims are both normalised is ONE row of 32, not 4 rows of 8
    x1 = x[0].contiguous()
    torch.testing.assert_close(ln(x1), ref[0], rtol=1e-5, atol=1e-5)
    y = m(x.reshape(3, 32))
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x.reshape(3, 32), (32,), eps=1e-6),
                               rtol=1e-5, atol=1e-5)


def _bad_calls():
    x = torch.randn(4, 16)
    w = torch.ones(16)
    return [
        ("weight length", lambda: engine.rmsnorm(x, torch.ones(15)), ValueError, "normalised shape"),
        ("integer input", lambda: engine.rmsnorm(x.to(torch.int32), w), ValueError, "float32"),
        ("fp8 input", lambda: engine.layernorm(x.to(torch.float8_e4m3fn), w), ValueError, "float32"),
        ("N = 0", lambda: engine.rmsnorm(torch.randn(4, 0), torch.ones(0)), ValueError, "at least one"),
        ("last dim strided", lambda: engine.rmsnorm(torch.randn(16, 4).t(), w), ValueError, "unit stride"),
        ("not viewable", lambda: engine.rmsnorm(torch.randn(3, 4, 16).transpose(0, 1), w), ValueError,
         "cannot be viewed"),
        ("weight dtype", lambda: engine.rmsnorm(x.to(BF16), w.half()), ValueError, "weight must be"),
        ("bias shape", lambda: engine.layernorm(x, w, torch.ones(3)), ValueError, "bias"),
        ("residual shape", lambda: engine.rmsnorm(x, w, residual=torch.randn(4, 8)), ValueError, "residual"),
        ("residual dtype", lambda: engine.rmsnorm(x, w, residual=x.half()), ValueError, "residual"),
        ("out dtype", lambda: engine.rmsnorm(x, w, out_dtype=torch.int8), ValueError, "out_dtype"),
        ("eps", lambda: engine.rmsnorm(x, w, -1.0), ValueError, "eps"),
        ("sm_margin", lambda: engine.rmsnorm(x, w, sm_margin=-2), ValueError, "sm_margin"),
        ("not a tensor", lambda: engine.rmsnorm([1.0, 2.0], w), TypeError, "torch.Tensor"),
    ]


@pytest.mark.parametrize("case", _bad_calls(), ids=lambda c: c[0])
def test_bad_input_raises(backend, case):
    _, fn, exc, match = case
    with pytest.raises(exc, match=match):
        fn()


@pytest.mark.skipif(not ON_GPU, reason="needs a GPU")
def test_cpu_cuda_mix_raises(backend):
    with pytest.raises(ValueError, match="device"):
        engine.rmsnorm(torch.randn(4, 16, device="cuda"), torch.ones(16))


class _Block(torch.nn.Module):
    def __init__(self, n):
        super().__init__()
        self.norm1 = engine.RMSNorm(n)
        self.lin = torch.nn.Linear(n, n)
        self.norm2 = engine.LayerNorm(n)

    def forward(self, x):
        h, res = self.norm1(self.lin(x), residual=x)
        return self.norm2(h + res)


@pytest.mark.parametrize("is_rms", NORMS)
def test_torch_compile_fullgraph(backend, is_rms):
    """torch.compile(fullgraph=True) of a module using engine norms: no graph breaks, same values,
    same gradients. On CPU it uses the aot_eager backend (it traces through the custom ops' fake
    implementations like inductor does, without a C++ build); on the GPU, inductor."""
    torch._dynamo.reset()
    n = 64
    model = _Block(n).to(DEVICE)
    x = torch.randn(4, 6, n, device=DEVICE, requires_grad=True)
    compiled = torch.compile(model, fullgraph=True, backend="inductor" if ON_GPU else "aot_eager")
    y_c = compiled(x)
    y_e = model(x)
    torch.testing.assert_close(y_c, y_e, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(y_c)
    (gx_c,) = torch.autograd.grad(y_c, x, g)
    (gx_e,) = torch.autograd.grad(y_e, x, g)
    torch.testing.assert_close(gx_c, gx_e, rtol=1e-5, atol=1e-5)


@pytest.mark.skipif(not ON_GPU, reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("is_rms", NORMS)
def test_cuda_graph_capture(backend, is_rms):
    """Forward and backward captured in a CUDA graph replay to the eager values."""
    n = 1024
    norm = (engine.RMSNorm(n) if is_rms else engine.LayerNorm(n)).to(DEVICE)
    x = torch.randn(64, n, device=DEVICE, requires_grad=True)
    dy = torch.randn(64, n, device=DEVICE)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):  # warm up (Triton compile, allocator) outside the capture
            x.grad = None
            norm(x).backward(dy)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    x.grad = None
    norm.weight.grad = None
    with torch.cuda.graph(g):
        y = norm(x)
        y.backward(dy)
    x_new = torch.randn_like(x)
    with torch.no_grad():
        x.copy_(x_new)
    g.replay()
    torch.cuda.synchronize()
    ref_y = norm(x_new)
    torch.testing.assert_close(y, ref_y)
    x2 = x_new.clone().requires_grad_(True)
    norm(x2).backward(dy)
    torch.testing.assert_close(x.grad, x2.grad)


@pytest.mark.skipif(not ON_GPU, reason="compares the two GPU backends")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n", [4096, 17389])
def test_triton_cuda_agree(is_rms, n):
    """Both GPU backends on the same inputs: outputs within one bf16 ulp, stats within fp32 noise."""
    from conftest import use_backend

    x = torch.randn(257, n, device=DEVICE, dtype=BF16)
    w = torch.randn(n, device=DEVICE, dtype=BF16)
    dy = torch.randn(257, n, device=DEVICE, dtype=BF16)
    results = {}
    for name in ("triton", "cuda"):
        use_backend(name)
        xg = x.clone().requires_grad_(True)
        wg = w.clone().requires_grad_(True)
        y = call(is_rms, xg, wg)
        y.backward(dy)
        results[name] = (y, xg.grad, wg.grad)
    engine.backend.reset_for_tests()
    for a, b in zip(results["triton"], results["cuda"]):
        torch.testing.assert_close(a.float(), b.float(), rtol=2 ** -7, atol=1e-2)


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backend needs a GPU")
def test_cuda_backend_errors_are_exceptions():
    """Bad arguments reaching the compiled binding raise RuntimeError (forward and backward alike)."""
    from engine import cuda_backend

    x = torch.randn(4, 64, device=DEVICE, dtype=BF16)
    w = torch.ones(64, device=DEVICE, dtype=BF16)
    rs = torch.ones(4, device=DEVICE)
    with pytest.raises(RuntimeError, match="dweight"):
        cuda_backend.norm_bwd(x, x, None, rs, w, None, torch.empty_like(x),
                              None, torch.empty(64, device=DEVICE, dtype=F16), None,
                              is_rms_norm=True, zero_centered_gamma=False, sm_margin=0)
    with pytest.raises(RuntimeError, match="output"):
        cuda_backend.norm_fwd(x, w, None, None, 1e-5, torch.empty(64, device=DEVICE, dtype=BF16).expand(4, 64),
                              None, None, rs, None, None, None, None, is_rms_norm=True,
                              zero_centered_gamma=False, current_scaling=False, amax_epsilon=0.0,
                              sm_margin=0)


def _spy(monkeypatch, module, names):
    """Wrap ``module``'s functions ``names`` so that each call appends its name to the list
    returned."""
    calls = []
    for name in names:
        real = getattr(module, name)
        monkeypatch.setattr(module, name, lambda *a, _n=name, _f=real: calls.append(_n) or _f(*a))
    return calls


def _hide(monkeypatch, module, names):
    """Remove ``names`` from ``module`` (the CUDA backend then allocates its outputs in Python)."""
    for name in names:
        monkeypatch.delattr(module, name)


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backend needs a GPU")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("res_dtype", [None, BF16, F32], ids=["plain", "bf16_res", "fp32_res"])
@pytest.mark.parametrize("out_dtype", [None, F32], ids=["out_x", "out_f32"])
def test_cuda_outputs_allocated_in_the_extension(monkeypatch, is_rms, res_dtype, out_dtype):
    """On the CUDA backend the high-precision forward's and the backward's outputs come from the
    extension's allocating entries (one host call each: ``cuda_backend.norm_fwd_alloc`` /
    ``norm_bwd_alloc``), with and without autograd, and equal bitwise what the same kernels write
    into outputs allocated in Python."""
    from conftest import use_backend
    from engine import cuda_backend

    use_backend("cuda")
    try:
        m, n = 37, 3000
        x = torch.randn(3, m, n, device=DEVICE, dtype=BF16)
        w = torch.randn(n, device=DEVICE, dtype=BF16)
        b = None if is_rms else torch.randn(n, device=DEVICE, dtype=BF16)
        r = None if res_dtype is None else torch.randn(3, m, n, device=DEVICE, dtype=res_dtype)
        dy = torch.randn(3, m, n, device=DEVICE, dtype=out_dtype or BF16)
        kw = {"zero_centered_gamma": True, "out_dtype": out_dtype}
        if r is not None:
            kw["residual"] = r

        def run():
            with torch.no_grad():
                plain = call(is_rms, x, w, b, **kw)
            leaves = [t.clone().requires_grad_(True) for t in (x, w, b, r) if t is not None]
            xg, wg = leaves[:2]
            bg = leaves[2] if b is not None else None
            kwg = dict(kw, residual=leaves[-1]) if r is not None else kw
            y = call(is_rms, xg, wg, bg, **kwg)
            ys = (y,) if r is None else y
            grads = torch.autograd.grad(ys[0], leaves, dy)
            return ((plain,) if r is None else plain), tuple(t.detach() for t in ys), grads

        names = ("norm_fwd_alloc", "norm_bwd_alloc")
        calls = _spy(monkeypatch, cuda_backend, names)
        got = run()
        assert calls == ["norm_fwd_alloc", "norm_fwd_alloc", "norm_bwd_alloc"]
        _hide(monkeypatch, cuda_backend, names)  # the Python allocation
        want = run()
        for g, wt in zip((t for part in got for t in part), (t for part in want for t in part)):
            assert g.shape == wt.shape and g.dtype == wt.dtype and g.device == x.device
            assert torch.equal(g, wt)
        plain, ys, grads = got
        assert all(torch.equal(p, q) for p, q in zip(plain, ys))
        assert plain[0].shape == x.shape and plain[0].dtype == (out_dtype or BF16)
        if r is not None:
            assert plain[1].dtype == res_dtype and grads[-1].dtype == res_dtype
        assert grads[1].dtype == w.dtype
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backend needs a GPU")
def test_cuda_norm_fwd_alloc_errors():
    """The allocating entry reports bad arguments as exceptions, as norm_fwd does."""
    from engine import cuda_backend

    x = torch.randn(4, 64, device=DEVICE, dtype=BF16)
    with pytest.raises(RuntimeError, match="weight"):
        cuda_backend.norm_fwd_alloc(x, torch.ones(63, device=DEVICE, dtype=BF16), None, None, 1e-5,
                                    None, True, False, 0)
    with pytest.raises(RuntimeError, match="out_dtype"):
        cuda_backend.norm_fwd_alloc(x, torch.ones(64, device=DEVICE, dtype=BF16), None, None, 1e-5,
                                    torch.int32, True, False, 0)
    with pytest.raises(RuntimeError, match="2-D"):
        cuda_backend.norm_fwd_alloc(x[0], torch.ones(64, device=DEVICE, dtype=BF16), None, None,
                                    1e-5, None, False, False, 0)
    with pytest.raises(ValueError, match="CUDA tensor"):
        cuda_backend.norm_fwd_alloc(x.cpu(), torch.ones(64, dtype=BF16), None, None, 1e-5, None,
                                    True, False, 0)


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backend needs a GPU")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("current", [False, True], ids=["delayed", "current"])
@pytest.mark.parametrize("columnwise", [False, True], ids=["rows", "rows_T"])
@pytest.mark.parametrize("residual", [False, True], ids=["plain", "residual"])
def test_cuda_fp8_outputs_allocated_in_the_extension(monkeypatch, is_rms, current, columnwise, residual):
    """The FP8 norm forward and cast_transpose on the CUDA backend allocate their outputs in the
    extension (``norm_fwd_fp8_alloc``, ``cast_transpose_alloc``), bitwise equal to the outputs the
    same kernels write into tensors allocated in Python, amax and scale included."""
    from conftest import use_backend
    from engine import cuda_backend

    use_backend("cuda")
    try:
        m, n = 48, 3000  # M % 16 == 0: the norm's own transposed copy where it has one
        x = torch.randn(2, m // 2, n, device=DEVICE, dtype=BF16)
        w = torch.randn(n, device=DEVICE, dtype=BF16)
        b = None if is_rms else torch.randn(n, device=DEVICE, dtype=BF16)
        r = torch.randn_like(x) if residual else None

        def quantizer():
            if current:
                return engine.Float8CurrentScalingQuantizer(torch.float8_e4m3fn, columnwise=columnwise)
            return engine.Float8Quantizer(torch.full((1,), 2.0, device=DEVICE),
                                          torch.full((1,), 0.5, device=DEVICE), torch.float8_e4m3fn,
                                          columnwise=columnwise)

        def run():
            q, qc = quantizer(), quantizer()
            with torch.no_grad():
                res = call(is_rms, x, w, b, quantizer=q, **({"residual": r} if residual else {}))
                t, res_out = (res, None) if r is None else res
                c = engine.cast_transpose(x, qc)
            outs = [t.data, t.transpose_data, t.scale_inv, res_out, q.amax, q.scale,
                    c.data, c.transpose_data, c.scale_inv, qc.amax, qc.scale]
            return [o for o in outs if o is not None]

        names = ("norm_fwd_fp8_alloc", "cast_transpose_alloc")
        calls = _spy(monkeypatch, cuda_backend, names)
        got = run()
        assert calls == list(names)
        _hide(monkeypatch, cuda_backend, names)  # the Python allocation
        want = run()
        assert len(got) == len(want) == 8 + (2 if columnwise else 0) + (1 if residual else 0)
        for g, wt in zip(got, want):
            assert g.shape == wt.shape and g.dtype == wt.dtype and g.device == x.device
            assert torch.equal(g.view(torch.uint8) if g.element_size() == 1 else g,
                               wt.view(torch.uint8) if wt.element_size() == 1 else wt)
        assert got[0].shape == x.shape and got[0].dtype == torch.float8_e4m3fn
        if columnwise:
            assert got[1].shape == (n, m)
    finally:
        engine.backend.reset_for_tests()


@pytest.mark.skipif(not ON_GPU, reason="the CUDA backend needs a GPU")
def test_cuda_out_of_memory_is_torch_out_of_memory_error():
    """An output the caching allocator cannot give raises torch.OutOfMemoryError from the public
    call, as torch.empty did before the extension allocated the outputs: a row of x expanded to
    2^35 rows (stride 0, no memory) asks for 256 TiB of output."""
    from conftest import use_backend

    use_backend("cuda")
    try:
        x = torch.randn(1, 4096, device=DEVICE, dtype=BF16).expand(2 ** 35, 4096)
        w = torch.ones(4096, device=DEVICE, dtype=BF16)
        with torch.no_grad(), pytest.raises(torch.OutOfMemoryError, match="out of memory"):
            engine.rmsnorm(x, w)
        q = engine.Float8Quantizer(torch.ones(1, device=DEVICE), torch.zeros(1, device=DEVICE),
                                   torch.float8_e4m3fn, columnwise=True)
        with torch.no_grad(), pytest.raises(torch.OutOfMemoryError, match="out of memory"):
            engine.cast_transpose(x, q)
    finally:
        engine.backend.reset_for_tests()
