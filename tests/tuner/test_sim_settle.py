"""tuner/sim/settle.py: a simulated capacity probe stops once its verdict is decided, and
nothing the search reads changes: the verdict always, the settled share whenever the stop
was exact, the capacity and its interpolation for the whole search."""
from __future__ import annotations

from types import SimpleNamespace

import pytest

from loadtests.workloads import get_workload
from loadtests.workloads.trace import TraceRequest
from tuner.measure.capacity import interpolated, settled_attainment
from tuner.sim.profile import Fit, Identity, Memory, Profile
from tuner.sim.settle import Settling
from tuner.sim.simulate import sim_capacity, simulate
from tuner.sim.stream import TraceStream, WorkloadStream

# 2 ms per token and nothing else: one replica serves 1 / (0.002 x 120) = 4.17 req/s
PROFILE = Profile(Identity("builtin://default", "f" * 64, "cpu", "2.13.0", 1),
                  Fit("tokens", {"intercept": 0.0, "num_tokens": 0.002}, 0.0),
                  Memory(0.0, 1.3e7, 4096, 0.0, 2e4, 2048, 609), 100)
TRACE = [TraceRequest(timestamp=float(i), prompt_tokens=100, output_tokens=20)
         for i in range(400)]
SLOS = {"trace": {"ttft": 2.0, "tpot": 0.08}}
DURATION = 60.0


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


def _run(hf_config, rate: float, probe: bool):
    return simulate(PROFILE, dict(max_num_seqs=64, cpu_memory_gib=0.5),
                    TraceStream(TRACE, rate=rate, max_model_len=2048), duration=DURATION,
                    slos=SLOS, hf_config=hf_config, probe_for=0.9 if probe else None)


@pytest.mark.parametrize("rate", [2.0, 4.0, 4.4, 5.0, 12.0])
def test_a_probe_stops_early_with_the_full_runs_verdict(hf_config, rate):
    full, probe = _run(hf_config, rate, False), _run(hf_config, rate, True)
    share, count = settled_attainment(full.samples, SLOS)
    early, early_count = settled_attainment(probe.samples, SLOS)
    assert (share >= 0.9) == (early >= 0.9)
    assert probe.figures["stopped_at"] < DURATION
    assert probe.figures["steps"] < full.figures["steps"]
    if probe.figures["gave_up"]:
        assert share < 0.9
    else:   # stopped exactly: every settled request already decided
        assert (early, early_count) == (share, count)
    if rate == 12.0:   # far past the knee: given up within a third of the window
        assert probe.figures["gave_up"] and probe.figures["stopped_at"] < DURATION / 3


def test_the_search_on_stopped_probes_finds_what_it_finds_on_full_ones(hf_config):
    full = sim_capacity(lambda rate, probe: _run(hf_config, rate, False), SLOS, rel_tol=0.02)
    fast = sim_capacity(lambda rate, probe: _run(hf_config, rate, probe), SLOS, rel_tol=0.02)
    assert (fast.rate, fast.upper) == (full.rate, full.upper)
    assert [p["passed"] for p in fast.probes] == [p["passed"] for p in full.probes]
    assert 0.9 / 0.24 <= fast.rate <= 1.03 / 0.24   # the knee, 4.17 req/s
    # the bracket's top was given up and run again in full: its share is the full one
    assert [p for p in fast.probes if p.get("rerun")]
    assert interpolated(fast) == interpolated(full)


def test_a_running_request_is_a_certain_miss_only_past_a_bound():
    settle = Settling({"k": {"ttft": 2.0, "tpot": 0.1, "e2e": 9.0}}, duration=40.0,
                      front=0.5, settled_arrivals=10)
    request = SimpleNamespace(kind="k", arrival=1.0, max_tokens=11)
    assert not settle.certain_miss(request, [], now=2.5)        # waited 2.0: may still make it
    assert settle.certain_miss(request, [], now=2.51)           # TTFT > 2.0 whenever it comes
    assert not settle.certain_miss(request, [2.0], now=3.0)     # 10 gaps due, 1.0 s so far
    assert settle.certain_miss(request, [2.0], now=3.01)        # TPOT > 0.1 whatever follows
    assert settle.certain_miss(request, [2.0, 2.01], now=9.51)  # E2E > 9.0
    single = SimpleNamespace(kind="k", arrival=1.0, max_tokens=1)
    assert not settle.certain_miss(single, [2.0], now=9.0)      # one token: no gaps
    other = SimpleNamespace(kind="other", arrival=0.0, max_tokens=5)
    assert not settle.certain_miss(other, [], now=100.0)        # no SLO for its kind


def test_a_failure_is_given_up_only_when_the_target_is_out_of_reach():
    settle = Settling({"k": {"ttft": 1.0}}, duration=40.0, front=0.0, settled_arrivals=10,
                      give_up_below=0.9)
    late = [(f"r{i}", (SimpleNamespace(kind="k", arrival=0.0, max_tokens=4), None, []))
            for i in range(2)]
    settle.finished({"start": 0.0, "kind": "k", "ok": False})
    assert not settle.decided(dict(late[:0]), now=5.0)           # 1 miss: 9 of 10 may meet
    assert not settle.failed
    assert settle.decided(dict(late[:1]), now=6.0) and settle.failed  # 2 misses: 8 of 10 at best
    settle = Settling({"k": {"ttft": 1.0}}, duration=40.0, front=0.0, settled_arrivals=10,
                      give_up_below=0.9)
    settle.finished({"start": 30.01, "kind": "k", "ok": False})  # after the cutoff: ignored
    assert not settle.decided(dict(late[:1]), now=5.0)
    settle.finished({"start": 30.0, "kind": "k", "ok": False})   # at the cutoff: settled
    assert settle.misses == 1
    assert not settle.decided({}, now=5.5)                       # checked once a second
    assert settle.decided({}, now=30.0) and not settle.failed    # settled: exactly decided


def test_arrivals_until_counts_what_the_stream_will_deliver():
    workload = WorkloadStream(get_workload("chat"), rate=7.0, users=3,
                              render=lambda request: [1, 2, 3], max_model_len=2048)
    trace = TraceStream(TRACE, max_model_len=2048)   # its own pace: one a second, on 10.0
    looped = TraceStream(TRACE, max_model_len=2048, loop=True, rate=3.0)
    for stream in (workload, trace, looped):
        expected = {t: stream.arrivals_until(t) for t in (0.5, 10.0, 33.3)}
        popped = 0
        for t in sorted(expected):
            while stream.next_time() <= t:
                stream.pop()
                popped += 1
            assert popped == expected[t] > 0


def test_a_looped_trace_restarts_one_mean_gap_after_its_end_with_new_prompts():
    """The SLO planner's trace of a mix is a sample: replayed faster than it lasts, it
    starts again, so a probe's window stays loaded (without the loop, 400 requests sent at
    once met a 3 s TTFT and every rate up to the search's cap passed)."""
    short = [TraceRequest(timestamp=10.0 + t, prompt_tokens=8, output_tokens=4)
             for t in (0.0, 1.0, 3.0)]   # a span of 3 s, a mean gap of 1.5 s
    once = TraceStream(short, max_model_len=2048)
    stream = TraceStream(short, max_model_len=2048, loop=True)
    times, prompts = [], []
    for _ in range(7):
        times.append(stream.next_time())
        prompts.append(tuple(stream.pop().prompt_ids))
    assert times == pytest.approx([0, 1, 3, 4.5, 5.5, 7.5, 9.0])
    assert len(set(prompts)) == 7                   # each round with its own prompts
    assert [once.pop() and once.next_time() for _ in range(3)][-1] == float("inf")
    fast = TraceStream(short, max_model_len=2048, loop=True, rate=6.0)   # x 9 its pace
    assert fast.arrivals_until(60.0) == 3 * 120 + 1   # 120 rounds of 0.5 s, then one

