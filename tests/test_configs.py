"""The Triton launch configs (engine.triton_kernels.norms_common): every table entry is a config the
kernels can run, for every row width and op the heuristics serve."""

from __future__ import annotations

import itertools

import pytest
import torch
import triton

from engine.triton_kernels import norms_common as nc
from engine.triton_kernels import utils
from engine.triton_kernels.utils import persistent_grid

WIDTHS = [1, 17, 760, 1000, 1024, 1025, 2048, 3571, 4096, 5120, 6000, 8192, 10240, 12288, 16384, 17389,
          32768, 40009, 65536, 131072, 262144]


def _pow2(v: int) -> bool:
    return v > 0 and v & (v - 1) == 0


def _check(cfg: nc.NormConfig, n: int, max_tile: int) -> None:
    assert _pow2(cfg.block_m) and _pow2(cfg.block_n) and cfg.num_warps in (1, 2, 4, 8, 16, 32)
    assert cfg.programs_per_sm >= 1 and cfg.num_stages >= 1
    if cfg.split:  # the split backward: one-row slices, at least two per row, one program per SM
        assert not cfg.blocked and cfg.block_m == 1 and cfg.programs_per_sm == 1
        assert cfg.block_n < n, f"split slice of {cfg.block_n} for N={n}: {cfg}"
    elif cfg.tail:  # a head of block_n columns and a tail tile of the rest (norms._tail_n)
        assert cfg.block_n < n <= 2 * cfg.block_n, f"tail config {cfg} for N={n}"
        lanes = cfg.block_n + triton.next_power_of_2(n - cfg.block_n)
        assert cfg.block_m * lanes <= max_tile, f"tile over {max_tile} elements: {cfg}"
    elif cfg.blocked:  # one chunk may cover the row (pass 2 re-reads it from L2), never more
        assert cfg.block_n < 2 * n, f"blocked chunk of {cfg.block_n} for N={n}: {cfg}"
    else:
        assert cfg.block_n >= n, f"register path narrower than N={n}: {cfg}"
        assert cfg.block_m * cfg.block_n <= max_tile, f"tile over {max_tile} elements: {cfg}"


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("fp8,rms", list(itertools.product([False, True], [True, False])))
def test_forward_configs_are_runnable(n, fp8, rms):
    _check(nc.fwd_config(n, torch.bfloat16, False, fp8, rms), n, nc.MAX_FUSED_N)


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("rms", [True, False])
@pytest.mark.parametrize("lean", [False, True])
def test_residual_forward_configs_are_runnable(n, rms, lean):
    _check(nc.fwd_config(n, torch.bfloat16, False, False, rms, residual=True, lean=lean), n, nc.MAX_FUSED_N)


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("fp8,rms", list(itertools.product([False, True], [True, False])))
def test_lean_forward_configs_are_runnable(n, fp8, rms):
    _check(nc.fwd_config(n, torch.bfloat16, False, fp8, rms, lean=True), n, nc.MAX_FUSED_N)


def test_lean_card_entries():
    """A lean card (utils.lean_dram: the H100) takes its own entries: LayerNorm + residual at 8K
    (NOTES P94 / P109: 32 warps at 32 programs per SM, 90.8 -> 98.8 % of the H100's copy, a loss
    on the H200); without a residual, rows of 64K in two blocked chunks of 32K, both norms and
    outputs (NOTES P110); every other width and form takes the same config on both cards, among
    them the entries first measured on an H100 that won on the H200 too (P113: LayerNorm +
    residual 64K, RMSNorm + residual 128K, LayerNorm FP8 128K). The tables' configs, before the
    card-independent chunk fill (test_fwd_config_applies_the_chunk_fill)."""
    own = {(n, False, True, False): nc.NormConfig(2, 8192, True, 32, 32, 2) for n in (5120, 6000, 8192)}
    for rms, fp8 in itertools.product([True, False], [False, True]):
        for n in (65536, 40009):  # 40009: next_pow2 65536
            own[(n, rms, False, fp8)] = nc._FWD_OVERRIDES_LEAN[(rms, fp8)][65536]
    shared = {(131072, True, True, False): nc.NormConfig(1, 32768, True, 16, 32, 2),  # NOTES P111
              (65536, False, True, False): nc.NormConfig(1, 32768, True, 16, 32, 3),
              (40009, False, True, False): nc.NormConfig(1, 32768, True, 16, 32, 3),
              (131072, False, False, True): nc.NormConfig(1, 32768, True, 32, 2, 3)}  # P110
    for (n, rms, residual, fp8), cfg in shared.items():
        for lean in (True, False):
            assert nc.table_fwd_config(n, torch.bfloat16, False, fp8, rms, residual, lean) == cfg
    for n, rms, residual, fp8 in itertools.product(WIDTHS, [True, False], [False, True], [False, True]):
        lean = nc.table_fwd_config(n, torch.bfloat16, False, fp8, rms, residual, True)
        wide = nc.table_fwd_config(n, torch.bfloat16, False, fp8, rms, residual, False)
        key = (n, rms, residual, fp8)
        if key in own:
            assert lean == own[key] and wide != lean, key
        else:
            assert lean == wide, key
    assert all(c.blocked and c.block_n == 32768 for c in nc._FWD_OVERRIDES_LEAN[(True, False)].values())


def test_lean_dram_class(monkeypatch):
    """utils.lean_dram: a GPU under LEAN_DRAM_GBPS_PER_SM of peak DRAM bandwidth per SM is lean
    (the H100 SXM's 3.35 TB/s over 132 SMs: 25.4), one over it is not (the H200's 4.9 TB/s: 37.2),
    nor one that reports none, nor a CPU tensor's device; DRAM_CLASS (1 lean, 2 wide) overrides
    the device."""
    cuda, cpu = torch.device("cuda", 0), torch.device("cpu")
    for gbps, lean in [(3352.3 / 132, True), (4915.2 / 132, False), (0.0, False),
                       (utils.LEAN_DRAM_GBPS_PER_SM - 0.1, True), (utils.LEAN_DRAM_GBPS_PER_SM, False)]:
        monkeypatch.setattr(utils, "_dram_gbps_per_sm", lambda index, v=gbps: v)
        assert utils.lean_dram(cuda) is lean, gbps
        monkeypatch.setattr(utils, "DRAM_CLASS", 1)
        assert utils.lean_dram(cuda) and utils.lean_dram(cpu)
        monkeypatch.setattr(utils, "DRAM_CLASS", 2)
        assert not utils.lean_dram(cuda) and not utils.lean_dram(cpu)
        monkeypatch.setattr(utils, "DRAM_CLASS", 0)
    assert not utils.lean_dram(cpu)


def test_layernorm_residual_entry():
    """LayerNorm's residual form at 4K keeps the register tile where the plain forward takes the
    blocked one (P84: each measured faster on its own, h200_ab_s25_p84.log); at 16K-32K it takes
    one chunk over the row (P93, h200_ab_s28_p93.log: 86.7 / 85.9 -> 93.8 / 93.8 %) where the
    plain forward takes two; at 64K a row per program in two chunks of 32K at 32 programs per SM
    (P111 / P113), where the plain forward takes two-row tiles of 16K chunks (one row in two
    chunks on a lean card, at 8 programs per SM); at 8K (session 50, Q58) one row per program in one
    chunk at 16 warps on a wide card, where the plain forward takes two-row tiles at 8 warps. The
    plain forward at 16K now takes its prefetch entry (one row in registers, NOTES P175), at 32K
    two chunks."""
    plain = nc.fwd_config(4096, torch.bfloat16, False, False, False)
    res = nc.fwd_config(4096, torch.bfloat16, False, False, False, residual=True)
    assert plain.blocked and not res.blocked
    # 8K on a wide card (NOTES Q58: the H200's sweep, 1.11x timed over the plain forward's entry)
    res8 = nc.fwd_config(8192, torch.bfloat16, False, False, False, residual=True)
    assert res8 == nc.NormConfig(1, 8192, True, 16, 32, 1)
    assert nc.fwd_config(8192, torch.bfloat16, False, False, False) != res8
    for n in (16384, 32768):
        res = nc.fwd_config(n, torch.bfloat16, False, False, False, residual=True)
        assert res.blocked and res.block_n == n
    assert nc.fwd_config(16384, torch.bfloat16, False, False, False).prefetch
    assert nc.fwd_config(32768, torch.bfloat16, False, False, False).block_n < 32768
    res64 = nc.NormConfig(1, 32768, True, 16, 32, 3)
    for lean in (False, True):
        assert nc.fwd_config(65536, torch.bfloat16, False, False, False, True, lean) == res64
        assert nc.fwd_config(65536, torch.bfloat16, False, False, False, False, lean) != res64


@pytest.mark.parametrize("n", WIDTHS)
def test_transposed_forward_config(n):
    cfg = nc.fwd_config(n, torch.bfloat16, True, True, True)
    assert (cfg.block_m, cfg.num_warps) == (nc.TRANSPOSE_BLOCK_M, nc.TRANSPOSE_WARPS)
    _check(cfg, n, nc.TRANSPOSE_BLOCK_M * nc.TRANSPOSE_BLOCK_N)


@pytest.mark.parametrize("n", WIDTHS)
@pytest.mark.parametrize("rms", [True, False])
def test_backward_configs_are_runnable(n, rms):
    _check(nc.bwd_config(n, torch.bfloat16, rms), n, nc.MAX_FUSED_N_BWD)


def test_backward_tail_rule(monkeypatch):
    """bwd_config takes the head + tail entry (NormConfig.tail, NOTES P190) at widths in (p2 / 2,
    3 p2 / 4] whose head has an entry, and the power of two's config elsewhere (7168 and 14336 fill
    7/8 of the p2 tile, and a tail of the next power of two of the rest would hold as many lanes)
    or with BWD_TAIL off."""
    for rms in (True, False):
        # RMSNorm's head of 4096 has no entry: its tail tile lost in kernel time (NOTES P190b)
        for n in (8193, 10240, 12288) + (() if rms else (4097, 5120, 6144)):
            cfg = nc.bwd_config(n, torch.bfloat16, rms)
            assert cfg.tail and cfg.block_n == triton.next_power_of_2(n) // 2, (rms, n, cfg)
        for n in (4096, 6145, 7168, 8192, 12289, 14336, 16384, 18432, 24576) + ((5120,) if rms else ()):
            assert not nc.bwd_config(n, torch.bfloat16, rms).tail, (rms, n)
    monkeypatch.setattr(nc, "BWD_TAIL", False)
    nc.bwd_config.cache_clear()
    try:
        for rms in (True, False):
            assert nc.bwd_config(5120, torch.bfloat16, False) == nc.bwd_config(8192, torch.bfloat16, False)
            assert nc.bwd_config(10240, torch.bfloat16, rms) == nc.bwd_config(16384, torch.bfloat16, rms)
    finally:
        monkeypatch.undo()
        nc.bwd_config.cache_clear()


def test_fp8_forward_between_entry():
    """fwd_config takes FWD_FP8_BETWEEN's entry for the FP8 forward without a residual at widths
    between 16K and 32K (NOTES Q94), and the tables' configs at 32K itself (Q93), with a residual,
    for the transposed tiles, for the 16-bit outputs, and past 32K."""
    entry = nc.FWD_FP8_BETWEEN[32768]
    for rms in (True, False):
        for lean in (False, True):
            for n in (16385, 18432, 20480, 24576, 28672, 32767):
                assert nc.fwd_config(n, torch.bfloat16, False, True, rms, False, lean) == entry, (n, rms)
                assert nc.fwd_config(n, torch.bfloat16, False, True, rms, True, lean) != entry, (n, rms)
                assert nc.fwd_config(n, torch.bfloat16, False, False, rms, False, lean) != entry, (n, rms)
            for n in (16384, 32768, 40960):
                assert nc.fwd_config(n, torch.bfloat16, False, True, rms, False, lean) != entry, (n, rms)
        assert nc.fwd_config(18432, torch.bfloat16, True, True, rms) != entry


def test_overrides_differ_from_the_base_table():
    """Each override entry is a measured change: one equal to the base config would be dead weight."""
    for p2, cfg in nc._FWD_FP8_OVERRIDES.items():
        assert cfg != nc.fwd_config(p2, torch.bfloat16, False, False, True), p2
    for p2, cfg in nc._LN_FWD_OVERRIDES.items():
        assert cfg != nc.fwd_config(p2, torch.bfloat16, False, False, True), p2
    for p2, cfg in nc._LN_FWD_FP8_OVERRIDES.items():
        assert cfg != nc.fwd_config(p2, torch.bfloat16, False, True, True), p2
        assert cfg != nc.fwd_config(p2, torch.bfloat16, False, False, True), p2
        # the residual form's entry; without a residual a prefetch entry may come first
        assert cfg == nc.fwd_config(p2, torch.bfloat16, False, True, False, residual=True), p2
    for (rms, fp8), table in nc._FWD_PREFETCH_OVERRIDES.items():
        for p2, cfg in table.items():  # the forward without a residual only (NOTES P175)
            assert cfg.prefetch and not cfg.blocked, (rms, fp8, p2)
            assert cfg == nc.fwd_config(p2, torch.bfloat16, False, fp8, rms), (rms, fp8, p2)
            assert cfg != nc.fwd_config(p2, torch.bfloat16, False, fp8, rms, residual=True), (rms, fp8, p2)
    for p2, cfg in nc._LN_BWD_OVERRIDES.items():
        assert cfg != nc.bwd_config(p2, torch.bfloat16, True), p2
    for p2, cfg in nc._RMS_BWD_OVERRIDES.items():
        assert cfg != nc.bwd_config(p2, torch.bfloat16, False), p2
        assert cfg == nc.bwd_config(p2, torch.bfloat16, True), p2


def test_interpreter_grid_keeps_loops_iterating():
    """On CPU tensors at most 2 programs per stand-in SM, whatever the table asks for."""
    cpu = torch.device("cpu")
    assert persistent_grid(10_000, cpu, 0, 32) == persistent_grid(10_000, cpu, 0, 2)
    assert persistent_grid(3, cpu, 0, 32) == 3


@pytest.mark.parametrize("lean", [False, True], ids=["wide", "lean"])
def test_pass2_reverse_where_measured(lean):
    """Triton's blocked pass 2 runs from the last chunk to the first (norms._pass2_reverse, NOTES
    P112) for the FP8 rows of 128K with both norms on both card classes (four chunks of 32K or
    more: e4m3 +3.5 / +2.8 on the H100, +2 on the H200), never for a 16-bit output (-5 to -6 at
    128K) nor for rows of two chunks (64K on a lean card: no gain)."""
    from engine.triton_kernels import norms

    for rms in (True, False):
        fp8_128k = nc.fwd_config(131072, torch.bfloat16, False, True, rms, False, lean)
        assert norms._pass2_reverse(fp8_128k, 131072, True), (rms, fp8_128k)
        for n in WIDTHS:
            bf16 = nc.fwd_config(n, torch.bfloat16, False, False, rms, False, lean)
            assert not norms._pass2_reverse(bf16, n, False)
        if lean:
            two = nc.fwd_config(65536, torch.bfloat16, False, True, rms, False, True)
            assert two.block_n == 32768 and not norms._pass2_reverse(two, 65536, True)



def test_fill_chunks_halves_a_mostly_empty_chunk():
    """:func:`nc.fill_chunks` (FWD_CHUNK_FILL, NOTES Q89-Q91): a row of 18432 on 32K's chunks of
    16384 fills 56 % of their lanes, so it takes two rows of 8192-column chunks (75 %), the warps,
    programs and stages unchanged; 20480 the same (62.5 % -> 83 %); rows that fill enough (24576:
    75 %), rows of one chunk (no re-read to add), register tiles and split configs stay as they
    are; a fill no chunk reaches stops at MIN_FILL_CHUNK_N."""
    cfg = nc.NormConfig(1, 16384, True, 16, 2, 4)
    assert nc.fill_chunks(cfg, 18432, 0.75) == nc.NormConfig(2, 8192, True, 16, 2, 4)
    assert nc.fill_chunks(cfg, 20480, 0.75) == nc.NormConfig(2, 8192, True, 16, 2, 4)
    assert nc.fill_chunks(cfg, 24576, 0.75) == cfg
    assert nc.fill_chunks(cfg, 16384, 0.75) == cfg  # one chunk
    assert nc.fill_chunks(cfg, 12000, 0.75) == cfg  # one chunk, masked
    assert nc.fill_chunks(cfg, 18432, 0.0) == cfg
    assert nc.fill_chunks(cfg, 18433, 1.0).block_n == nc.MIN_FILL_CHUNK_N
    assert nc.fill_chunks(cfg, 18433, 1.0).block_m == 8
    reg = nc.NormConfig(1, 32768, False, 16, 2)
    assert nc.fill_chunks(reg, 18432, 0.75) == reg
    split = nc.NormConfig(1, 8192, False, 8, 1, split=True)
    assert nc.fill_chunks(split, 18432, 0.75) == split


@pytest.mark.parametrize("fill", [0.0, 0.75])
def test_fwd_config_applies_the_chunk_fill(monkeypatch, fill):
    """fwd_config is the table's config with FWD_CHUNK_FILL applied to the 16-bit / fp32 outputs
    (0: the table's own); the transposed tiles keep the tables', and so do the FP8 outputs (the
    halving lost RMSNorm e4m3 5 points at 18432, NOTES P189) but where FWD_FP8_BETWEEN has an
    entry (test_fp8_forward_between_entry); the powers of two never change."""
    monkeypatch.setattr(nc, "FWD_CHUNK_FILL", fill)
    nc.fwd_config.cache_clear()
    try:
        for n in (4096, 16384, 18432, 20480, 32768, 40960, 65536, 131072):
            for fp8, rms, res in itertools.product([False, True], [True, False], [False, True]):
                if fp8 and res:
                    continue
                table = nc.table_fwd_config(n, torch.bfloat16, False, fp8, rms, res)
                got = nc.fwd_config(n, torch.bfloat16, False, fp8, rms, res)
                if fp8 and not _pow2(n) and n < 32768:
                    assert got == nc.FWD_FP8_BETWEEN[32768]
                else:
                    assert got == (nc.fill_chunks(table, n, fill) if fill and not fp8 else table)
                if _pow2(n):
                    assert got == table
                _check(got, n, nc.MAX_FUSED_N)
        assert nc.fwd_config(18432, torch.bfloat16, True) == nc.table_fwd_config(18432, torch.bfloat16, True)
    finally:
        monkeypatch.undo()
        nc.fwd_config.cache_clear()
