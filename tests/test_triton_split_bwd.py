"""The Triton split backward (``_norm_bwd_split_kernel``): each row split over the G programs of a
row group, which exchange their slices' partial row sums through 64-bit words in global memory.

On CPU tensors the interpreter runs programs one after another, so only G = 1 runs there (the
words still go through memory and back); G > 1, the waits between programs, runs on the GPU. Every
output is poisoned before the launch and checked against the float64 oracle.
"""

from __future__ import annotations

import pytest
import torch

import engine

from conftest import DEVICE, ON_GPU, use_backend
from reference import norm_bwd as ref_bwd
from reference import norm_fwd as ref_fwd
from tolerances import BWD, REDUCTION, rel_err

F32, BF16 = torch.float32, torch.bfloat16
NORMS = [pytest.param(True, id="rms"), pytest.param(False, id="ln")]


def poisoned(shape, dtype):
    return torch.full(shape, float("nan"), dtype=dtype, device=DEVICE)


def _problem(m, n, is_rms, w_dtype=F32, residual=False):
    x = torch.randn(m, n, device=DEVICE).to(BF16)
    w = (torch.randn(n, device=DEVICE) * 0.5).to(w_dtype)
    b = None if is_rms else torch.randn(n, device=DEVICE).to(w_dtype)
    dy = torch.randn(m, n, device=DEVICE).to(BF16)
    dres_in = torch.randn(m, n, device=DEVICE).to(F32) if residual else None
    return x, w, b, dy, dres_in


def _launch(x, w, b, dy, dres_in, is_rms, config, with_dres=False):
    from engine.triton_kernels import norms as nm

    m, n = x.shape
    ref_f = ref_fwd(x, w, b, 1e-5, is_rms, True)
    mu = None if is_rms else ref_f["mu"].float()
    rsigma = ref_f["rsigma"].float()
    dx = poisoned((m, n), BF16)
    dres = poisoned((m, n), F32) if with_dres else None
    dw = poisoned((n,), F32)
    db = None if is_rms else poisoned((n,), F32)
    nm.launch_bwd(dy, x, mu, rsigma, w, dres_in, dx, dres, dw, db, is_rms_norm=is_rms,
                  zero_centered_gamma=True, sm_margin=0, config=config)
    return dx, dres, dw, db


def _check(x, w, b, dy, dres_in, is_rms, out):
    dx, dres, dw, db = out
    ref = ref_bwd(dy, x, w, b, 1e-5, is_rms, True, dres_in)
    torch.testing.assert_close(dx.double(), ref["dx"], **BWD[BF16])
    if dres is not None:
        torch.testing.assert_close(dres.double(), ref["dx"], **BWD[F32])
    assert rel_err(dw, ref["dweight"]) < REDUCTION[F32]
    if b is not None:
        assert rel_err(db, ref["dbias"]) < REDUCTION[F32]


@pytest.fixture(params=[(1, True), (2, True), (2, False)], ids=["lag1", "lag2", "lag2-gamma-per-phase"])
def lag(request, monkeypatch):
    """The split kernel's lags and its gamma held or loaded per phase (norms.SPLIT_LAG and
    SPLIT_HOLD_G, read when a launch is planned)."""
    from engine.triton_kernels import norms as nm

    monkeypatch.setattr(nm, "SPLIT_LAG", request.param[0])
    monkeypatch.setattr(nm, "SPLIT_HOLD_G", request.param[1])
    return request.param


def _split(slice_n):
    from engine.triton_kernels.norms_common import NormConfig

    return NormConfig(1, slice_n, False, 4, 1, split=True)


@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n,slice_n,residual", [
    pytest.param(300, 512, False, id="masked"),
    pytest.param(512, 512, False, id="even"),
    pytest.param(300, 512, True, id="masked-dresidual"),
])
def test_split_backward_one_program_per_row(is_rms, n, slice_n, residual, lag):
    """G = 1 (one slice per row; the interpreter's only case), several rows per program (M = 37,
    at most 2 programs per stand-in SM on CPU), bias and zero-centred gamma, with and without the
    residual's gradient (added, and stored again in fp32)."""
    use_backend("triton")
    x, w, b, dy, dres_in = _problem(37, n, is_rms, residual=residual)
    _check(x, w, b, dy, dres_in, is_rms, _launch(x, w, b, dy, dres_in, is_rms, _split(slice_n), residual))


@pytest.mark.skipif(not ON_GPU, reason="G > 1: the programs of a row group wait for one another")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("n,slice_n,residual", [
    pytest.param(300, 128, False, id="3-slices-masked"),
    pytest.param(512, 128, False, id="4-slices-even"),
    pytest.param(3571, 256, True, id="14-slices-dresidual"),
])
def test_split_backward_row_groups(is_rms, n, slice_n, residual, lag):
    """G > 1 with masked and unmasked last slices, M = 37 rows over the row groups."""
    use_backend("triton")
    x, w, b, dy, dres_in = _problem(37, n, is_rms, residual=residual)
    _check(x, w, b, dy, dres_in, is_rms, _launch(x, w, b, dy, dres_in, is_rms, _split(slice_n), residual))


@pytest.mark.skipif(ON_GPU, reason="the interpreter's limit")
def test_split_backward_rejects_row_groups_in_the_interpreter():
    """An explicit G > 1 on CPU tensors would wait forever (programs run one at a time): it raises."""
    use_backend("triton")
    x, w, b, dy, _ = _problem(3, 300, True)
    with pytest.raises(ValueError, match="do not fit the interpreter"):
        _launch(x, w, b, dy, None, True, _split(128))


def test_split_backward_is_the_default_from_32k():
    """The heuristic takes the split kernel from 32K columns for RMSNorm and from 16K for LayerNorm
    (NOTES P71, P74), and on CPU tensors runs it with G = 1 (the slice is the row): a 2 x 32768
    backward through the public API."""
    from engine.triton_kernels import norms_common as nc

    assert nc.bwd_config(32768, BF16, True).split and nc.bwd_config(131072, BF16, False).split
    assert nc.bwd_config(16384, BF16, False).split and nc.bwd_config(12289, BF16, False).split
    assert not nc.bwd_config(16384, BF16, True).split and not nc.bwd_config(8192, BF16, False).split
    use_backend("triton")
    for is_rms in (True, False):
        x, w, b, dy, _ = _problem(2, 32768, is_rms)
        _check(x, w, b, dy, None, is_rms, _launch(x, w, b, dy, None, is_rms, None))


@pytest.mark.skipif(not ON_GPU, reason="large shapes and G > 1 need the GPU")
@pytest.mark.parametrize("is_rms", NORMS)
@pytest.mark.parametrize("m,n", [(1, 65536), (37, 40009), (64, 65544), (5, 131072), (300, 32768)])
def test_split_backward_wide_rows_deterministic(is_rms, m, n):
    """The default (split) backward of wide rows through the public API against float64, three
    times with the same bits (the partial sums add in slot order whichever program lands first)."""
    use_backend("triton")
    x, w, b, dy, _ = _problem(m, n, is_rms)
    outs = []
    for _ in range(3):
        xg = x.detach().clone().requires_grad_(True)
        wg = w.detach().clone().requires_grad_(True)
        bg = None if b is None else b.detach().clone().requires_grad_(True)
        y = (engine.rmsnorm(xg, wg, 1e-5, zero_centered_gamma=True) if is_rms
             else engine.layernorm(xg, wg, bg, 1e-5, zero_centered_gamma=True))
        y.backward(dy)
        outs.append((xg.grad, wg.grad, None if bg is None else bg.grad))
    ref = ref_bwd(dy, x, w, b, 1e-5, is_rms, True, None)
    torch.testing.assert_close(outs[0][0].double(), ref["dx"], **BWD[BF16])
    assert rel_err(outs[0][1], ref["dweight"]) < REDUCTION[F32]
    if b is not None:
        assert rel_err(outs[0][2], ref["dbias"]) < REDUCTION[F32]
    for o in outs[1:]:
        for a, e in zip(o, outs[0]):
            if e is not None:
                assert torch.equal(a, e)


def test_split_backward_falls_back_where_a_group_would_not_fit(monkeypatch):
    """Where a row group's G programs would outnumber the SMs (on an H200 past ~1M columns), the
    heuristic takes the blocked kernel (BWD_BLOCKED) instead of a launch whose groups could not be
    resident together. Simulated on CPU tensors: programs per row allowed (the GPU's rule), two
    stand-in SMs, a 2 x 32768 LayerNorm backward (G = 4)."""
    from engine.triton_kernels import norms as nm
    from engine.triton_kernels import norms_common as nc
    from engine.triton_kernels import utils

    use_backend("triton")
    monkeypatch.setattr(nm, "split_groups_run", lambda device: True)
    monkeypatch.setattr(utils, "INTERPRETER_SM_COUNT", 2)
    cfg, _, _ = nm._bwd_plan(32768, BF16, False, False, True, torch.device("cpu"), 0, False, True, None)
    assert cfg == nc.BWD_BLOCKED
    nm.BWD_PLANS.clear()
    x, w, b, dy, _ = _problem(2, 32768, False)
    _check(x, w, b, dy, None, False, _launch(x, w, b, dy, None, False, None))
    nm.BWD_PLANS.clear()
