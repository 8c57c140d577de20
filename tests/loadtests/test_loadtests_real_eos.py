"""Real EOS: without ignore_eos the model's own reply length comes back (issue 19)."""
import pytest
import requests

from fake_openai_server import FakeOpenAIServer
from loadtests.client import stream_request
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.scoring import load_samples


def test_the_client_sends_ignore_eos_only_when_asked():
    with FakeOpenAIServer(ttft=0.01, itl=0.001, eos_after=3) as server:
        forced = stream_request(requests.Session(), server.url, "/v1/completions",
                                {"prompt": "hi", "max_tokens": 8}, kind="k", model=None)
        real = stream_request(requests.Session(), server.url, "/v1/completions",
                              {"prompt": "hi", "max_tokens": 8}, kind="k", model=None,
                              ignore_eos=False)
    assert server.requests[0]["ignore_eos"] is True and "ignore_eos" not in server.requests[1]
    assert (forced.ok, forced.output_tokens) == (True, 8)
    assert (real.ok, real.output_tokens) == (True, 3)


def test_locust_with_real_eos_records_the_models_lengths(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.002, eos_after=5) as server:
        path = run_load(LoadSpec(workload="chat", duration=2, users=2, seed=3,
                                 ignore_eos=False), url=server.url, workdir=tmp_path)
        bodies = list(server.requests)
    ok = [r for r in load_samples(path).records if r["ok"]]
    assert len(ok) >= 5 and bodies
    assert all("ignore_eos" not in b for b in bodies)
    # chat asks for 32-96 tokens at length scale 1: the 5-token replies are the model's
    assert all(b["max_tokens"] >= 32 for b in bodies)
    assert {r["output_tokens"] for r in ok} == {5}


def test_a_trace_cannot_run_with_the_models_eos():
    with pytest.raises(ValueError, match="ignore_eos"):
        LoadSpec(workload="trace", duration=1, users=1, trace="t.jsonl", ignore_eos=False)
