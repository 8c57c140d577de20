"""Locust, headless in a subprocess, against a real (fake-model) HTTP server."""
import json

from fake_openai_server import FakeOpenAIServer
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.scoring import load_samples


def _records(path):
    return [json.loads(line) for line in path.read_text().splitlines()]


def test_closed_loop_writes_markers_and_one_record_per_request(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.002) as server:
        path = run_load(LoadSpec(workload="chat", duration=2, users=2, length_scale=0.1, seed=1),
                        url=server.url, workdir=tmp_path / "a")
        bodies = list(server.requests)
    samples = load_samples(path)
    assert samples.start is not None and samples.stop > samples.start
    ok = [r for r in samples.records if r["ok"]]
    assert len(ok) >= 10 and all(r["kind"] == "chat" for r in ok)
    # every request sent shows up as a record (completed, or unfinished at the stop)
    assert len(samples.records) == len(bodies)
    unfinished = [r for r in samples.records if not r["ok"]]
    assert all(r["error"] == "unfinished at end of run" for r in unfinished)
    # conversations grow: some request resends an earlier reply as history
    assert any(m["role"] == "assistant" for b in bodies for m in b["messages"])
    assert (tmp_path / "a" / "locust_stats.csv").exists()


def test_open_loop_sends_poisson_arrivals_at_the_target_rate(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.001) as server:
        path = run_load(LoadSpec(workload="summarize", duration=3, users=1, arrival="open",
                                 rate=20.0, length_scale=0.05), url=server.url,
                        workdir=tmp_path / "b")
    samples = load_samples(path)
    starts = sorted(r["start"] for r in samples.records)
    rate = len(starts) / (samples.stop - samples.start)
    assert 10 < rate < 30  # 20/s expected; a Poisson count over ~3 s
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    assert max(gaps) > 2.5 * min(gaps)  # exponential gaps, not a fixed pacing


def test_same_seed_replays_the_same_prompts(tmp_path):
    firsts = []
    for run in ("c", "d"):
        with FakeOpenAIServer(ttft=0.01, itl=0.001) as server:
            # 3 s: Locust's start may take a second or more on a loaded machine
            run_load(LoadSpec(workload="code", duration=3, users=1, seed=7, length_scale=0.1),
                     url=server.url, workdir=tmp_path / run)
            firsts.append(server.requests[0]["prompt"])
    assert firsts[0] == firsts[1]


def test_open_loop_arrivals_do_not_depend_on_how_fast_the_server_replies(tmp_path):
    """Multi-turn chat: a fast server leaves sessions idle for the next arrival to continue,
    a slow one does not, yet one seed gives the same arrival times against both (the
    stream a setting is measured on is not shifted by the setting)."""
    offsets = []
    for run, (ttft, itl) in (("fast", (0.002, 0.0005)), ("slow", (0.3, 0.02))):
        with FakeOpenAIServer(ttft=ttft, itl=itl) as server:
            # 3 s: Locust's start takes 0.5 s of it here, more on a loaded machine
            path = run_load(LoadSpec(workload="chat", duration=3, users=1, arrival="open",
                                     rate=15.0, seed=3, length_scale=0.05),
                            url=server.url, workdir=tmp_path / run)
        starts = sorted(r["start"] for r in load_samples(path).records)
        offsets.append([t - starts[0] for t in starts])
    n = min(map(len, offsets)) - 1   # the last one may fall either side of the stop
    assert n >= 15
    assert max(abs(a - b) for a, b in zip(offsets[0][:n], offsets[1][:n])) < 0.05
