"""benchmarks/bench_anchor.py: the anchor against the former secant on synthetic curves."""
from __future__ import annotations

import pytest

from benchmarks import bench_anchor


@pytest.mark.parametrize("kind", ["power", "steep", "cliff"])
def test_the_anchor_reaches_the_pilot_at_least_as_often_as_the_secant(kind):
    reached = {"secant": 0, "anchor": 0}
    for seed in range(60):
        capacity, real = bench_anchor.curve(kind, seed, 0.2)
        for name, method in (("secant", bench_anchor.secant), ("anchor", bench_anchor.anchor)):
            got, sims = method(capacity, real)
            assert 0 <= sims <= 8
            reached[name] += abs(got - real) / real <= bench_anchor.TOLERANCE + 1e-9
    assert reached["anchor"] >= reached["secant"] + 6, reached   # 10 % of the curves more


def test_a_noiseless_power_law_is_reached_by_both():
    for seed in range(20):
        capacity, real = bench_anchor.curve("power", seed, 0.0)
        for method in (bench_anchor.secant, bench_anchor.anchor):
            got, _ = method(capacity, real)
            assert got == pytest.approx(real, rel=bench_anchor.TOLERANCE + 1e-9)


def test_the_table_prints_both_methods_per_shape(capsys, monkeypatch):
    monkeypatch.setattr("sys.argv", ["bench_anchor", "--curves", "5"])
    bench_anchor.main()
    rows = [line for line in capsys.readouterr().out.splitlines() if line.startswith("| ")]
    assert len(rows) == 1 + 3 * 3 * 2
    assert sum("| anchor |" in row for row in rows) == 9
