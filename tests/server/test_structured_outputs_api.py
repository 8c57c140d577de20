"""response_format (json_object, json_schema) and vLLM's structured_outputs extras through
the real openai client: every completion, streamed or not, n > 1, matches its constraint on
the random tiny model; invalid constraints are 400s naming the field."""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

pytestmark = pytest.mark.xdist_group("server")

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "maxLength": 6},
        "rooms": {"type": "integer", "minimum": 1, "maximum": 9},
        "kind": {"enum": ["flat", "house"]},
    },
    "required": ["city", "rooms", "kind"],
    "additionalProperties": False,
}
MSGS = [{"role": "user", "content": "describe a home as JSON"}]
SCHEMA_FORMAT = {"type": "json_schema",
                 "json_schema": {"name": "home", "schema": SCHEMA, "strict": True}}


def test_chat_json_schema_n_and_streamed(client):
    resp = client.chat.completions.create(
        model=client.models.list().data[0].id, messages=MSGS, n=3, temperature=1.0, seed=4,
        max_tokens=80, response_format=SCHEMA_FORMAT)
    assert len(resp.choices) == 3
    for choice in resp.choices:
        assert choice.finish_reason == "stop"
        jsonschema.validate(json.loads(choice.message.content), SCHEMA)
    stream = client.chat.completions.create(
        model=resp.model, messages=MSGS, n=2, temperature=1.0, seed=9, max_tokens=80,
        response_format=SCHEMA_FORMAT, stream=True)
    texts = {0: "", 1: ""}
    for chunk in stream:
        for c in chunk.choices:
            texts[c.index] += c.delta.content or ""
    for text in texts.values():
        jsonschema.validate(json.loads(text), SCHEMA)


def test_completions_json_object_and_vllm_extras(client):
    model = client.models.list().data[0].id
    resp = client.completions.create(model=model, prompt="the cache", max_tokens=60,
                                     temperature=0,
                                     extra_body={"response_format": {"type": "json_object"}})
    assert isinstance(json.loads(resp.choices[0].text), dict)
    checks = {
        "choice": (["red", "green", "blue"], lambda t: t in ("red", "green", "blue")),
        "regex": (r"[A-Z][0-9]{2}", lambda t: re.fullmatch(r"[A-Z][0-9]{2}", t)),
        "json": (SCHEMA, lambda t: jsonschema.validate(json.loads(t), SCHEMA) is None),
        "grammar": ('root ::= "x" ("+" "x"){0,4}', lambda t: re.fullmatch(r"x(\+x){0,4}", t)),
    }
    for kind, (spec, valid) in checks.items():
        resp = client.completions.create(
            model=model, prompt=["hello world", "the model"], n=2, max_tokens=60,
            temperature=1.0, seed=1, extra_body={"structured_outputs": {kind: spec}})
        assert len(resp.choices) == 4
        for c in resp.choices:
            assert c.finish_reason == "stop" and valid(c.text), (kind, c.text)


@pytest.mark.parametrize("body,param", [
    ({"response_format": {"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objectx"}}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema"}}, "response_format.json_schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"structured_outputs": {"regex": "(ab"}}, "structured_outputs"),
    ({"structured_outputs": {"grammar": "root ::= "}}, "structured_outputs"),
    ({"structured_outputs": {"regex": "a", "choice": ["a"]}}, "structured_outputs"),
    ({"structured_outputs": {"choice": ["a"]}, "response_format": {"type": "json_object"}},
     "structured_outputs"),
])
def test_invalid_constraint_is_a_400_naming_the_field(http, body, param):
    r = http.post("/v1/chat/completions", json={"messages": MSGS, "max_tokens": 4, **body})
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param
    assert http.post("/v1/chat/completions",
                     json={"messages": MSGS, "max_tokens": 2}).status_code == 200
