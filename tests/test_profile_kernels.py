"""benchmarks/profile_kernels.py's kernel-time measure: the median over calls of each call's summed
device time (median_per_call), on stand-in profiler events (no GPU needed); ci/cfg_exp.py's config
strings and tune.py's FP8 grid, which feed the same measure."""

from __future__ import annotations

import dataclasses

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.profile_kernels import median_per_call  # noqa: E402
from conftest import INTERPRET  # noqa: E402


def _event(start, us):
    """A stand-in for a profiler device event: time_range.start and time_range.elapsed_us()."""
    return SimpleNamespace(time_range=SimpleNamespace(start=start, elapsed_us=lambda: us))


def test_median_per_call_groups_by_stream_order():
    """Two kernels per call, given out of order: each call's two are summed (10 + 1, 12 + 1, ...)
    and the median of the sums is taken, so one slow call (100 + 1) does not move it the way a
    mean would (the mean of these five calls is 30.0)."""
    durations = [(10, 1), (12, 1), (100, 1), (11, 1), (13, 1)]
    events = []
    for call, (a, b) in enumerate(durations):
        events += [_event(call * 1000 + 500, b), _event(call * 1000, a)]  # second kernel listed first
    events.reverse()
    assert median_per_call(events, len(durations)) == 13.0  # sums 11, 13, 101, 12, 14


def test_median_per_call_raises_on_uneven_calls():
    """Kernels that do not divide evenly into the calls (a call launched an extra kernel) raise
    instead of being split at the wrong places; so do no kernels at all."""
    events = [_event(t, 1.0) for t in range(7)]
    with pytest.raises(RuntimeError, match="7 device events over 3 calls"):
        median_per_call(events, 3)
    with pytest.raises(RuntimeError, match="0 device events"):
        median_per_call([], 3)


def test_device_profile_times_and_names_from_one_session(monkeypatch):
    """device_profile takes the time and the first call's kernel names (stream order) from one
    profiler session of ``calls`` calls (one session per cell, where a second one-call session had
    given the names)."""
    from benchmarks import profile_kernels as P

    sessions = []

    def device_events(fn, calls):
        sessions.append(calls)
        evs = []
        for call, us in enumerate((5, 7, 6)):
            for k, (name, dur) in enumerate((("norm", us), ("transpose", 2))):
                ev = _event(call * 100 + k * 10, dur)
                ev.name = name
                evs.append(ev)
        return evs

    monkeypatch.setattr(P, "device_events", device_events)
    assert P.device_profile(lambda: None, 3) == (8.0, ["norm", "transpose"])  # sums 7, 9, 8
    assert sessions == [3]


KERNEL = "void engine::norm::k<float, (engine::norm::FwdPath)1>(engine::norm::FwdArgs)"


def _stub_gpu(monkeypatch, make_inputs, build=None):
    """profile_kernels' GPU parts stood in for (harness timing, copy bandwidth, card class, the
    cases' inputs and builds, the profiler's device time), so that its loop runs on CPU."""
    import types

    from benchmarks import cases as C
    from benchmarks import harness as H
    from benchmarks import profile_kernels as P
    from engine.triton_kernels import utils as TU

    build = build or (lambda spec, inp: types.SimpleNamespace(fn=lambda: None))
    for mod, name, value in [
        (H, "on_gpu", lambda: True), (H, "copy_bandwidth", lambda: {"gbps": 1000.0}),
        (H, "bench", lambda fn: 0.001), (H, "free_memory", lambda: None),
        (H, "reset_backend", lambda: None), (H, "device", lambda: "cpu"),
        (TU, "lean_dram", lambda dev: True), (C, "make_inputs", make_inputs), (C, "build", build),
        (P, "device_profile", lambda fn: (1.0, [KERNEL]))]:
        monkeypatch.setattr(mod, name, value)


def test_rows_option_times_each_row_count_at_every_width(monkeypatch, capsys):
    """``--rows 3 5`` times M = 3 and M = 5 at each N (in place of M = 2^26 / N) and reports both,
    with the harness's GPU parts stood in for (no GPU: the loop, the shapes and the report are
    what is tested; session 43's first run of the option failed in the loop, a name clash)."""
    from benchmarks import profile_kernels as P

    shapes = []

    def make_inputs(norm, mode, m, n, dev):
        shapes.append((m, n))
        return {}

    _stub_gpu(monkeypatch, make_inputs)
    assert P.main(["--impls", "triton", "--norms", "rmsnorm", "--modes", "fwd", "--n", "1024", "4096",
                   "--rows", "3", "5"]) == 0
    assert shapes == [(3, 1024), (5, 1024), (3, 4096), (5, 4096)]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "kernels" in ln]
    assert [ln.split(":")[0].split("M=")[1].strip() for ln in lines] == ["3", "5", "3", "5"]


def test_m_align_option_rounds_the_rows_down(monkeypatch, capsys):
    """``--m-align 128`` rounds M = 2^26 // N down to a multiple of 128 (5120: 13107 -> 13056;
    a power of two's M stays), reports the M it took, and refuses an alignment under 1; the
    default keeps M = 2^26 // N (odd at 5120)."""
    from benchmarks import profile_kernels as P

    shapes = []

    def make_inputs(norm, mode, m, n, dev):
        shapes.append((m, n))
        return {}

    _stub_gpu(monkeypatch, make_inputs)
    base = ["--impls", "triton", "--norms", "rmsnorm", "--modes", "fwd", "--n", "5120", "8192"]
    assert P.main(base + ["--m-align", "128"]) == 0
    assert shapes == [(13056, 5120), (8192, 8192)]
    lines = [ln for ln in capsys.readouterr().out.splitlines() if "kernels" in ln]
    assert [ln.split(":")[0].split("M=")[1].strip() for ln in lines] == ["13056", "8192"]
    shapes.clear()
    assert P.main(base) == 0
    assert shapes == [(13107, 5120), (8192, 8192)]
    with pytest.raises(SystemExit):
        P.main(base + ["--m-align", "0"])


def test_dtype_option_converts_the_bf16_inputs(monkeypatch, capsys):
    """``--dtype fp16`` hands the cases fp16 x, weight, bias and dy (the cases' bf16 inputs
    converted), keeps the FP8 scale and amax fp32, and says so in the header; the default keeps
    bf16."""
    import types

    import torch

    from benchmarks import profile_kernels as P

    seen = []

    def make_inputs(norm, mode, m, n, dev):
        return {"x": torch.zeros(m, n, dtype=torch.bfloat16), "w": torch.ones(n, dtype=torch.bfloat16),
                "scale": torch.ones(1), "amax": torch.zeros(1)}

    def build(spec, inp):
        seen.append({k: v.dtype for k, v in inp.items()})
        return types.SimpleNamespace(fn=lambda: None)

    _stub_gpu(monkeypatch, make_inputs, build)
    base = ["--impls", "triton", "--norms", "rmsnorm", "--modes", "fp8-delayed", "--n", "1024", "--rows", "3"]
    assert P.main(base + ["--dtype", "fp16"]) == 0
    assert P.main(base) == 0
    f16, b16 = torch.float16, torch.bfloat16
    assert seen == [{"x": f16, "w": f16, "scale": torch.float32, "amax": torch.float32},
                    {"x": b16, "w": b16, "scale": torch.float32, "amax": torch.float32}]
    out = capsys.readouterr().out
    assert "inputs fp16" in out and "inputs bf16" in out


def test_json_keeps_the_rows_measured_before_a_cut(monkeypatch, tmp_path):
    """``--json`` is written after every row, so a run cut off (here: interrupted at its second
    row, as a device call's time limit does) keeps the rows it measured (session 46)."""
    import json

    from benchmarks import harness as H
    from benchmarks import profile_kernels as P

    _stub_gpu(monkeypatch, lambda norm, mode, m, n, dev: {})
    monkeypatch.setattr(H, "environment", lambda: {"device": "stub"})
    calls = []

    def device_profile(fn):
        calls.append(1)
        if len(calls) == 2:
            raise KeyboardInterrupt  # the cut
        return 1.0, [KERNEL]

    monkeypatch.setattr(P, "device_profile", device_profile)
    out = tmp_path / "rows.json"
    with pytest.raises(KeyboardInterrupt):
        P.main(["--impls", "triton", "--norms", "rmsnorm", "--modes", "fwd", "--n", "1024", "4096",
                "--json", str(out)])
    rows = json.loads(out.read_text())["rows"]
    assert [(r["n"], r["device_us"]) for r in rows] == [(1024, 1.0)]
    assert rows[0]["kernels"] == ["void engine::norm::k<float, (engine::norm::FwdPath)1>(engine::norm::FwdArgs)"]


def test_names_option_prints_each_rows_kernels_shortened(monkeypatch, capsys):
    """``--names`` prints, under each row, the kernels its call launched (stub names here), each
    without return type, namespaces and argument list; without it nothing is printed."""
    from benchmarks import profile_kernels as P

    _stub_gpu(monkeypatch, lambda norm, mode, m, n, dev: {})
    args = ["--impls", "triton", "--norms", "rmsnorm", "--modes", "fwd", "--n", "1024"]
    assert P.main(args + ["--names"]) == 0
    assert "    k<float, (FwdPath)1>" in capsys.readouterr().out.splitlines()
    assert P.main(args) == 0
    assert "k<float" not in capsys.readouterr().out


@pytest.mark.parametrize("name, short", [
    ("void engine::norm::norm_fwd_reg_kernel<__nv_bfloat16, float, 8>(engine::norm::FwdArgs)",
     "norm_fwd_reg_kernel<__nv_bfloat16, float, 8>"),
    ("_rms_fwd_kernel", "_rms_fwd_kernel"),
    ("void at::native::vectorized_elementwise_kernel<4, at::native::FillFunctor<float>>(int, float)",
     "vectorized_elementwise_kernel<4, FillFunctor<float>>"),
])
def test_short_kernel_name(name, short):
    from benchmarks.profile_kernels import short_kernel_name

    assert short_kernel_name(name) == short


def test_help_prints(capsys):
    """--help formats every option's help (argparse %-formats them: a bare "%" in one, as
    --m-adjust's "M % 16" had, raised ValueError instead of printing)."""
    from benchmarks.profile_kernels import main

    with pytest.raises(SystemExit) as e:
        main(["--help"])
    assert e.value.code == 0
    assert "M % 16 = 4" in capsys.readouterr().out


def test_cfg_exp_reads_tune_py_config_strings():
    """ci/cfg_exp.py takes configs in tune.py's string form: every form cfg_str writes (register and
    blocked tiles, one to 32 warps and programs per SM) reads back as the same NormConfig, and a
    string of another shape raises before any GPU work."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
    try:
        import cfg_exp
    finally:
        sys.path.pop(0)
    from benchmarks.tune import cfg_str
    from engine.triton_kernels.norms_common import NormConfig

    for cfg in (NormConfig(2, 2048, False, 2, 32), NormConfig(1, 16384, True, 8, 32, 3),
                NormConfig(1, 32768, True, 32, 1, 4), NormConfig(16, 128, True, 8, 2, 1)):
        assert cfg_exp.parse_cfg(cfg_str(cfg)) == cfg
    for bad in ("2x2048 w2 p32", "2x2048S w8 p1 s3", "x2048 w2 p32 s3", ""):
        with pytest.raises(ValueError):
            cfg_exp.parse_cfg(bad)
    # a trailing " P": the register forward's prefetch (NormConfig.prefetch, NOTES P175)
    r0 = NormConfig(4, 1024, False, 4, 4, 4, row_phases=False)  # NormConfig.row_phases off
    assert cfg_str(r0) == "4x1024 w4 p4 s4 R0" and cfg_exp.parse_cfg(cfg_str(r0)) == r0
    tail = NormConfig(2, 4096, True, 16, 1, 2, tail=True)  # a tail tile (NormConfig.tail)
    assert cfg_str(tail) == "2x4096+tB w16 p1 s2" and cfg_exp.parse_cfg(cfg_str(tail)) == tail
    pre = NormConfig(1, 16384, False, 16, 1, 3, prefetch=True)
    assert cfg_str(pre) == "1x16384 w16 p1 s3 P" and cfg_exp.parse_cfg(cfg_str(pre)) == pre
    with pytest.raises(ValueError):
        cfg_exp.parse_cfg("1x16384 w16 p1 s3 Q")


def test_tune_fp8_grid_holds_64_values_per_thread():
    """tune.py's fwd-fp8 grid reaches 64 values per thread (NOTES Q67): RMSNorm e4m3 2K's entry,
    two rows of 2048 over 2 warps, was outside it (4-32 per thread) and read 5 points over the
    grid's best on the H200."""
    from benchmarks.tune import candidates, cfg_str

    got = {cfg_str(c).split(" s")[0] for c in candidates("fwd-fp8", 2048, False)}
    assert {"2x2048 w2 p8", "1x2048 w1 p16"} <= got


def test_tune_grid_holds_the_prefetch_tiles():
    """tune.py's forward grids hold each register tile also with the next tile's x prefetched
    (NOTES P175), not the blocked ones, nor the residual form's (no prefetch there)."""
    from benchmarks.tune import candidates

    for op in ("fwd", "fwd-fp8"):
        cands = candidates(op, 16384, False)
        pre = [c for c in cands if c.prefetch]
        assert pre and all(not c.blocked for c in pre)
        assert {dataclasses.replace(c, prefetch=False) for c in pre} <= set(cands)
    assert not any(c.prefetch for c in candidates("fwd-res", 16384, False))


def test_tune_kernel_time_option():
    """tune.py --kernel-time (rank by the kernels' device time, the table's metric) parses on its
    own and is refused with --dry-run, whose CPU runs have no device events to sum."""
    from benchmarks.tune import parse_args

    assert parse_args(["--kernel-time"]).kernel_time and not parse_args([]).kernel_time
    with pytest.raises(SystemExit):
        parse_args(["--kernel-time", "--dry-run"])


def test_tune_grid_holds_the_backward_head_and_tail_tiles():
    """tune.py's backward grid at a width between the powers of two holds register tiles of a head
    of next_pow2(N) / 2 columns (and a tail: norms._tail_n), which ``--kinds tail`` tries alone;
    a power of two and the forward get none."""
    from benchmarks.tune import candidates, tail_candidates

    tail = tail_candidates("bwd", 5120, False)
    assert tail and all(c.block_n == 4096 and c.tail and not c.split for c in tail)
    assert {c.block_m for c in tail} == {1, 2, 4} and {c.blocked for c in tail} == {False, True}
    assert set(tail) <= set(candidates("bwd", 5120, False))
    assert candidates("bwd", 5120, False, "tail") == tail
    assert not tail_candidates("bwd", 8192, False) and not tail_candidates("fwd", 5120, False)


@pytest.mark.skipif(not INTERPRET, reason="patches a Triton function: the interpreter only")
def test_cfg_exp_amax_slots_keep_the_amax(monkeypatch):
    """ci/cfg_exp.py --amax-slots (NOTES Q68) spreads the FP8 forward's per-program amax atomics
    over AMAX_SLOTS addresses: the slots' max is the one-address amax, more than one slot is
    written, and the FP8 bytes do not change."""
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ci"))
    try:
        import cfg_exp
    finally:
        sys.path.pop(0)
    from benchmarks.tune import Problem
    from engine.triton_kernels import norms

    prob = Problem("fwd-fp8", 300, 256, True, torch.device("cpu"))
    cfg = cfg_exp.parse_cfg("1x256 w4 p2 s3")
    prob.run(cfg)
    one, q = prob.amax.clone(), prob.q.view(torch.uint8).clone()
    monkeypatch.setattr(norms, "_atomic_amax", cfg_exp._atomic_amax_slots)
    prob.amax = torch.zeros(cfg_exp.AMAX_SLOTS.value)
    prob.q.view(torch.uint8).fill_(0x7F)
    prob.run(cfg)
    assert (prob.amax > 0).sum() > 1
    assert prob.amax.max() == one[0] > 0
    assert torch.equal(prob.q.view(torch.uint8), q)
