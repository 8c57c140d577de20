"""The capacity search (tuner/measure/capacity.py): the capacity read between the probes
that bracket the attainment, and the bracket that grows by its factor from any start until
a probe fails, then bisects to the knee."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from tuner.measure.capacity import CapacityResult, interpolated, search_capacity


def _probes(*rows):
    return CapacityResult(rate=0, upper=None, attainment=0.9, probes=[
        {"rate": r, "attainment": a, "requests": 100, "passed": a >= 0.9} for r, a in rows])


def test_interpolated_reads_the_crossing_between_the_bracketing_probes():
    # passed at 10 (0.98), failed at 12 (0.58) and 20: 0.9 is a fifth of the way down
    assert interpolated(_probes((20, 0.1), (10, 0.98), (12, 0.58))) == pytest.approx(10.4)
    assert interpolated(_probes((8, 0.95), (16, 0.97))) == 16        # nothing failed above
    assert interpolated(_probes((8, 0.5), (4, 0.7))) == 0.0           # nothing passed
    # a failure below the highest pass is not its bracket
    assert interpolated(_probes((4, 0.85), (8, 0.95), (10, 0.9))) == 10
    assert interpolated(_probes((10, 0.9), (12, 0.9 - 1e-9))) == pytest.approx(10)


def _knee(capacity: float):
    """A system meeting the SLOs below `capacity` req/s, failing above it."""
    from tuner.measure.scoring import Samples

    def probe(rate: float) -> Samples:
        ok = rate <= capacity
        records = [{"kind": "chat", "start": i / 10, "ok": True, "ttft": 0.1 if ok else 9.0,
                    "e2e": 1.0, "itl": [], "output_tokens": 1} for i in range(10)]
        return Samples(records=records, start=0.0, stop=1.0)
    return probe


@pytest.mark.parametrize("start, growth", [(1.0, 2.0), (30.0, 1.25), (100.0, 1.5)])
def test_the_bracket_grows_by_its_factor_and_finds_the_knee(start, growth):
    result = search_capacity(_knee(37.0), {"chat": {"ttft": 1.0}}, start=start,
                             rel_tol=0.05, max_probes=30, growth=growth)
    assert result.rate <= 37.0 < result.upper <= result.rate * 1.05
    first = [p["rate"] for p in result.probes[:2]]
    assert first[1] / first[0] == pytest.approx(growth if first[0] <= 37 else 1 / growth)


def test_a_growth_that_cannot_bracket_is_refused():
    with pytest.raises(ValueError, match="growth must be > 1"):
        search_capacity(_knee(1), {}, start=1.0, growth=1.0)


@pytest.mark.parametrize("truth", [0.3, 45.0, 700.0])
def test_a_simulated_capacity_from_1_req_s_is_bracketed_however_high(truth):
    """The sweep simulates the baseline from 1 req/s: its search brackets and bisects to
    within 10 % wherever the capacity lies (it once stopped at 1.5^9 = 38.44 req/s)."""
    from tuner.search.capacity_search import simulate_point

    class Sim:
        def capacity(self, settings, **search):
            return search_capacity(_knee(truth), {"chat": {"ttft": 1.0}}, **search)
    point = simulate_point(SimpleNamespace(sim=Sim(), sim_base={}), {}, start=1.0)
    assert point.result.upper is not None                       # a failing probe found
    assert truth / 1.1 <= point.capacity <= truth


@pytest.mark.parametrize("start, probes, walk", [
    (36.0, 2, 1), (38.5, 2, 1), (30.0, 4, 2), (45.0, 4, 2), (100.0, 8, 4)])
def test_small_steps_that_square_bracket_near_starts_in_two_probes_and_far_ones_still(
        start, probes, walk):
    """growth 1.08 squaring to 2: a start within a step of the knee (37) brackets in two
    probes, within 8 % (1.25x steps then a bisection to 10 %: four); 20 % off in four (as
    before); 2.7x off walks 1.08, 1.17, 1.36, 1.85 and bisects to the same tolerance."""
    result = search_capacity(_knee(37.0), {"chat": {"ttft": 1.0}}, start=start,
                             rel_tol=0.1, max_probes=8, growth=1.08, max_growth=2.0)
    assert result.rate <= 37.0 < result.upper <= result.rate * 1.1
    assert len(result.probes) == probes
    rates = [p["rate"] for p in result.probes]
    factors = [max(b / a, a / b) for a, b in zip(rates, rates[1:])][:walk]
    assert factors == pytest.approx([1.08 ** 2 ** k for k in range(walk)])


def test_a_max_growth_below_the_growth_is_refused():
    with pytest.raises(ValueError, match="max_growth"):
        search_capacity(_knee(1), {}, start=1.0, growth=1.5, max_growth=1.2)
