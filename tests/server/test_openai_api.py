"""The OpenAI-compatible API through the real `openai` client, against the offline engine."""
from __future__ import annotations

import re

import httpx
import pytest

from tests.server.conftest import wait_for

pytestmark = pytest.mark.xdist_group("server")

PROMPTS = ["hello world, please summarize the cache", "the model token block page",
           "write python code for a server"]
MAX_TOKENS = 8


@pytest.fixture(scope="module")
def offline():
    """The same engine settings offline; greedy outputs, one prompt at a time as the
    server sees them (requests are sent one by one)."""
    from engine import LLMEngine, SamplingParams

    engine = LLMEngine.from_args(max_model_len=512, num_gpu_blocks_override=256, seed=0)

    def generate(prompt):
        engine.add_request("offline", prompt, SamplingParams(temperature=0.0,
                                                             max_tokens=MAX_TOKENS))
        final = None
        while engine.has_unfinished_requests():
            for out in engine.step():
                final = out
        return final

    generate.engine = engine
    return generate


def test_completions_match_offline_greedy(client, offline):
    for prompt in PROMPTS:
        expected = offline(prompt)
        resp = client.completions.create(model=client.models.list().data[0].id, prompt=prompt,
                                         max_tokens=MAX_TOKENS, temperature=0)
        choice = resp.choices[0]
        assert choice.text == expected.outputs[0].text
        assert choice.finish_reason == expected.outputs[0].finish_reason
        assert resp.usage.prompt_tokens == len(expected.prompt_token_ids)
        assert resp.usage.completion_tokens == len(expected.outputs[0].token_ids)
        assert resp.usage.total_tokens == resp.usage.prompt_tokens + resp.usage.completion_tokens

        stream = client.completions.create(model=resp.model, prompt=prompt, stream=True,
                                           max_tokens=MAX_TOKENS, temperature=0,
                                           stream_options={"include_usage": True})
        chunks = list(stream)
        assert "".join(c.choices[0].text for c in chunks if c.choices) == choice.text
        finish = [c.choices[0].finish_reason for c in chunks if c.choices]
        assert finish[-1] == choice.finish_reason and not any(finish[:-1])
        assert chunks[-1].choices == [] and chunks[-1].usage == resp.usage


def test_chat_matches_offline_greedy(client, offline):
    messages = [{"role": "system", "content": "you answer briefly"},
                {"role": "user", "content": "explain the prefix cache"}]
    ids = offline.engine.tokenizer.apply_chat_template(
        messages, add_generation_prompt=True, tokenize=True, return_dict=False)
    expected = offline(list(ids))
    model = client.models.list().data[0].id
    resp = client.chat.completions.create(model=model, messages=messages,
                                          max_tokens=MAX_TOKENS, temperature=0)
    assert resp.object == "chat.completion"
    assert resp.choices[0].message.role == "assistant"
    assert resp.choices[0].message.content == expected.outputs[0].text
    assert resp.usage.prompt_tokens == len(ids)
    assert resp.usage.completion_tokens == len(expected.outputs[0].token_ids)

    chunks = list(client.chat.completions.create(
        model=model, messages=messages, max_tokens=MAX_TOKENS, temperature=0, stream=True,
        stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == resp.choices[0].message.content
    assert chunks[-1].usage.completion_tokens == resp.usage.completion_tokens


def test_n_and_multiple_prompts_index_choices(client):
    model = client.models.list().data[0].id
    resp = client.completions.create(model=model, prompt=PROMPTS[:2], n=3, max_tokens=4,
                                     temperature=1.0, seed=7)
    assert sorted(c.index for c in resp.choices) == list(range(6))
    assert resp.usage.completion_tokens == 6 * 4
    # greedy samples of one prompt agree with each other
    greedy = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
        temperature=0)
    assert [c.index for c in greedy.choices] == [0, 1]
    assert greedy.choices[0].message.content == greedy.choices[1].message.content
    streamed = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], n=2, max_tokens=4,
        temperature=0, stream=True)
    texts = {0: "", 1: ""}
    for chunk in streamed:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    assert texts[0] == texts[1] == greedy.choices[0].message.content


def test_logprobs_and_vllm_extras(client):
    model = client.models.list().data[0].id
    resp = client.completions.create(
        model=model, prompt=PROMPTS[0], max_tokens=4, temperature=0, logprobs=3,
        extra_body={"top_k": 5, "min_p": 0.0, "repetition_penalty": 1.1, "ignore_eos": True,
                    "min_tokens": 4, "cache_salt": "tenant-a", "priority": 0})
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 4
    for token_lp, top in zip(lp.token_logprobs, lp.top_logprobs):
        assert token_lp <= 0 and 1 <= len(top) <= 3
        assert max(top.values()) >= token_lp - 1e-6  # greedy: the chosen one is the best
    chat = client.chat.completions.create(
        model=model, messages=[{"role": "user", "content": "hi"}], max_tokens=3,
        temperature=0, logprobs=True, top_logprobs=2)
    content = chat.choices[0].logprobs.content
    assert len(content) == 3 and all(len(c.top_logprobs) == 2 for c in content)


def test_stop_strings_end_the_text(client):
    model = client.models.list().data[0].id
    kwargs = dict(model=model, prompt=PROMPTS[1], max_tokens=12, temperature=0,
                  extra_body={"ignore_eos": True})
    free = client.completions.create(**kwargs).choices[0].text
    # a stop string taken from the middle of the free-running text
    words = re.findall(r"[a-z]{3,}", free[1:])
    assert words, f"no word to stop on in {free!r}"
    stop = words[len(words) // 2]
    cut = client.completions.create(**kwargs, stop=[stop]).choices[0]
    assert cut.finish_reason == "stop"
    assert cut.text == free[:free.index(stop)]


def test_models_tokenize_detokenize_version(http, server, offline):
    models = http.get("/v1/models").json()
    name = models["data"][0]["id"]
    assert models["data"][0]["max_model_len"] == 512
    tok = http.post("/tokenize", json={"prompt": "hello world"}).json()
    assert tok["count"] == len(tok["tokens"]) > 0 and tok["max_model_len"] == 512
    assert http.post("/detokenize", json={"tokens": tok["tokens"]}).json()["prompt"] == \
        "hello world"
    chat = http.post("/tokenize", json={"model": name,
                                        "messages": [{"role": "user", "content": "hi"}]}).json()
    assert chat["tokens"] == list(offline.engine.tokenizer.apply_chat_template(
        [{"role": "user", "content": "hi"}], add_generation_prompt=True, tokenize=True,
        return_dict=False))
    assert http.get("/version").json()["version"]
    assert models["data"][0]["root"] == name  # the served name, never a local path
    health = httpx.get(server.base_url + "/health")
    assert health.status_code == 200 and health.json() == {"status": "ready", "model": name}
    assert httpx.get(server.base_url + "/ready").json() == health.json()
    assert httpx.get(server.base_url + "/livez").json() == {"status": "alive"}


def test_request_id_is_echoed(http):
    r = http.post("/v1/completions", json={"prompt": "hi", "max_tokens": 1},
                  headers={"X-Request-Id": "trace-123"})
    assert r.status_code == 200 and r.headers["x-request-id"] == "trace-123"
    assert r.json()["id"] == "cmpl-trace-123"
    made = http.get("/health").headers["x-request-id"]  # one is made when none is sent
    assert made and made != http.get("/health").headers["x-request-id"]
    # an id unfit for logs (spaces, newlines) is replaced, not echoed
    odd = http.get("/health", headers={"X-Request-Id": "a b\tc"}).headers["x-request-id"]
    assert odd != "a b\tc" and " " not in odd


def test_access_log_has_no_prompt_text(http, server):
    secret = "zebra-secret-prompt-text"
    http.post("/v1/completions", json={"prompt": secret, "max_tokens": 1},
              headers={"X-Request-Id": "log-check"})
    # the line is written once the response is sent: wait for it
    lines = wait_for(lambda: [x for x in server.lines if "request_id=log-check" in x])
    assert len(lines) == 1 and '"POST /v1/completions" 200' in lines[0]
    assert secret not in server.log
