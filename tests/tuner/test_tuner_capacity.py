"""Capacity search: bracketing and bisection on the open-loop rate; on the fake engine whose
replica takes a known load (2 requests at once, 0.19 s each: 10.5 req/s), the search
finds that knee."""
import json
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from loadtests.workloads.trace import TraceRequest, write_trace
from tuner.measure.capacity import after_lead, measure_capacity, search_capacity
from tuner.measure.loadgen import LoadSpec
from tuner.measure.scoring import Samples
from tuner.measure.local import EngineLaunch

FAKE_ENGINE = f"{sys.executable} {Path(__file__).parent / 'fake_engine.py'}"


def _samples(rate, knee, duration=10.0):
    """A run at `rate`: every request good below the knee, a growing share bad above."""
    records, n = [], int(rate * duration)
    for i in range(n):
        good = rate <= knee or i < n * knee / rate / 2
        records.append({"kind": "k", "start": 100 + i / rate, "ok": good,
                        "ttft": 0.1 if good else 9.0, "itl": []})
    return Samples(records=records, start=100.0, stop=100.0 + duration)


def test_search_brackets_then_bisects_to_the_knee():
    probed = []

    def probe(rate):
        probed.append(rate)
        return _samples(rate, knee=7.3)

    result = search_capacity(probe, {"k": {"ttft": 1.0}}, start=2.0, rel_tol=0.1,
                             max_probes=10)
    assert result.rate <= 7.3 < result.upper and result.upper / result.rate <= 1.1
    assert probed[:3] == [2.0, 4.0, 8.0]  # doubling until the first failure
    assert [p["passed"] for p in result.probes] == [r <= 7.3 for r in probed]
    # starting above the knee, it halves instead
    down = search_capacity(lambda r: _samples(r, knee=3.0), {"k": {"ttft": 1.0}}, start=20.0)
    assert down.rate <= 3.0 < down.upper and down.probes[0]["passed"] is False
    with pytest.raises(ValueError, match="positive start rate"):
        search_capacity(probe, {}, start=0)


@pytest.mark.timeout(240)
def test_capacity_on_the_fake_engine_finds_the_known_knee(tmp_path, monkeypatch):
    monkeypatch.setenv("FAKE_ENGINE_SLOTS", "1")
    monkeypatch.setenv("FAKE_ENGINE_ITL", json.dumps({"2": 0.02}))
    # evenly spaced arrivals (10/s in the trace), 10 output tokens: each request holds one
    # of 2 slots for 0.01 + 9 x 0.02 = 0.19 s, so the replica takes 2 / 0.19 = 10.5 req/s;
    # below that no request waits, above it the queue grows without bound
    trace = tmp_path / "even.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i / 10, prompt_tokens=8, output_tokens=10)
                        for i in range(300)])
    load = LoadSpec(workload="trace", trace=str(trace), duration=3, users=1, arrival="open")
    launch = EngineLaunch(engine_cmd=FAKE_ENGINE, startup_timeout=30)
    result = measure_capacity({"max_num_seqs": 2}, launch, load,
                              {"trace": {"ttft": 0.25}}, workdir=tmp_path / "cap", start=4.0,
                              trace_rate=10.0, rel_tol=0.2, max_probes=6)
    knee = 2 / 0.19
    assert 0.7 * knee <= result.rate <= 1.1 * knee, result.probes
    assert result.upper is not None and result.upper <= 1.6 * knee, result.probes
    assert "req/s per replica" in result.line()
    # each probe carries the engine's gauges: below the knee nothing waits, and at the
    # highest rate probed, furthest above it, the queue grows (the lowest failing rate,
    # just past the knee, may average only one waiting: 1.0 in CI on 2026-12-07)
    waiting = {p["rate"]: p["gauges"]["num_requests_waiting_mean"] for p in result.probes}
    lowest, highest = min(waiting), max(waiting)
    assert highest > 1.2 * knee, result.probes
    assert waiting[lowest] < 1.0 < waiting[highest], result.probes


def test_every_probe_of_a_search_sends_its_own_requests(tmp_path, monkeypatch):
    """Probe k loads seed + 1000 k on the one engine of the search: replaying the previous
    probe's requests would find them in its prefix cache (a later probe of a real summarize
    search passed 16.35 req/s where the first failed at 10.6)."""
    sent, launch = _scripted_engine(monkeypatch)
    load = LoadSpec(workload="chat", duration=10, users=1, seed=7)
    result = measure_capacity({}, launch, load, {"k": {"ttft": 1.0}}, workdir=tmp_path,
                              start=2.0, warmup_requests=3, max_probes=4)
    assert [s[0] for s in sent] == [7, 1007, 2007, 3007]
    assert [s[3] for s in sent] == [3, 0, 0, 0]   # warm-up before the first probe only
    assert [s[1] for s in sent] == [p["rate"] for p in result.probes]


def _passing_below_5(load):
    ok = load.rate <= 5.0
    return [{"event": "start", "t": 0.0}, *({"kind": "k", "start": i / 10, "ok": ok,
                                             "ttft": 0.1, "e2e": 0.2} for i in range(10)),
            {"event": "stop", "t": 10.0}]


def _scripted_engine(monkeypatch, samples=_passing_below_5):
    """An engine whose loads write `samples(load)` (by default every load passes at <= 5
    req/s and fails above): -> (the loads sent, as (seed, rate, duration, warmup_requests,
    workdir name), a launch of it)."""
    import tuner.measure.server_metrics as server_metrics
    import tuner.measure.trial as trial

    sent = []

    def measure(url, load, slos, *, workdir, warmup_requests):
        sent.append((load.seed, load.rate, load.duration, warmup_requests, workdir.name))
        workdir.mkdir(parents=True)
        lines = samples(load)
        (workdir / "samples.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))

    class Engine:
        url = "http://engine"

        def start(self, timeout):
            pass

        def stop(self):
            pass

    monkeypatch.setattr(trial, "measure", measure)
    monkeypatch.setattr(server_metrics, "wait_idle", lambda url: None)
    return sent, SimpleNamespace(process=lambda settings, log: Engine(), startup_timeout=1)


def test_a_warm_up_load_precedes_the_first_probe_only(tmp_path, monkeypatch):
    """warmup_load: about that many requests of the workload's own stream at the first
    probe's rate (at most one load's duration), not scored, before the first probe; the
    simulator's warm-up's twin. None for a trace (it replays from its own beginning)."""
    sent, launch = _scripted_engine(monkeypatch)
    load = LoadSpec(workload="chat", duration=10, users=1, seed=7)
    result = measure_capacity({}, launch, load, {"k": {"ttft": 1.0}}, workdir=tmp_path / "a",
                              start=2.0, warmup_requests=3, warmup_load=12, max_probes=4)
    # 12 requests at 2 req/s: 6 s of its own stream, then the probes as before
    assert sent[0] == (7 + 999_000, 2.0, 6.0, 3, "warmup")
    assert [s[0] for s in sent[1:]] == [7, 1007, 2007, 3007]
    assert [s[3] for s in sent[1:]] == [0, 0, 0, 0]
    assert len(result.probes) == 4 and result.probes[0]["rate"] == 2.0
    sent.clear()   # a long warm-up is cut at one load's duration
    measure_capacity({}, launch, load, {"k": {"ttft": 1.0}}, workdir=tmp_path / "b",
                     start=2.0, warmup_load=500, max_probes=2)
    assert sent[0][2] == 10 and sent[0][4] == "warmup"
    sent.clear()   # a trace: none
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i / 10, prompt_tokens=8, output_tokens=10)
                        for i in range(30)])
    measure_capacity({}, launch, LoadSpec(workload="trace", trace=str(trace), duration=10,
                                          users=1), {"k": {"ttft": 1.0}},
                     workdir=tmp_path / "c", start=2.0, trace_rate=10.0, warmup_load=12,
                     max_probes=2)
    assert [s[4] for s in sent] == ["probe-00", "probe-01"]


def test_a_lead_runs_before_each_probes_scored_window(tmp_path, monkeypatch):
    """lead: each probe's load runs `lead` s longer, first, and only what arrives after it
    is scored, so the window finds the queue its own rate builds (a real probe otherwise
    starts on an empty one); none for a trace."""
    def samples(load):   # a request every 0.5 s; those of the first 4 s miss their SLO
        t = [i / 2 for i in range(int(load.duration * 2))]
        return [{"event": "start", "t": 50.0},
                *({"kind": "k", "start": 50.0 + s, "ok": True, "ttft": 0.1 if s >= 4 else 9.0,
                   "e2e": 0.2} for s in t), {"event": "stop", "t": 50.0 + load.duration}]
    sent, launch = _scripted_engine(monkeypatch, samples)
    load = LoadSpec(workload="chat", duration=10, users=1, seed=7)
    slos = {"k": {"ttft": 1.0}}
    led = measure_capacity({}, launch, load, slos, workdir=tmp_path / "a", start=2.0,
                           lead=4.0, max_probes=3)
    assert [(s[2], s[4]) for s in sent] == [(14.0, "probe-00"), (14.0, "probe-01"),
                                           (14.0, "probe-02")]
    assert all(p["passed"] and p["attainment"] == 1.0 for p in led.probes)
    sent.clear()
    cold = measure_capacity({}, launch, load, slos, workdir=tmp_path / "b", start=2.0,
                            max_probes=3)
    assert [s[2] for s in sent] == [10, 10, 10]
    assert not any(p["passed"] for p in cold.probes)
    sent.clear()   # a trace: no lead
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i / 10, prompt_tokens=8, output_tokens=10)
                        for i in range(30)])
    measure_capacity({}, launch, LoadSpec(workload="trace", trace=str(trace), duration=10,
                                          users=1), slos, workdir=tmp_path / "c", start=2.0,
                     trace_rate=10.0, lead=4.0, max_probes=1)
    assert [s[2] for s in sent] == [10]


def test_after_lead_keeps_the_arrivals_from_the_leads_end():
    samples = Samples(records=[{"start": 10.0 + s} for s in (0.0, 3.9, 4.0, 7.5)],
                      start=10.0, stop=20.0)
    window = after_lead(samples, 4.0)
    assert [r["start"] for r in window.records] == [14.0, 17.5]
    assert (window.start, window.stop) == (14.0, 20.0)
    assert after_lead(samples, 0.0) is samples
