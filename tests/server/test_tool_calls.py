"""Tool calls through the real openai client, on a server with the shipped Hermes template
and `--enable-auto-tool-choice --tool-call-parser hermes`: `required` and a named function
always return calls whose arguments validate against the function's parameters schema
(streamed and not, n > 1, the random model); `auto` parses <tool_call> blocks out of the
text into tool_calls (streamed as OpenAI's tool-call deltas); bad tool requests are 400s."""
from __future__ import annotations

import json

import jsonschema
import pytest

from engine.entrypoints.tool_calls import parse_hermes
from tests.server.conftest import MAIN_ARGS, REPO, ServerProcess

pytestmark = pytest.mark.xdist_group("server")

WEATHER = {"type": "object", "properties": {
    "city": {"type": "string", "maxLength": 10},
    "unit": {"enum": ["celsius", "fahrenheit"]}}, "required": ["city", "unit"]}
ADD = {"type": "object", "properties": {
    "a": {"type": "integer", "minimum": -99, "maximum": 99},
    "b": {"type": "integer", "minimum": -99, "maximum": 99}}, "required": ["a", "b"]}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "weather",
                                           "parameters": WEATHER}},
         {"type": "function", "function": {"name": "add", "parameters": ADD}}]
SCHEMAS = {"get_weather": WEATHER, "add": ADD}
MSGS = [{"role": "user", "content": "what is the weather in Paris?"}]


@pytest.fixture(scope="module")
def tool_server():
    # the tools in the system prompt take ~650 tokens of the tiny 2k-token vocabulary
    proc = ServerProcess(*MAIN_ARGS, "--max-model-len", "1024", "--chat-template",
                         str(REPO / "examples/tool_chat_template_smollm2_hermes.jinja"),
                         "--enable-auto-tool-choice", "--tool-call-parser", "hermes")
    yield proc
    proc.stop()


@pytest.fixture()
def tools_client(tool_server):
    from openai import OpenAI

    return OpenAI(base_url=tool_server.base_url + "/v1", api_key="x", max_retries=0,
                  timeout=60)


def _valid(name: str, arguments: str) -> None:
    jsonschema.validate(json.loads(arguments), SCHEMAS[name])


def _streamed_calls(stream) -> tuple[dict[int, list[dict]], dict[int, str], dict[int, str]]:
    """Per choice: the tool calls assembled from deltas, the content, the finish reason."""
    calls: dict[int, list[dict]] = {}
    content: dict[int, str] = {}
    finish: dict[int, str] = {}
    for chunk in stream:
        for c in chunk.choices:
            content[c.index] = content.get(c.index, "") + (c.delta.content or "")
            for tc in c.delta.tool_calls or []:
                slots = calls.setdefault(c.index, [])
                if tc.index == len(slots):
                    slots.append({"id": tc.id, "name": tc.function.name, "arguments": ""})
                slots[tc.index]["arguments"] += tc.function.arguments or ""
            if c.finish_reason:
                finish[c.index] = c.finish_reason
    return calls, content, finish


def test_required_always_calls_a_tool(tools_client):
    model = tools_client.models.list().data[0].id
    resp = tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, tool_choice="required", n=3,
        temperature=1.0, seed=2, max_tokens=200)
    for choice in resp.choices:
        assert choice.finish_reason == "tool_calls" and choice.message.tool_calls
        for tc in choice.message.tool_calls:
            assert tc.id.startswith("call_") and tc.type == "function"
            _valid(tc.function.name, tc.function.arguments)
    stream = tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, tool_choice="required", n=2,
        temperature=1.0, seed=5, max_tokens=200, stream=True, parallel_tool_calls=False)
    calls, _, finish = _streamed_calls(stream)
    assert set(calls) == {0, 1} and finish == {0: "tool_calls", 1: "tool_calls"}
    for slots in calls.values():
        assert len(slots) == 1  # parallel_tool_calls false: one call
        _valid(slots[0]["name"], slots[0]["arguments"])


@pytest.mark.parametrize("name", ["get_weather", "add"])
def test_named_function_is_called_with_valid_arguments(tools_client, name):
    model = tools_client.models.list().data[0].id
    choice = {"type": "function", "function": {"name": name}}
    resp = tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, tool_choice=choice, n=2, temperature=1.0,
        seed=3, max_tokens=120)
    for c in resp.choices:
        (tc,) = c.message.tool_calls
        assert tc.function.name == name and c.message.content is None
        _valid(name, tc.function.arguments)
    stream = tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, tool_choice=choice, temperature=1.0,
        seed=3, max_tokens=120, stream=True, n=2)
    calls, _, _ = _streamed_calls(stream)
    # seeded: streamed arguments equal the unstreamed ones, sample for sample
    assert [calls[i][0]["arguments"] for i in (0, 1)] == \
        [c.message.tool_calls[0].function.arguments for c in resp.choices]
    assert all(calls[i][0]["name"] == name for i in (0, 1))


FORCED_HERMES = ('root ::= "Sure. <tool_call>\\n{\\"name\\": \\"get_weather\\", \\"arguments\\": '
                 '{\\"city\\": \\"" [a-z] [a-z] [a-z] "\\", \\"unit\\": \\"celsius\\"}}\\n'
                 '</tool_call>"')


def test_auto_parses_hermes_calls_streamed_and_not(tools_client):
    """The random model will not write a call by itself: a grammar makes it write one in
    Hermes' format; the parser must turn it into a call and the text before into content."""
    model = tools_client.models.list().data[0].id
    extra = {"structured_outputs": {"grammar": FORCED_HERMES}}
    resp = tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, tool_choice="auto", max_tokens=200,
        temperature=0, extra_body=extra)
    (c,) = resp.choices
    assert c.finish_reason == "tool_calls" and c.message.content == "Sure."
    (tc,) = c.message.tool_calls
    assert tc.function.name == "get_weather"
    _valid("get_weather", tc.function.arguments)
    calls, content, finish = _streamed_calls(tools_client.chat.completions.create(
        model=model, messages=MSGS, tools=TOOLS, max_tokens=200, temperature=0,
        extra_body=extra, stream=True))
    assert content[0].strip() == "Sure." and finish[0] == "tool_calls"
    assert [(s["name"], json.loads(s["arguments"])) for s in calls[0]] == \
        [("get_weather", json.loads(tc.function.arguments))]
    # plain text stays content, with no calls; tool_choice none likewise
    for choice in ("auto", "none"):
        resp = tools_client.chat.completions.create(
            model=model, messages=MSGS, tools=TOOLS, tool_choice=choice, max_tokens=8,
            temperature=0)
        assert resp.choices[0].message.tool_calls is None
        assert resp.choices[0].message.content


def test_tool_history_renders(tools_client):
    """A conversation holding an assistant's call and the tool's answer is accepted."""
    model = tools_client.models.list().data[0].id
    messages = MSGS + [
        {"role": "assistant", "content": None, "tool_calls": [{
            "id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "18 C"}]
    resp = tools_client.chat.completions.create(model=model, messages=messages, tools=TOOLS,
                                                max_tokens=4)
    assert resp.choices[0].message.content is not None


@pytest.mark.parametrize("body,param", [
    ({"tool_choice": "required"}, "tool_choice"),  # no tools
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice"),
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "bad name!"}}]},
     "tools[0].function.name"),
    ({"tools": TOOLS + [TOOLS[0]], "tool_choice": "required"}, "tools"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {
        "type": "objectx"}}}], "tool_choice": {"type": "function", "function": {"name": "f"}}},
     "tools[0].function.parameters"),
    ({"tools": TOOLS, "tool_choice": "required", "response_format": {"type": "json_object"}},
     "tool_choice"),
])
def test_bad_tool_requests_are_400s(tool_server, body, param):
    import httpx

    r = httpx.post(tool_server.base_url + "/v1/chat/completions",
                   json={"messages": MSGS, "max_tokens": 2, **body}, timeout=30)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_auto_needs_the_flag(http):
    """The session server runs without --enable-auto-tool-choice: tools with tool_choice
    auto (the default) are a 400 saying what to do; required still works there."""
    r = http.post("/v1/chat/completions", json={"messages": MSGS, "tools": TOOLS})
    assert r.status_code == 400 and r.json()["error"]["param"] == "tool_choice"
    assert "--enable-auto-tool-choice" in r.json()["error"]["message"]
    r = http.post("/v1/chat/completions", json={"messages": MSGS, "tools": TOOLS,
                                                "tool_choice": "required", "max_tokens": 200})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["tool_calls"]


def test_parse_hermes():
    text = ('I will check. <tool_call>\n{"name": "a", "arguments": {"x": 1}}\n</tool_call>\n'
            '<tool_call>{"name": "b", "arguments": {}}</tool_call>')
    assert parse_hermes(text) == ("I will check.", [("a", '{"x": 1}'), ("b", "{}")])
    assert parse_hermes("no calls here") == ("no calls here", [])
    assert parse_hermes("<tool_call>{not json</tool_call>") == (
        "<tool_call>{not json</tool_call>", [])
    assert parse_hermes('<tool_call>{"name": "c", "arguments": {"y": "z"}}') == (
        None, [("c", '{"y": "z"}')])  # cut off before its end tag: still a call


def test_parse_required_keeps_the_calls_a_cut_array_completed():
    from engine.entrypoints.tool_calls import parse_required

    whole = '[{"name": "a", "parameters": {"x": 1}}, {"name": "b", "parameters": {}}]'
    assert parse_required(whole) == [("a", '{"x": 1}'), ("b", "{}")]
    assert parse_required(whole[:50]) == [("a", '{"x": 1}')]  # max_tokens cut the second
    assert parse_required('[{"na') is None
