"""API fuzzing with schemathesis against the served /openapi.json: no 5xx, and every
status the server answers is one the document lists (its 4xx included).

Bounded: a fixed number of examples per operation, and generated requests ask for at
most a few tokens (`max_tokens` absent would run to max_model_len, seconds per case on
CPU), so the whole module takes about a minute on the session server.
"""
from __future__ import annotations

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, settings
from schemathesis.specs.openapi.checks import status_code_conformance

from tests.server.conftest import scrape

pytestmark = pytest.mark.xdist_group("server")
MAX_NEW_TOKENS = 3


@pytest.fixture()
def api_schema(server):
    return schemathesis.openapi.from_url(server.base_url + "/openapi.json")


schema = schemathesis.pytest.from_fixture("api_schema")


def _bounded(body: object) -> object:
    if isinstance(body, dict):
        for field in ("max_tokens", "max_completion_tokens"):
            value = body.get(field)
            if not isinstance(value, int) or isinstance(value, bool) or value > MAX_NEW_TOKENS:
                body[field] = MAX_NEW_TOKENS
    return body


@schema.parametrize()
@settings(max_examples=20, deadline=None, phases=[Phase.explicit, Phase.generate],
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_5xx_and_only_documented_statuses(case):
    if case.method == "POST" and case.body is not None:
        case.body = _bounded(case.body)
    response = case.call(timeout=60)
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    case.validate_response(response, checks=[status_code_conformance])


# The fields that evaluation and agent tools send, made required in a copy of the document
# so that every generated body carries them (in the document above they are optional and
# rarely drawn).
NEW_FIELDS = {
    "CompletionRequest": ["echo", "logprobs", "prompt_logprobs", "logit_bias", "best_of",
                          "response_format", "structured_outputs"],
    "ChatCompletionRequest": ["tools", "tool_choice", "response_format", "logit_bias",
                              "structured_outputs", "prompt_logprobs"],
}


@pytest.fixture()
def new_fields_schema(server):
    import httpx

    doc = httpx.get(server.base_url + "/openapi.json").json()
    for name, fields in NEW_FIELDS.items():
        model = doc["components"]["schemas"][name]
        assert set(fields) <= set(model["properties"]), name  # documented
        model["required"] = sorted({*model.get("required", []), *fields})
    doc["paths"] = {k: v for k, v in doc["paths"].items()
                    if k in ("/v1/completions", "/v1/chat/completions")}
    schema = schemathesis.openapi.from_dict(doc)
    schema.config.update(base_url=server.base_url)
    return schema


new_fields = schemathesis.pytest.from_fixture("new_fields_schema")


@new_fields.parametrize()
@settings(max_examples=15, deadline=None, phases=[Phase.generate],
          suppress_health_check=list(HealthCheck), derandomize=True)
def test_new_fields_no_5xx(case):
    case.body = _bounded(case.body)
    response = case.call(timeout=60)
    assert response.status_code < 500, (case.as_curl_command(), response.text[:500])
    case.validate_response(response, checks=[status_code_conformance])


def test_the_document_lists_the_4xx_we_answer(server):
    import httpx

    doc = httpx.get(server.base_url + "/openapi.json").json()
    responses = doc["paths"]["/v1/completions"]["post"]["responses"]
    assert {"400", "401", "404", "413", "429", "503"} <= set(responses)
    assert "422" not in responses  # FastAPI's default: this server answers 400 instead
    error = doc["components"]["schemas"]["ErrorResponse"]
    assert error["properties"]["error"]["$ref"].endswith("ErrorDetail")
    # the fuzzing left no block in use and no failed step behind
    metrics = scrape(server.base_url)
    assert metrics["paged:engine_step_failures_total"] == 0
