"""Locust's distributed mode: 1 master + 2 worker processes against a real (fake-model) HTTP
server; the workers ship their samples to the master (custom messages), which writes one
merged samples file holding exactly one record per request the server received."""
import json

import pytest

from fake_openai_server import FakeOpenAIServer
from loadtests.workloads.trace import TraceRequest, write_trace
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.scoring import load_samples

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


def _worker_pod(port: int, workload: str, log):
    """What the operator's load-worker pod runs, as a process: the Service's variables
    point it at the master (tuner.measure.load_worker)."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "T_LOAD_SERVICE_HOST": "127.0.0.1", "T_LOAD_SERVICE_PORT": str(port)}
    return subprocess.Popen([sys.executable, "-m", "tuner", "load-worker", "--master-service",
                             "t-load", "--workload", workload], env=env, stdout=log,
                            stderr=subprocess.STDOUT)


def test_worker_pods_outlive_each_master_and_get_each_measurements_trace(tmp_path, monkeypatch):
    """Two measurements, one master each, the same two long-lived load-worker loops: each
    master's trace (different lengths) reaches the workers, every request once."""
    from tuner.measure.loadgen import free_port
    port = free_port()
    monkeypatch.setenv("POD_IP", "127.0.0.1")
    logs = [open(tmp_path / f"pod-{i}.log", "wb") for i in range(2)]
    pods = [_worker_pod(port, "trace", log) for log in logs]
    try:
        with FakeOpenAIServer(ttft=0.005, itl=0.005) as server:
            for run, base in enumerate((8, 50)):
                trace = tmp_path / f"t{run}.jsonl"
                write_trace(trace, [TraceRequest(timestamp=i * 0.05, prompt_tokens=base + i,
                                                 output_tokens=2) for i in range(20)])
                server.requests.clear()
                spec = LoadSpec(workload="trace", trace=str(trace), duration=3, users=1,
                                arrival="open", workers=2, master_port=port)
                path = run_load(spec, url=server.url, workdir=tmp_path / f"m{run}")
                assert sorted(len(b["prompt"]) for b in server.requests) == \
                    [base + i for i in range(20)]
                assert len(load_samples(path).records) == 20
                assert not list((tmp_path / f"m{run}").glob("locust-worker-*.log"))
                assert all(p.poll() is None for p in pods)   # the loops wait for the next
    finally:
        for p in pods:
            p.terminate()
            p.wait(timeout=10)
        for log in logs:
            log.close()
    text = (tmp_path / "pod-0.log").read_text()
    assert "run 1 ended (0)" in text   # the first master's quit ended a run; the loop went on
    assert "Traceback" not in text


def test_a_master_port_needs_workers_elsewhere():
    with pytest.raises(ValueError, match="workers must be >= 2"):
        LoadSpec(workload="chat", duration=1, users=1, master_port=5557)
