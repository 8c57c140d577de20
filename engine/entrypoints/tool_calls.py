"""Tool calling on /v1/chat/completions: `tool_choice` as a constraint, the Hermes parser,
and the assistant message (or stream deltas) that carries the calls.

- `required`: the output is forced (structured outputs) to a JSON array of
  {"name": <one of the tools>, "parameters": <its parameters schema>}; each item is a call.
- a named function: the output is forced to that function's parameters schema; it is the
  call's arguments.
- `auto` (needs `--enable-auto-tool-choice --tool-call-parser hermes`): the model writes
  freely; `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` blocks in its text
  become calls and the text before them the content.
- `none`: no calls.
Works on the request duck-typed (no import of chat_protocol.py, which imports this lazily).
"""
from __future__ import annotations

import json
import re
import uuid
from typing import Any

from engine.entrypoints.errors import APIError
from engine.structured_output import StructuredOutputsParams

TOOL_CALL_PARSERS = ("hermes",)
_HERMES_START, _HERMES_END = "<tool_call>", "</tool_call>"
_HERMES_BLOCK = re.compile(r"<tool_call>\s*(.*?)\s*(?:</tool_call>|$)", re.DOTALL)


def tool_mode(req: Any) -> str:
    """none | auto | required | named."""
    choice = req.tool_choice
    if not req.tools or choice == "none":
        return "none"
    if choice is None or choice == "auto":
        return "auto"
    if choice == "required":
        return "required"
    return "named"


def check_tools(req: Any, *, auto_parser: str | None) -> str:
    """Validate tools and tool_choice (400s naming the field); return the mode."""
    if req.tool_choice not in (None, "none") and not req.tools:
        raise APIError("tool_choice needs tools", param="tool_choice")
    names = [t.function.name for t in req.tools or []]
    if len(set(names)) != len(names):
        raise APIError("tool function names must be unique", param="tools")
    mode = tool_mode(req)
    if mode == "named" and req.tool_choice.function.name not in names:
        raise APIError(f"tool_choice names {req.tool_choice.function.name!r}, which is not "
                       "among tools", param="tool_choice")
    if mode == "auto" and auto_parser is None:
        raise APIError('"auto" tool choice needs the server started with '
                       "--enable-auto-tool-choice --tool-call-parser hermes; send "
                       'tool_choice "required", "none" or a named function',
                       param="tool_choice")
    return mode


def _parameters(function: Any) -> dict[str, Any]:
    return function.parameters or {"type": "object", "properties": {}}


def tool_constraint(req: Any) -> tuple[StructuredOutputsParams, str] | None:
    """The constraint that forces a call (required, named), and the field it comes from."""
    mode = tool_mode(req)
    if mode == "named":
        index, function = next((i, t.function) for i, t in enumerate(req.tools)
                               if t.function.name == req.tool_choice.function.name)
        return (StructuredOutputsParams(json=_parameters(function)),
                f"tools[{index}].function.parameters")
    if mode == "required":
        items = [{"type": "object", "properties": {
            "name": {"type": "string", "enum": [t.function.name]},
            "parameters": _parameters(t.function)}, "required": ["name", "parameters"]}
            for t in req.tools]
        schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": items}}
        if req.parallel_tool_calls is False:
            schema["maxItems"] = 1
        return StructuredOutputsParams(json=schema), "tools"
    return None


def new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:24]}"


def call(name: str, arguments: str, call_id: str | None = None) -> dict[str, Any]:
    return {"id": call_id or new_call_id(), "type": "function",
            "function": {"name": name, "arguments": arguments}}


def parse_required(text: str) -> list[tuple[str, str]] | None:
    """The calls of a `required` output (a JSON array); if max_tokens cut the array short,
    the items it completed; None if not even one."""
    decoder, items, pos = json.JSONDecoder(), [], text.find("[") + 1
    while pos > 0:
        while pos < len(text) and text[pos] in " ,\n":
            pos += 1
        try:
            item, pos = decoder.raw_decode(text, pos)
        except ValueError:
            break
        items.append(item)
    calls = [(item["name"], json.dumps(item["parameters"], ensure_ascii=False))
             for item in items if isinstance(item, dict) and "name" in item]
    return calls or None


def parse_hermes(text: str) -> tuple[str | None, list[tuple[str, str]]]:
    """(content before the first call or None, [(name, arguments JSON)]); a block that is
    not a JSON object with a name leaves the whole text as content."""
    start = text.find(_HERMES_START)
    if start < 0:
        return text, []
    calls = []
    for block in _HERMES_BLOCK.findall(text[start:]):
        try:
            obj = json.loads(block)
            name = obj["name"]
            arguments = obj.get("arguments", obj.get("parameters", {}))
        except (ValueError, KeyError, TypeError, AttributeError):
            return text, []
        if not isinstance(name, str):
            return text, []
        calls.append((name, json.dumps(arguments, ensure_ascii=False)))
    content = text[:start].strip()
    return content or None, calls


def message(mode: str, text: str, finish_reason: str | None, *, named: str | None
            ) -> tuple[dict[str, Any], str | None]:
    """The assistant message of a finished choice, and its finish_reason."""
    calls: list[tuple[str, str]] = []
    content: str | None = text
    if mode == "named":
        calls, content = [(named or "", text)], None
    elif mode == "required":
        parsed = parse_required(text)
        if parsed is not None:
            calls, content = parsed, None
    elif mode == "auto":
        content, calls = parse_hermes(text)
    msg: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        msg["tool_calls"] = [call(n, a) for n, a in calls]
        if mode != "named" and finish_reason == "stop":
            finish_reason = "tool_calls"
    return msg, finish_reason


class ToolStream:
    """One streamed choice's deltas: named calls stream their arguments as they come;
    required and auto calls are sent whole once the choice finishes (auto streams the
    content before its first `<tool_call>` as it comes)."""

    def __init__(self, mode: str, named: str | None) -> None:
        self.mode, self.named = mode, named
        self.sent = 0  # characters of the text accounted for
        self.call_id = new_call_id()

    def delta(self, text: str, finish_reason: str | None) -> tuple[dict[str, Any], str | None]:
        done = finish_reason is not None
        if self.mode == "named":
            piece, first = text[self.sent:], self.sent == 0
            self.sent = len(text)
            fn: dict[str, Any] = {"arguments": piece}
            entry: dict[str, Any] = {"index": 0, "function": fn}
            if first:
                fn["name"] = self.named
                entry.update(id=self.call_id, type="function")
            return {"tool_calls": [entry]}, finish_reason
        if self.mode == "auto":
            safe = _before_call(text)
            out: dict[str, Any] = {}
            if safe > self.sent:
                out["content"] = text[self.sent:safe]
                self.sent = safe
            if done and safe < len(text):
                _, calls = parse_hermes(text)
                if calls:
                    out["tool_calls"] = [{"index": i, **call(n, a)}
                                         for i, (n, a) in enumerate(calls)]
                    return out, "tool_calls" if finish_reason == "stop" else finish_reason
                out["content"] = out.get("content", "") + text[safe:]
            return out, finish_reason
        if done:  # required
            parsed = parse_required(text)
            if parsed is None:
                return {"content": text}, finish_reason
            return {"tool_calls": [{"index": i, **call(n, a)} for i, (n, a) in enumerate(parsed)]
                    }, "tool_calls" if finish_reason == "stop" else finish_reason
        return {}, None


def _before_call(text: str) -> int:
    """How much of text is surely content: up to a `<tool_call>`, or to a trailing prefix of
    one that the next tokens may complete."""
    start = text.find(_HERMES_START)
    if start >= 0:
        return start
    for k in range(min(len(_HERMES_START) - 1, len(text)), 0, -1):
        if text.endswith(_HERMES_START[:k]):
            return len(text) - k
    return len(text)
