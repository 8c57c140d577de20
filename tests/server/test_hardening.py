"""Issue 11's reproducers: requests that once killed the engine for good, or got a 500.

Each gets a 4xx naming the field (or a correct completion where the input is legal), and
afterwards the server is still healthy and serves a normal request.
"""
from __future__ import annotations

import json
import math
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from tests.server.conftest import scrape, wait_for

pytestmark = pytest.mark.xdist_group("server")

CMPL = "/v1/completions"
HI = {"prompt": "hi", "max_tokens": 3, "temperature": 1}

# (name, raw JSON body, status, param the error names)
REPRODUCERS = [
    ("min_tokens with a stop id beyond the vocabulary",
     '{"prompt":"hi","max_tokens":5,"min_tokens":2,"stop_token_ids":[100000000]}', 400,
     "stop_token_ids"),
    ("min_tokens with a negative stop id",
     '{"prompt":"hi","max_tokens":5,"min_tokens":2,"stop_token_ids":[-100000]}', 400,
     "stop_token_ids[0]"),
    ("seed of 2**64", '{"prompt":"hi","max_tokens":3,"temperature":1,'
     '"seed":18446744073709551616}', 400, "seed"),
    ("seed below -2**63", '{"prompt":"hi","max_tokens":3,"temperature":1,'
     '"seed":-9223372036854775809}', 400, "seed"),
    ("n=2 with seed 2**64-1 (seed + 1 overflows)", '{"prompt":"hi","max_tokens":3,'
     '"temperature":1,"n":2,"seed":18446744073709551615}', 400, "seed"),
    ("NaN temperature", '{"prompt":"hi","temperature":NaN}', 400, "temperature"),
    ("Infinity presence_penalty", '{"prompt":"hi","presence_penalty":Infinity}', 400,
     "presence_penalty"),
    ("NaN repetition_penalty with logprobs",
     '{"prompt":"hi","repetition_penalty":NaN,"logprobs":2}', 400, "repetition_penalty"),
    ("-Infinity top_p", '{"prompt":"hi","top_p":-Infinity}', 400, "top_p"),
    ("lone surrogates in the prompt", '{"prompt":"\\ud800\\udfff\\ud800"}', 400, "prompt"),
    ("lone surrogate in a chat message", None, 400, "messages[0].content"),
    ("/tokenize with empty messages", None, 400, "messages"),
]
CHAT_SURROGATE = '{"messages":[{"role":"user","content":"a\\udc00"}]}'


def _assert_still_serving(http) -> None:
    assert http.get("/health").status_code == 200
    ok = http.post(CMPL, json={"prompt": "hi", "max_tokens": 2})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 2


@pytest.mark.parametrize("name,body,status,param", REPRODUCERS, ids=[r[0] for r in REPRODUCERS])
def test_reproducer_is_a_4xx_and_the_server_lives_on(http, name, body, status, param):
    path = CMPL
    if name.startswith("/tokenize"):
        path, body = "/tokenize", '{"messages": []}'
    elif body is None:
        path, body = "/v1/chat/completions", CHAT_SURROGATE
    r = http.post(path, content=body.encode(), headers={"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    assert r.json()["error"]["param"] == param, r.json()
    _assert_still_serving(http)


@pytest.mark.parametrize("top_k", [9223372036854775808, 2**31, 10**30])
def test_huge_top_k_means_no_truncation(http, top_k):
    """Legal (top_k >= the vocabulary disables top-k): the same tokens as top_k=-1."""
    body = {**HI, "max_tokens": 6, "seed": 7}
    huge = http.post(CMPL, json={**body, "top_k": top_k})
    plain = http.post(CMPL, json={**body, "top_k": -1})
    assert huge.status_code == 200, huge.text
    assert huge.json()["choices"][0]["text"] == plain.json()["choices"][0]["text"]
    _assert_still_serving(http)


def test_concurrent_truncated_sampling_batch(http, server):
    """Several clients with top_p / top_k / min_p at once share engine steps."""
    bodies = [{"prompt": f"client {i} says", "max_tokens": 12, "temperature": 0.8,
               "ignore_eos": True, **extra}
              for i, extra in enumerate([{"top_p": 0.9}, {"top_k": 5}, {"min_p": 0.1},
                                         {"top_p": 0.5, "top_k": 3, "min_p": 0.05}, {},
                                         {"top_p": 0.95}] * 2)]
    with ThreadPoolExecutor(len(bodies)) as pool:
        results = list(pool.map(lambda b: httpx.post(server.base_url + CMPL, json=b,
                                                     timeout=120), bodies))
    for r in results:
        assert r.status_code == 200, r.text
        assert r.json()["usage"]["completion_tokens"] == 12
    _assert_still_serving(http)


def test_logprobs_of_banned_tokens_are_finite_json(http):
    """min_tokens bans EOS (-inf); 20 top logprobs include it: JSON has no -Infinity."""
    body = {"prompt": "hi", "max_tokens": 3, "min_tokens": 3, "logprobs": 20}
    r = http.post(CMPL, json=body)
    assert r.status_code == 200
    json.loads(r.text, parse_constant=lambda c: pytest.fail(f"{c} in JSON"))
    values = [v for top in r.json()["choices"][0]["logprobs"]["top_logprobs"]
              for v in top.values()]
    assert values and all(math.isfinite(v) for v in values)
    with http.stream("POST", CMPL, json={**body, "stream": True}) as s:
        for line in s.iter_lines():
            if line.startswith("data: {"):
                json.loads(line[6:], parse_constant=lambda c: pytest.fail(f"{c} in SSE"))


def test_prompt_over_the_byte_cap_is_413_before_tokenizing(http):
    r = http.post(CMPL, json={"prompt": "x" * (2 * 1024 * 1024 + 1)})
    assert r.status_code == 413
    error = r.json()["error"]
    assert error["code"] == "prompt_too_large" and "--max-prompt-bytes" in error["message"]
    r = http.post("/tokenize", json={"messages": [{"role": "user", "content": "é" * 1_100_000}]})
    assert r.status_code == 413 and r.json()["error"]["param"] == "messages"
    _assert_still_serving(http)


def test_tokenizing_runs_off_the_event_loop(http, server):
    """A big /tokenize takes seconds; /health answers meanwhile, before it does."""
    done: dict[str, float] = {}

    def big_tokenize() -> None:
        words = " ".join(f"w{i}" for i in range(220_000))  # ~1.6 MB, under the byte cap
        with httpx.stream("POST", server.base_url + "/tokenize", json={"prompt": words},
                          timeout=120) as r:
            done["tokenize"] = time.monotonic()  # its response has begun
            assert r.status_code == 200
            r.read()
        assert r.json()["count"] > 200_000

    worker = threading.Thread(target=big_tokenize)
    worker.start()
    time.sleep(1.0)  # the body is in and tokenizing has begun (it takes seconds)
    assert http.get("/health", timeout=30).status_code == 200
    done["health"] = time.monotonic()
    worker.join(120)
    assert done["health"] < done["tokenize"], done


def test_slow_header_connections_are_closed(server):
    """Connections that send nothing, or trickle a header line byte by byte, are closed
    by the header-read timeout (2 s here); normal requests on other sockets go on."""
    silent = socket.create_connection(("127.0.0.1", server.port))
    trickler = socket.create_connection(("127.0.0.1", server.port))
    t0 = time.monotonic()
    trickler.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n")
    closed = {}
    while len(closed) < 2 and time.monotonic() - t0 < 10:
        for name, sock in (("silent", silent), ("trickler", trickler)):
            if name in closed:
                continue
            sock.settimeout(0.2)
            try:
                if sock.recv(1024) == b"":
                    closed[name] = time.monotonic() - t0
            except TimeoutError:
                pass
            except ConnectionResetError:
                closed[name] = time.monotonic() - t0
        if "trickler" not in closed:
            trickler.sendall(b"X")  # one byte at a time never completes the headers
    assert set(closed) == {"silent", "trickler"}, closed
    assert all(1.5 < t < 5 for t in closed.values()), closed
    assert httpx.get(server.base_url + "/health").status_code == 200


def test_engine_is_healthy_after_all_of_the_above(server):
    metrics = scrape(server.base_url)
    assert metrics["paged:engine_step_failures_total"] == 0
    assert wait_for(lambda: scrape(server.base_url)["paged:num_used_blocks"] == 0)
