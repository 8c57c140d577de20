"""Every benchmark script imports (a benchmark is run by hand, and nothing else would notice
a name it imports moving away: bench_sim_workers and bench_sim_cost imported GRID from
bench_sim_fidelity after it had moved to sim_fidelity_grids)."""
from __future__ import annotations

import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.mark.parametrize("name", sorted(p.stem for p in BENCHMARKS.glob("*.py")
                                        if p.stem != "__init__"))
def test_the_benchmark_imports(name, monkeypatch):
    # the routing scripts run as `python benchmarks/X.py`: their folder is on sys.path
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    module = importlib.import_module(f"benchmarks.{name}")
    assert module.__doc__, f"benchmarks/{name}.py says nothing of what it measures"
