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


# ---- a probe holds only when its queue does not grow -------------------------------------

def _queue(rate: float, *, slope: float, base: float = 0.1, n: int = 80, window: float = 8.0,
           kind: str = "chat", fail_late: bool = False):
    """`n` requests sent evenly over `window` s, each with TTFT base + slope x its send
    time (a queue building at `slope` s of wait per s), every one meeting a 3-s TTFT SLO;
    with `fail_late`, the later requests got no first token."""
    from tuner.measure.scoring import Samples

    records = [{"kind": kind, "start": i * window / n, "ok": not (fail_late and i > n // 3),
                "ttft": base + slope * i * window / n, "e2e": 1.0, "itl": [],
                "output_tokens": 1} for i in range(n)]
    return Samples(records=records, start=0.0, stop=window)


SLO3 = {"chat": {"ttft": 3.0}}


def test_a_queue_that_grows_fails_the_probe_though_every_request_met_its_slo():
    from tuner.measure.capacity import SUSTAIN_SECONDS, probe_verdict, queue_growth

    flat = probe_verdict(_queue(10, slope=0.0), SLO3, 0.9)
    assert flat["passed"] and flat["growth"] == pytest.approx(0.0) and flat["attainment"] == 1
    # 0.2 s of wait per s: the settled 6 s stay under 1.3 s, but a minute more would not
    building = probe_verdict(_queue(10, slope=0.2), SLO3, 0.9)
    assert building["attainment"] == 1 and not building["passed"]
    assert building["growth"] == pytest.approx(0.2 / 3.0, rel=0.02)
    # the rule's edge: the later half's median share plus SUSTAIN_SECONDS of its growth
    late, growth = queue_growth(_queue(10, slope=0.004), SLO3)
    assert late + growth * SUSTAIN_SECONDS == pytest.approx(
        (0.1 + 0.004 * 4.45) / 3 + 0.004 / 3 * SUSTAIN_SECONDS, rel=0.02)
    for slope, holds in ((0.03, True), (0.045, False)):   # 0.73 and 1.04 of the SLO
        assert probe_verdict(_queue(10, slope=slope), SLO3, 0.9)["passed"] is holds, slope


def test_how_long_the_queue_must_hold_is_the_callers():
    """0.045 s of wait per s: 1.04 of the SLO a minute ahead, 0.28 ten seconds ahead, and
    0.05 now; the search on a replica whose queue builds above 12 req/s finds its knee
    with 60 s and the attainment's ceiling with 0 s."""
    from tuner.measure.capacity import probe_verdict

    queue = _queue(10, slope=0.045)
    assert not probe_verdict(queue, SLO3, 0.9)["passed"]                  # 60 s
    assert probe_verdict(queue, SLO3, 0.9, sustain=10.0)["passed"]
    assert not probe_verdict(_queue(10, slope=0.3), SLO3, 0.9, sustain=10.0)["passed"]
    assert probe_verdict(_queue(10, slope=0.3), SLO3, 0.9, sustain=0.0)["passed"]
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="spec.capacity.sustainSeconds"):
            probe_verdict(queue, SLO3, 0.9, sustain=bad)

    def probe(rate: float):   # every request inside the SLO up to 20 req/s, queue or not
        return _queue(rate, slope=max(0.0, rate - 12.0) * 0.05 if rate <= 20 else 5.0)
    # held a minute: 0.045 s/s at most ((0.1 + 4.5 x 0.045) / 3 + 0.045 / 3 x 60 = 1)
    held = search_capacity(probe, SLO3, start=4.0, rel_tol=0.02, max_probes=20)
    now = search_capacity(probe, SLO3, start=4.0, rel_tol=0.02, max_probes=20, sustain=0.0)
    assert 12.5 < held.rate <= 12.9 and 19.5 < now.rate <= 20, (held.rate, now.rate)


def test_a_burst_that_lifts_part_of_the_later_half_is_not_a_growing_queue():
    """A stable queue's busy period: the later half's TTFTs spread over 0.1-0.9 s where
    the earlier half's spread over 0.1-0.5 s. Their medians differ (0.3 -> 0.5 s, which a
    minute ahead would pass the 3-s SLO), but the later half did not shift as a whole (its
    lower quartile is below the earlier half's upper one): no growth, the probe holds. A
    ramp of the same medians shifts the whole half and fails."""
    from tuner.measure.capacity import SUSTAIN_SECONDS, probe_verdict, queue_growth
    from tuner.measure.scoring import Samples

    def samples(early_spread, late_spread, ramp=0.0):
        records = [{"kind": "chat", "start": i * 0.1, "ok": True, "e2e": 1.0, "itl": [],
                    "output_tokens": 1,
                    "ttft": 0.1 + ramp * i * 0.1 + (late_spread if i >= 30 else early_spread)
                    * (i * 7 % 10) / 9} for i in range(80)]
        return Samples(records=records, start=0.0, stop=8.0)

    burst = samples(0.4, 0.8)
    late, growth = queue_growth(burst, SLO3)
    assert growth == 0.0 and late == pytest.approx(0.5 / 3, rel=0.15)
    assert probe_verdict(burst, SLO3, 0.9)["passed"]
    # the same medians' difference over the halves' send times, read as growth, fails
    shifted = samples(0.0, 0.0, ramp=0.2 / 3.0)
    late, growth = queue_growth(shifted, SLO3)
    assert growth > 0 and late + growth * SUSTAIN_SECONDS > 1
    assert not probe_verdict(shifted, SLO3, 0.9)["passed"]


def test_requests_without_a_first_token_grow_the_queue_and_kinds_without_a_ttft_slo_do_not():
    from tuner.measure.capacity import probe_verdict, queue_growth

    # two thirds failed, all in the later half: an infinite median there
    assert queue_growth(_queue(10, slope=0.0, fail_late=True), SLO3)[1] == float("inf")
    assert not probe_verdict(_queue(10, slope=0.0, fail_late=True), SLO3, 0.0)["passed"]
    # without a TTFT SLO (or with too few requests) the attainment alone decides
    assert queue_growth(_queue(10, slope=0.2), {"chat": {"e2e": 30.0}}) is None
    assert probe_verdict(_queue(10, slope=0.2), {"chat": {"e2e": 30.0}}, 0.9)["passed"]
    assert queue_growth(_queue(10, slope=0.2, n=3), SLO3) is None   # 3 settled


def test_the_search_stops_where_the_queue_starts_to_grow():
    """A replica whose queue builds above 12 req/s (every request inside the SLO for a
    probe's window up to 12.5 req/s): the search finds 12; the failing probe that brackets
    it met the attainment (its queue grew), and the capacity is not read past it."""
    def probe(rate: float):
        return _queue(rate, slope=max(0.0, rate - 12.0) * 0.5)
    result = search_capacity(probe, SLO3, start=4.0, rel_tol=0.05, max_probes=20)
    assert 12.0 / 1.05 <= result.rate <= 12.1 < result.upper <= result.rate * 1.06
    top = min((p for p in result.probes if not p["passed"]), key=lambda p: p["rate"])
    assert top["rate"] == result.upper and top["attainment"] == 1   # its queue grew
    assert interpolated(result) == result.rate


def test_a_probe_failed_by_its_queue_alone_is_not_read_as_a_crossing():
    """Passed at 10 (0.98), failed at 12 with 0.95 met (its queue grew): the attainment
    never crossed 0.9 between them, so the capacity is 10, not a point toward 12."""
    result = CapacityResult(rate=10, upper=12, attainment=0.9, probes=[
        {"rate": 10, "attainment": 0.98, "requests": 100, "passed": True},
        {"rate": 12, "attainment": 0.95, "requests": 100, "passed": False}])
    assert interpolated(result) == 10
