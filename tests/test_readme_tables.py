"""benchmarks/readme_tables.py: the README's result tables from one or more run.py JSON files."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks import readme_tables  # noqa: E402


def _row(op, impl, n, pct):
    return {"op": op, "impl": impl, "N": n, "M": (64 << 20) // n, "timing": "device", "pct_copy": pct}


def test_two_runs_first_wins_and_layernorm_fp8_rows(tmp_path, capsys):
    """Rows of both runs appear; a cell both runs measured (cast_transpose is in every FP8 run)
    shows the first file's number, not whichever came last."""
    main = {"rows": [_row("rms >e4m3 dly", "cuda", 1024, 79.0), _row("castT e4m3", "cuda", 1024, 82.0),
                     _row("castT e4m3", "compile", 1024, 39.0)]}
    ln = {"rows": [_row("ln >e4m3 dly", "cuda", 1024, 66.0), _row("castT e4m3", "cuda", 1024, 81.0),
                   _row("castT e4m3", "compile", 1024, 40.0)]}
    a, b = tmp_path / "all.json", tmp_path / "ln.json"
    a.write_text(json.dumps(main))
    b.write_text(json.dumps(ln))
    assert readme_tables.main([str(a), str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    cast = [ln_ for ln_ in lines if ln_.startswith("castT e4m3") and " cuda " in ln_]
    assert len(cast) == 1 and cast[0].split()[-1] == "82"
    assert any(ln_.startswith("ln >e4m3 dly") and ln_.split()[-1] == "66" for ln_ in lines)
    assert any(ln_.startswith("castT e4m3") and "39 compile" in ln_ for ln_ in lines)


def test_kernel_table(tmp_path, capsys):
    """--kernels: one profile_kernels.py JSON to one row per (op, impl), a cell per width, "-"
    where that width was not measured; ops with no row are left out."""
    rows = [{"norm": "rmsnorm", "mode": "fwd", "impl": "cuda", "n": 1024, "kernels_pct": 91.6},
            {"norm": "rmsnorm", "mode": "fwd", "impl": "cuda", "n": 2048, "kernels_pct": 88.4},
            {"norm": "rmsnorm", "mode": "fwd", "impl": "triton", "n": 1024, "kernels_pct": 95.2},
            {"norm": "layernorm", "mode": "fwd+bwd", "impl": "cuda", "n": 2048, "kernels_pct": 80.5},
            {"norm": "rmsnorm", "mode": "cast-T", "impl": "cuda", "n": 1024, "kernels_pct": 85.7}]
    p = tmp_path / "profk.json"
    p.write_text(json.dumps({"rows": rows}))
    assert readme_tables.main(["--kernels", str(p)]) == 0
    lines = [ln_.split() for ln_ in capsys.readouterr().out.splitlines()]
    assert ["rms", "fwd", "cuda", "92", "88"] in lines
    assert ["rms", "fwd", "triton", "95", "-"] in lines
    assert ["ln", "f+b", "cuda", "-", "80"] in lines  # 80.5 rounds to even
    assert ["castT", "e4m3", "cuda", "86", "-"] in lines
    assert not any(ln_[:2] == ["rms", "f+b"] for ln_ in lines)


def test_bar_summary(tmp_path, capsys):
    """--bars: the cells with a bar (the residual form to e4m3 has none) counted against it, the
    ones under it listed, and with --against the cells that crossed it since, either way (a cell
    on its bar meets it)."""
    def row(norm, mode, impl, n, pct):
        return {"norm": norm, "mode": mode, "impl": impl, "n": n, "kernels_pct": pct}

    old = [row("rmsnorm", "fwd", "cuda", 1024, 89.9), row("layernorm", "fp8-T", "triton", 2048, 76.0),
           row("rmsnorm", "cast-T", "cuda", 1024, 81.0), row("rmsnorm", "res-fp8", "cuda", 1024, 50.0)]
    new = [row("rmsnorm", "fwd", "cuda", 1024, 90.0), row("layernorm", "fp8-T", "triton", 2048, 74.9),
           row("rmsnorm", "cast-T", "cuda", 1024, 79.0), row("rmsnorm", "res-fp8", "cuda", 1024, 50.0),
           row("layernorm", "fwd+bwd", "cuda", 4096, 80.0)]
    a, b = tmp_path / "new.json", tmp_path / "old.json"
    a.write_text(json.dumps({"rows": new}))
    b.write_text(json.dumps({"rows": old}))
    assert readme_tables.main(["--bars", str(a), "--against", str(b)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "2 of 4 cells with a bar meet it"
    assert sorted(lines[1:3]) == ["under: castT e4m3 cuda 1K 79.0 (bar 80)",
                                  "under: ln >e4m3+T triton 2K 74.9 (bar 75)"]
    assert sorted(lines[3:]) == ["over now: rms fwd cuda 1K 89.9 -> 90.0 (bar 90)",
                                 "under now: castT e4m3 cuda 1K 81.0 -> 79.0 (bar 80)",
                                 "under now: ln >e4m3+T triton 2K 76.0 -> 74.9 (bar 75)"]
    assert readme_tables.main(["--bars", str(a)]) == 0
    assert len(capsys.readouterr().out.splitlines()) == 3
