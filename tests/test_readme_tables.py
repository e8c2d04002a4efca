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
