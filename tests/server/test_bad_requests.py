"""Bad input: each case gets the right 4xx in OpenAI's error shape, naming the field,
and the server still answers the next request."""
from __future__ import annotations

import pytest

pytestmark = pytest.mark.xdist_group("server")

CHAT = "/v1/chat/completions"
CMPL = "/v1/completions"
MSGS = [{"role": "user", "content": "hi"}]
LONG_PROMPT = "hello world " * 400  # > 512 tokens

# (name, path, body (bytes: sent raw), status, param the error must name)
CASES = [
    ("malformed JSON", CMPL, b'{"prompt": "hi",', 400, None),
    ("body not an object", CMPL, b'["hi"]', 400, None),
    ("empty body", CMPL, b"", 400, None),
    ("missing prompt", CMPL, {"max_tokens": 2}, 400, "prompt"),
    ("missing messages", CHAT, {"max_tokens": 2}, 400, "messages"),
    ("empty messages", CHAT, {"messages": []}, 400, "messages"),
    ("unknown role", CHAT, {"messages": [{"role": "robot", "content": "x"}]}, 400,
     "messages[0].role"),
    ("image content part", CHAT, {"messages": [{"role": "user", "content": [
        {"type": "image_url", "image_url": {"url": "http://x"}}]}]}, 400,
     "messages[0].content[0]"),
    ("unknown model", CMPL, {"model": "gpt-9", "prompt": "hi"}, 404, "model"),
    ("prompt over max_model_len", CMPL, {"prompt": LONG_PROMPT}, 400, "prompt"),
    ("chat over max_model_len", CHAT, {"messages": [{"role": "user", "content": LONG_PROMPT}]},
     400, "messages"),
    ("prompt plus max_tokens over max_model_len", CMPL, {"prompt": "hi", "max_tokens": 600},
     400, "max_tokens"),
    ("empty prompt", CMPL, {"prompt": ""}, 400, "prompt"),
    ("empty prompt list", CMPL, {"prompt": []}, 400, "prompt"),
    ("token id out of vocabulary", CMPL, {"prompt": [1, 99999999]}, 400, "prompt"),
    ("temperature wrong type", CMPL, {"prompt": "hi", "temperature": "hot"}, 400,
     "temperature"),
    ("temperature negative", CMPL, {"prompt": "hi", "temperature": -0.5}, 400, "temperature"),
    ("top_p zero", CHAT, {"messages": MSGS, "top_p": 0}, 400, "top_p"),
    ("top_k below -1", CMPL, {"prompt": "hi", "top_k": -3}, 400, "top_k"),
    ("min_p above 1", CMPL, {"prompt": "hi", "min_p": 1.5}, 400, "min_p"),
    ("presence_penalty out of range", CMPL, {"prompt": "hi", "presence_penalty": 3}, 400,
     "presence_penalty"),
    ("frequency_penalty out of range", CHAT, {"messages": MSGS, "frequency_penalty": -9}, 400,
     "frequency_penalty"),
    ("repetition_penalty zero", CMPL, {"prompt": "hi", "repetition_penalty": 0}, 400,
     "repetition_penalty"),
    ("n zero", CMPL, {"prompt": "hi", "n": 0}, 400, "n"),
    ("n fractional", CMPL, {"prompt": "hi", "n": 1.5}, 400, "n"),
    ("n above max_num_seqs", CMPL, {"prompt": "hi", "n": 17}, 400, None),
    ("max_tokens zero", CMPL, {"prompt": "hi", "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens string", CHAT, {"messages": MSGS, "max_tokens": "ten"}, 400, "max_tokens"),
    ("min_tokens over max_tokens", CMPL, {"prompt": "hi", "max_tokens": 2, "min_tokens": 5},
     400, "min_tokens"),
    ("logprobs too many", CMPL, {"prompt": "hi", "logprobs": 50}, 400, "logprobs"),
    ("top_logprobs without logprobs", CHAT, {"messages": MSGS, "top_logprobs": 2}, 400,
     "top_logprobs"),
    ("stop wrong type", CMPL, {"prompt": "hi", "stop": 5}, 400, "stop"),
    ("stop empty string", CMPL, {"prompt": "hi", "stop": [""]}, 400, "stop"),
    ("stream wrong type", CMPL, {"prompt": "hi", "stream": "yes"}, 400, "stream"),
    ("stream_options without stream", CMPL,
     {"prompt": "hi", "stream_options": {"include_usage": True}}, 400, "stream_options"),
    ("logit_bias key not a token id", CMPL, {"prompt": "hi", "logit_bias": {"x": 5}}, 400,
     "logit_bias"),
    ("logit_bias beyond the vocabulary", CMPL, {"prompt": "hi", "logit_bias": {"99999999": 5}},
     400, "logit_bias"),
    ("logit_bias out of range", CMPL, {"prompt": "hi", "logit_bias": {"1": 101}}, 400,
     "logit_bias.1"),
    ("best_of below n", CMPL, {"prompt": "hi", "n": 2, "best_of": 1}, 400, "best_of"),
    ("best_of above n streamed", CMPL, {"prompt": "hi", "best_of": 2, "stream": True}, 400,
     "best_of"),
    ("prompt_logprobs too many", CMPL, {"prompt": "hi", "prompt_logprobs": 21}, 400,
     "prompt_logprobs"),
    ("suffix unsupported", CMPL, {"prompt": "hi", "suffix": "end"}, 400, "suffix"),
    ("tool without its function", CHAT, {"messages": MSGS, "tools": [{"type": "function"}]},
     400, "tools[0].function"),
    ("priority wrong type", CMPL, {"prompt": "hi", "priority": "high"}, 400, "priority"),
    ("detokenize bad id", "/detokenize", {"tokens": [-1]}, 400, "tokens[0]"),
    ("detokenize id beyond the vocabulary", "/detokenize", {"tokens": [10**9]}, 400, "tokens"),
    ("tokenize neither", "/tokenize", {}, 400, "prompt"),
    ("unknown route", "/v1/embeddings", {"input": "x"}, 404, None),
]


@pytest.mark.parametrize("name,path,body,status,param", CASES, ids=[c[0] for c in CASES])
def test_bad_request_gets_4xx_naming_the_field(http, name, path, body, status, param):
    if isinstance(body, bytes):
        r = http.post(path, content=body, headers={"Content-Type": "application/json"})
    else:
        r = http.post(path, json=body)
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert error["message"] and error["type"]
    assert error["param"] == param, error
    # the server is unharmed: the next request is served
    ok = http.post(CMPL, json={"prompt": "hi", "max_tokens": 1})
    assert ok.status_code == 200 and ok.json()["usage"]["completion_tokens"] == 1


def test_oversized_body_gets_413(http):
    r = http.post(CMPL, json={"prompt": "x" * (9 * 1024 * 1024)})
    assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
    chunked = http.post(CMPL, content=iter([b'{"prompt": "', b"x" * (9 * 1024 * 1024), b'"}']),
                        headers={"Content-Type": "application/json"})
    assert chunked.status_code == 413
    assert http.post(CMPL, json={"prompt": "hi", "max_tokens": 1}).status_code == 200
