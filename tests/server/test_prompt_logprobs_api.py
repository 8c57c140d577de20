"""echo + logprobs (lm-evaluation-harness's loglikelihood request) and vLLM's prompt_logprobs
on /v1/completions, against transformers' forward on the served checkpoint; prefix cache on."""
from __future__ import annotations

import json
import math

import pytest
import torch

pytestmark = pytest.mark.xdist_group("server")


@pytest.fixture(scope="module")
def hf(server):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from engine.model_loader import resolve_model_path

    path = resolve_model_path(None)  # the built-in default the session server serves
    return (AutoTokenizer.from_pretrained(path),
            AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval())


def _reference(hf, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        return torch.log_softmax(hf[1](torch.tensor([ids])).logits[0].float(), dim=-1)


def _prompts(hf) -> list[list[int]]:
    tok = hf[0]
    shared = "the model cache block page prefix system user token kernel batch decode " * 3
    return [tok(shared + tail).input_ids for tail in ("hello world", "explain the queue please")]


def test_lm_eval_loglikelihood_request(http, hf):
    """The body lm-eval's local-completions sends: token-id prompts, echo, logprobs 1,
    max_tokens 1. Each prompt position's logprob is transformers' (the first is None), the
    top entry is the argmax; sent twice, the second time from the prefix cache, the same."""
    prompts = _prompts(hf)
    http.post("/v1/completions", json={"prompt": prompts[0][:40], "max_tokens": 1})  # cache it
    body = {"prompt": prompts, "temperature": 0, "max_tokens": 1, "logprobs": 1,
            "seed": 1234, "echo": True}
    first = http.post("/v1/completions", json=body)
    assert first.status_code == 200, first.text
    again = http.post("/v1/completions", json=body).json()
    for choice, ids in zip(sorted(first.json()["choices"], key=lambda c: c["index"]), prompts):
        lp = choice["logprobs"]
        assert len(lp["token_logprobs"]) == len(ids) + 1  # the prompt, then one new token
        assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None
        ref = _reference(hf, ids)
        for pos in range(1, len(ids)):
            assert math.isclose(lp["token_logprobs"][pos], float(ref[pos - 1, ids[pos]]),
                                abs_tol=1e-4), pos
            (top,) = lp["top_logprobs"][pos].values()
            assert math.isclose(top, float(ref[pos - 1].max()), abs_tol=1e-4)
        assert choice["text"].startswith(hf[0].decode(ids))
    assert [c["logprobs"]["token_logprobs"] for c in again["choices"]] == \
        [c["logprobs"]["token_logprobs"] for c in first.json()["choices"]]


def test_echo_with_max_tokens_zero_is_the_prompt_alone(http, hf):
    ids = _prompts(hf)[1]
    r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 0, "echo": True,
                                           "logprobs": 2})
    assert r.status_code == 200, r.text
    body = r.json()
    (choice,) = body["choices"]
    assert choice["text"] == hf[0].decode(ids)
    assert choice["finish_reason"] == "length"
    lp = choice["logprobs"]
    assert lp["tokens"] == [hf[0].decode([t]) for t in ids]
    assert len(lp["top_logprobs"][1]) == 2
    assert body["usage"]["completion_tokens"] == 0
    assert lp["text_offset"][1] == len(lp["tokens"][0])
    # a string prompt echoes its own text
    r = http.post("/v1/completions", json={"prompt": "hello world", "max_tokens": 0,
                                           "echo": True})
    assert r.json()["choices"][0]["text"] == "hello world"
    assert r.json()["choices"][0]["logprobs"] is None


def test_vllm_prompt_logprobs_field(http, hf):
    """vLLM's prompt_logprobs: per prompt token {id: {logprob, decoded_token}} with the token
    and the top k; batched beside a prompt that does not ask (no field there)."""
    ids = _prompts(hf)[0]
    r = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 2,
                                           "prompt_logprobs": 1})
    (choice,) = r.json()["choices"]
    pl = choice["prompt_logprobs"]
    assert pl[0] is None and len(pl) == len(ids)
    ref = _reference(hf, ids)
    for pos in range(1, len(ids)):
        entry = pl[pos]
        assert math.isclose(entry[str(ids[pos])]["logprob"], float(ref[pos - 1, ids[pos]]),
                            abs_tol=1e-4)
        assert str(int(ref[pos - 1].argmax())) in entry and len(entry) <= 2
    plain = http.post("/v1/completions", json={"prompt": ids, "max_tokens": 2}).json()
    assert "prompt_logprobs" not in plain["choices"][0]


def test_echo_streamed_equals_unstreamed(http, hf):
    ids = _prompts(hf)[1]
    body = {"prompt": ids, "max_tokens": 4, "echo": True, "logprobs": 1, "temperature": 0,
            "ignore_eos": True}
    whole = http.post("/v1/completions", json=body).json()["choices"][0]
    text, tokens, lps = "", [], []
    with http.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                (c,) = json.loads(line[6:])["choices"]
                text += c["text"]
                tokens += c["logprobs"]["tokens"]
                lps += c["logprobs"]["token_logprobs"]
    assert text == whole["text"]
    assert tokens == whole["logprobs"]["tokens"]
    assert lps == whole["logprobs"]["token_logprobs"]


def test_logit_bias_and_best_of_through_the_api(http, hf):
    """logit_bias +100 on one token makes every sampled token that token; best_of=3, n=1
    returns, of the three samples n=3 draws with the same seed, the one of highest
    cumulative logprob."""
    token = hf[0].encode(" cache")[0]
    r = http.post("/v1/completions", json={"prompt": "hello", "max_tokens": 5, "seed": 1,
                                           "ignore_eos": True,
                                           "logit_bias": {str(token): 100}}).json()
    assert r["choices"][0]["text"] == hf[0].decode([token] * 5)
    body = {"prompt": "the model", "max_tokens": 5, "seed": 7, "temperature": 1.0,
            "ignore_eos": True, "logprobs": 0}
    three = http.post("/v1/completions", json={**body, "n": 3}).json()["choices"]
    best = http.post("/v1/completions", json={**body, "best_of": 3}).json()["choices"]
    assert len(best) == 1
    top = max(three, key=lambda c: sum(c["logprobs"]["token_logprobs"]))
    assert best[0]["text"] == top["text"]
    assert len({c["text"] for c in three}) > 1
