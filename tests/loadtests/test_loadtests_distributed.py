"""Locust's distributed mode: 1 master + 2 worker processes against a real (fake-model) HTTP
server; the workers ship their samples to the master (custom messages), which writes one
merged samples file holding exactly one record per request the server received."""
import json

import pytest

from fake_openai_server import FakeOpenAIServer
from loadtests.workloads.trace import TraceRequest, write_trace
from tuner.loadgen import LoadSpec, run_load
from tuner.scoring import load_samples

pytestmark = pytest.mark.timeout(120)


def test_master_and_two_workers_merge_one_sample_per_served_request(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.005) as server:
        path = run_load(LoadSpec(workload="chat", duration=3, users=4, length_scale=0.1,
                                 seed=2, workers=2), url=server.url, workdir=tmp_path)
        served = list(server.requests)
    samples = load_samples(path)
    assert samples.start is not None and samples.stop > samples.start
    assert len(samples.records) == len(served) > 20
    assert sum(r["ok"] for r in samples.records) >= len(served) - 4  # unfinished at the stop
    # both workers sent: their users' conversations are seeded apart (no duplicate streams)
    firsts = [b["messages"][1]["content"] for b in served if len(b["messages"]) == 2]
    assert len(set(firsts)) == len(firsts)
    for i in range(2):  # each worker ran and logged no error
        assert "Traceback" not in (tmp_path / f"locust-worker-{i}.log").read_text()


def test_a_trace_is_split_between_workers_and_sent_once(tmp_path):
    trace = tmp_path / "t.jsonl"
    write_trace(trace, [TraceRequest(timestamp=i * 0.05, prompt_tokens=8 + i, output_tokens=2)
                        for i in range(30)])
    with FakeOpenAIServer(ttft=0.005, itl=0.005) as server:
        path = run_load(LoadSpec(workload="trace", trace=str(trace), duration=3, users=1,
                                 arrival="open", workers=2), url=server.url, workdir=tmp_path)
        lengths = sorted(len(b["prompt"]) for b in server.requests)
    assert lengths == [8 + i for i in range(30)]  # every request once, whichever worker
    assert len(load_samples(path).records) == 30
    assert json.loads((tmp_path / "samples.jsonl").read_text().splitlines()[0])["event"] == "start"
