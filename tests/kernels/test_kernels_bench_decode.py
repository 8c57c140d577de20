"""benchmarks/bench_decode.py end to end on a tiny checkpoint: it must keep running (scripts rot
otherwise) and print one row per backend plus the ceiling, with ratios. Speed is not asserted."""

from __future__ import annotations

import importlib.util
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def _load_script():
    spec = importlib.util.spec_from_file_location("bench_decode", REPO / "benchmarks" / "bench_decode.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_table_has_every_row_and_ratio(tiny_checkpoints, capsys):
    bench = _load_script()
    assert bench.main(["--model", str(tiny_checkpoints["mistral"]), "--batch", "3", "--context", "21",
                       "--rounds", "2", "--turn-steps", "1", "--threads", "1,2", "--block-size", "4"]) == 0
    out = capsys.readouterr().out
    # one table per thread count, from the same run
    tables = out.split("\n## ")[1:]
    assert [t.splitlines()[0] for t in tables] == ["1 thread", "2 threads"]
    for table in tables:
        rows = [line for line in table.splitlines()
                if line.startswith("| engine") or line.startswith("| ceiling")]
        assert [r.split("|")[1].strip() for r in rows] == [
            "engine (torch-reference)", "engine (torch)", "ceiling: transformers batched decode"]
        assert all(float(r.split("|")[2]) > 0 for r in rows)  # tok/s
        assert rows[2].split("|")[4].strip() == "1.00x"  # the ceiling against itself
        assert "engine (torch) vs engine (torch-reference):" in table
