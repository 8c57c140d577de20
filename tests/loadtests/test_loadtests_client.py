"""SSE timing against a real HTTP server with known first-token and inter-token delays."""
import requests

from fake_openai_server import FakeOpenAIServer
from loadtests.client import stream_request


def test_ttft_and_inter_token_gaps_match_the_servers_timing():
    with FakeOpenAIServer(ttft=0.15, itl=0.04) as server:
        sample = stream_request(requests.Session(), server.url, "/v1/completions",
                                {"prompt": "hi", "max_tokens": 6}, kind="k", model="m")
    assert sample.ok, sample.error
    assert 0.15 <= sample.ttft < 0.15 + 0.2
    assert len(sample.itl) == 5 and all(0.035 <= gap < 0.04 + 0.2 for gap in sample.itl)
    assert sample.e2e >= sample.ttft + sum(sample.itl) - 1e-6
    assert sample.output_tokens == 6 and sample.text == "t0 t1 t2 t3 t4 t5 "
    assert server.requests[0]["stream"] is True and server.requests[0]["model"] == "m"


def test_chat_role_chunk_is_not_the_first_token():
    with FakeOpenAIServer(ttft=0.2, itl=0.01) as server:
        sample = stream_request(requests.Session(), server.url, "/v1/chat/completions",
                                {"messages": [], "max_tokens": 3}, kind="chat", model=None)
    assert sample.ok and sample.ttft >= 0.2 and sample.output_tokens == 3
    assert "model" not in server.requests[0]


def test_http_errors_and_unreachable_servers_become_failed_samples():
    with FakeOpenAIServer(fail_every=1) as server:
        sample = stream_request(requests.Session(), server.url, "/v1/completions",
                                {"prompt": "x", "max_tokens": 2}, kind="k", model=None)
        url = server.url
    assert not sample.ok and sample.status == 500 and "injected failure" in sample.error
    sample = stream_request(requests.Session(), url, "/v1/completions",
                            {"prompt": "x", "max_tokens": 2}, kind="k", model=None, timeout=2)
    assert not sample.ok and "ConnectionError" in sample.error
