"""The simulator's warm-up (tuner/sim/simulate.py, SimContext.warmup_requests): the same
stream served before the scored window, its requests not scored, so that a load is
measured in the workload's steady state (a filled prefix cache, grown sessions), as the
real capacity search's later probes on one engine are."""
from __future__ import annotations

import dataclasses

import pytest

from loadtests.workloads import get_workload
from tuner.measure.capacity import settled_attainment
from tuner.sim.context import SimContext
from tuner.sim.profile import Fit
from tuner.sim.simulate import simulate
from tuner.sim.stream import TraceStream

from test_sim_settle import PROFILE, TRACE   # 2 ms a token; a request a second
from test_sim_settle import SLOS as TRACE_SLOS
SETTINGS = dict(max_num_seqs=64, cpu_memory_gib=0.5)


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


def _rag(warmup_requests: int) -> SimContext:
    spec = get_workload("rag")
    return SimContext(PROFILE, {"rag": {"ttft": 1.5, "e2e": 6.0}}, workload=spec, users=3,
                      length_scale=0.25, duration=20.0, warmup_requests=warmup_requests)


def test_only_the_windows_arrivals_are_scored(hf_config):
    stream = TraceStream(TRACE, rate=4.0, max_model_len=2048)
    result = simulate(PROFILE, SETTINGS, stream, duration=30.0, warmup=10.0, slos=TRACE_SLOS,
                      hf_config=hf_config)
    starts = sorted(r["start"] for r in result.samples.records)
    assert starts[0] >= 10.0 and starts[-1] <= 40.0
    # every arrival of [10, 40] is recorded, finished or not, and none before
    assert len(starts) == sum(10.0 <= i / 4.0 <= 40.0 for i in range(len(TRACE)))
    assert (result.samples.start, result.samples.stop) == (10.0, 40.0)
    with pytest.raises(ValueError, match="warm-up must be >= 0"):
        simulate(PROFILE, SETTINGS, TraceStream(TRACE, rate=4.0, max_model_len=2048),
                 duration=30.0, warmup=-1.0, slos=TRACE_SLOS, hf_config=hf_config)


@pytest.mark.parametrize("rate", [3.0, 4.0, 4.4, 6.0, 12.0])
def test_a_warm_probe_stops_early_with_the_full_runs_verdict(hf_config, rate):
    """The settling rule counts the window's requests only: its settled share is the
    full run's (a warm-up request still running is no miss of the window's)."""
    def run(probe: bool):
        return simulate(PROFILE, SETTINGS, TraceStream(TRACE, rate=rate, max_model_len=2048),
                        duration=40.0, warmup=20.0, slos=TRACE_SLOS, hf_config=hf_config,
                        probe_for=0.9 if probe else None)
    full, probe = run(False), run(True)
    share, count = settled_attainment(full.samples, TRACE_SLOS)
    early, early_count = settled_attainment(probe.samples, TRACE_SLOS)
    assert (share >= 0.9) == (early >= 0.9)
    if not probe.figures["gave_up"]:
        assert (early, early_count) == (share, count)
    assert count == sum(20.0 <= i / rate <= 50.0 for i in range(len(TRACE)))
    if rate == 12.0:   # far past the knee (4.17): given up within an eighth of the window
        assert probe.figures["gave_up"] and probe.figures["stopped_at"] < 20.0 + 40.0 / 8


def test_a_workloads_warm_up_is_its_requests_at_the_rate():
    warm_ctx = _rag(60)
    cold, warm = _rag(0).run({}, 2.0), warm_ctx.run({}, 2.0)
    assert min(r["start"] for r in cold.samples.records) < 2.0
    # 60 requests at 2 req/s: the window starts 30 virtual s in
    assert min(r["start"] for r in warm.samples.records) >= 30.0
    assert warm.samples.start == 30.0 and warm.samples.stop == 50.0
    # the window's own counters: rag repeats its documents, and a warm cache has them
    assert warm.figures["prefix_cache_hit_rate"] > cold.figures["prefix_cache_hit_rate"] + 0.05
    # ... counted over the window alone: the same 50 s counted whole read lower
    whole = SimContext(PROFILE, warm_ctx.slos, workload=warm_ctx.workload, users=3,
                       length_scale=0.25, duration=50.0).run({}, 2.0)
    assert warm.figures["prefix_cache_hit_rate"] > whole.figures["prefix_cache_hit_rate"] + 0.03


def test_a_trace_has_no_warm_up(hf_config):
    ctx = SimContext(PROFILE, TRACE_SLOS, trace=TRACE, duration=20.0, warmup_requests=100)
    assert ctx.run(SETTINGS, 4.0).samples.start == 0.0


def test_the_settling_rule_ignores_the_warm_ups_requests():
    from types import SimpleNamespace

    from tuner.sim.settle import Settling
    slos = {"k": {"ttft": 1.0}}
    settle = Settling(slos, duration=40.0, start=10.0, front=0.0, settled_arrivals=10,
                      give_up_below=0.9)
    assert settle.cutoff == 10.0 + 0.75 * 40.0
    settle.finished({"kind": "k", "start": 5.0, "ttft": 9.0})   # a warm-up miss
    assert settle.misses == 0
    settle.finished({"kind": "k", "start": 12.0, "ttft": 9.0})  # the window's
    assert settle.misses == 1
    # two warm-up requests still waiting, certain misses: not the window's, no give-up
    stuck = {f"w{i}": (SimpleNamespace(kind="k", arrival=4.0, max_tokens=8), None, [])
             for i in range(2)}
    assert not settle.decided(stuck, now=12.0) and not settle.failed
    stuck["x"] = (SimpleNamespace(kind="k", arrival=11.0, max_tokens=8), None, [])
    settle.next_check = 0.0
    assert settle.decided(stuck, now=12.5) and settle.failed   # 1 + 1 of 10: below 0.9


def test_the_windows_step_counters_are_the_runs_less_the_warm_up(hf_config):
    """The profiled runner sums what the engine's step counters sum (seconds, each shape
    figure); a run with a warm-up reports the window's part: the same stream run whole
    equals its warm-up run on its own plus the window."""
    profile = dataclasses.replace(PROFILE, fit=Fit("attention", {
        "intercept": 0.001, "prefill_tokens": 0.002, "prefill_attention": 1e-7,
        "decode_seqs": 0.003, "decode_context": 1e-6, "draft_tokens": 0.002}, 0.0))

    def run(duration: float, warmup: float) -> dict:
        return simulate(profile, SETTINGS, TraceStream(TRACE, rate=4.0, max_model_len=2048),
                        duration=duration, warmup=warmup, slos=TRACE_SLOS,
                        hf_config=hf_config).figures
    whole, warm_part, window = run(30.0, 0.0), run(10.0, 0.0), run(20.0, 10.0)
    names = ("steps", "step_seconds", "step_prefill_tokens", "step_decode_seqs",
             "step_decode_context", "step_prefill_attention", "step_blocks_read")
    for name in names:
        assert window[name] > 0 and warm_part[name] > 0
        assert window[name] + warm_part[name] == pytest.approx(whole[name], rel=1e-9), name
    # the seconds are the profile's for the summed shape (a linear form)
    fit = profile.fit
    shape = {k[len("step_"):]: v for k, v in window.items() if k.startswith("step_")}
    predicted = fit.coefficients["intercept"] * window["steps"] + sum(
        c * shape[k] for k, c in fit.coefficients.items() if k != "intercept")
    assert window["step_seconds"] == pytest.approx(predicted, rel=1e-9)


def test_a_lead_follows_the_warm_up_whose_backlog_is_dropped(hf_config):
    """lead: the warm-up fills the cache; what it leaves running is dropped at its end (as
    the load client's stop drops a real probe's), then `lead` s at the rate build the
    window's own queue, unscored; the window begins after both."""
    def run(warmup: float, lead: float):
        return simulate(PROFILE, SETTINGS, TraceStream(TRACE, rate=5.0, max_model_len=2048),
                        duration=20.0, warmup=warmup, lead=lead, slos=TRACE_SLOS,
                        hf_config=hf_config)
    led, continued = run(20.0, 5.0), run(25.0, 0.0)   # both windows begin at 25 s
    for result in (led, continued):
        assert (result.samples.start, result.samples.stop) == (25.0, 45.0)
        assert min(r["start"] for r in result.samples.records) >= 25.0
        assert len(result.samples.records) == sum(25.0 <= i / 5.0 <= 45.0
                                                  for i in range(len(TRACE)))

    def first_ttft(result):   # 5 req/s past a knee of ~4: the queue grows, and decides it
        return min(result.samples.records, key=lambda r: r["start"]).get("ttft") or 1e9
    # the window's queue is the lead's 5 s, not the warm-up's 15 s
    assert first_ttft(led) < first_ttft(continued) / 2
    assert led.figures["completed"] > continued.figures["completed"]
    with pytest.raises(ValueError, match="lead must be >= 0"):
        run(10.0, -1.0)
