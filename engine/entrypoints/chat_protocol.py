"""Chat request bodies of the OpenAI-compatible API (pydantic): messages, tools and tool
calls, `/v1/chat/completions`, and `/tokenize` (which takes messages too). The field types
and the sampling fields they share with completions are protocol.py's."""
from __future__ import annotations

import json
from typing import Annotated, Any, Literal

from pydantic import Field, StrictBool, StrictInt

from engine.entrypoints.errors import APIError
from engine.entrypoints.protocol import Count, Text, RequestBody, SamplingRequest, valid_unicode


class FunctionDefinition(RequestBody):
    name: Annotated[str, Field(pattern=r"^[A-Za-z0-9_.\-]{1,64}$")]
    description: Text | None = None
    parameters: dict[str, Any] | None = None  # a JSON schema of the arguments object
    strict: StrictBool | None = None


class Tool(RequestBody):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(RequestBody):
    name: Text


class NamedToolChoice(RequestBody):
    type: Literal["function"]
    function: NamedFunction


class ToolCallFunction(RequestBody):
    name: Text
    arguments: Text


class ToolCall(RequestBody):
    id: Text | None = None
    type: Literal["function"] = "function"
    function: ToolCallFunction


class ChatMessage(RequestBody):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: Text | list[dict[str, Any]] | None = None
    name: Text | None = None
    tool_calls: list[ToolCall] | None = None  # an assistant's earlier calls
    tool_call_id: Text | None = None  # the call a tool message answers

    def text(self, index: int) -> str:
        """Content as one string; text parts are joined, other parts are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        pieces = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError("only text content parts are supported",
                               param=f"messages[{index}].content[{j}]")
            try:
                pieces.append(valid_unicode(part["text"]))
            except ValueError as exc:
                raise APIError(f"text {exc}", param=f"messages[{index}].content[{j}]") \
                    from None
        return "".join(pieces)


class ChatCompletionRequest(SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: Count | None = None
    logprobs: StrictBool = False
    top_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    add_generation_prompt: StrictBool = True
    tools: list[Tool] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: StrictBool | None = None

    def _max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    def _num_logprobs(self) -> int | None:
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> list[dict[str, Any]]:
        """Messages as chat templates take them; an assistant's tool calls carry their
        arguments as objects (JSON text that does not parse stays text)."""
        out = []
        for i, m in enumerate(self.messages):
            msg: dict[str, Any] = {"role": m.role, "content": m.text(i)}
            if m.name is not None:
                msg["name"] = m.name
            if m.tool_call_id is not None:
                msg["tool_call_id"] = m.tool_call_id
            if m.tool_calls:
                msg["tool_calls"] = [{"id": c.id, "type": "function", "function": {
                    "name": c.function.name, "arguments": _json_or_text(c.function.arguments)}}
                    for c in m.tool_calls]
            out.append(msg)
        return out

    def constraint(self) -> tuple[Any, str] | None:
        from engine.entrypoints.tool_calls import tool_constraint

        forced = tool_constraint(self)
        if forced is not None:
            if self.response_format is not None and self.response_format.type != "text" or \
                    self.structured_outputs is not None:
                raise APIError("tool_choice required or a named function already constrains "
                               "the output; drop response_format / structured_outputs",
                               param="tool_choice")
            return forced
        return super().constraint()


def _json_or_text(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return text


class TokenizeRequest(RequestBody):
    model: Text | None = None
    prompt: Text | None = None
    messages: list[ChatMessage] | None = Field(default=None, min_length=1)
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True
