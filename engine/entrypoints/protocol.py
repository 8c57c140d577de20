"""Request bodies of the OpenAI-compatible API (pydantic), and their SamplingParams.

Types are checked here (a wrong type is a 400 naming the field); value ranges are
checked once, by the engine's `SamplingParams`, whose ValueError names the field.
"""
from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt

from engine.entrypoints.errors import APIError

# Fields of SamplingParams that a request may set directly (vLLM's names).
_DIRECT_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                  "stop_token_ids", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "ignore_eos", "min_tokens", "skip_special_tokens",
                  "include_stop_str_in_output")


class _Body(BaseModel):
    # Unknown fields are ignored, as OpenAI's own clients send some we do not use (`user`).
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: StrictBool = False


class _SamplingRequest(_Body):
    model: str | None = None
    n: StrictInt = 1
    max_tokens: StrictInt | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: StrictInt | None = None
    min_p: float | None = None
    seed: StrictInt | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[StrictInt] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: StrictInt | None = None
    skip_special_tokens: StrictBool | None = None
    include_stop_str_in_output: StrictBool | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras for the prefix cache and the priority scheduler.
    cache_salt: str | None = None
    priority: StrictInt = 0
    # Accepted for compatibility only when they ask for nothing we lack.
    logit_bias: dict[str, float] | None = None
    best_of: StrictInt | None = None

    def _max_new_tokens(self) -> int | None:
        return self.max_tokens

    def _num_logprobs(self) -> int | None:
        return None

    def sampling_params(self):
        """A fresh SamplingParams (one per engine request: the engine may keep state in it)."""
        from engine import SamplingParams

        if self.logit_bias:
            raise APIError("logit_bias is not supported", param="logit_bias")
        if self.best_of is not None and self.best_of != self.n:
            raise APIError("best_of is not supported (use n)", param="best_of")
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed when stream is true",
                           param="stream_options")
        kwargs: dict[str, Any] = {f: getattr(self, f) for f in _DIRECT_FIELDS
                                  if getattr(self, f) is not None}
        # OpenAI's max_tokens, when absent, means "up to the context length" in vLLM's
        # server; SamplingParams spells that max_tokens=None.
        kwargs["max_tokens"] = self._max_new_tokens()
        num_logprobs = self._num_logprobs()
        if num_logprobs is not None:
            kwargs["logprobs"] = num_logprobs
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), param=_field_named_in(str(exc), kwargs)) from None


def _field_named_in(message: str, kwargs: dict[str, Any]) -> str | None:
    """The request field an engine error message is about (it starts with the name)."""
    for name in sorted(kwargs, key=len, reverse=True):
        if message.startswith(name) or f"({name}" in message:
            return name
    return None


class CompletionRequest(_SamplingRequest):
    # A string, a list of strings, a list of token ids, or a list of token-id lists.
    prompt: str | list[str] | list[StrictInt] | list[list[StrictInt]]
    logprobs: StrictInt | None = None
    echo: StrictBool = False
    suffix: str | None = None

    def _num_logprobs(self) -> int | None:
        if self.echo:
            raise APIError("echo is not supported", param="echo")
        if self.suffix:
            raise APIError("suffix is not supported", param="suffix")
        return self.logprobs

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class ChatMessage(_Body):
    role: Literal["system", "user", "assistant", "tool", "developer"]
    content: str | list[dict[str, Any]] | None = None
    name: str | None = None

    def text(self, index: int) -> str:
        """Content as one string; text parts are joined, other parts are refused."""
        if self.content is None or isinstance(self.content, str):
            return self.content or ""
        pieces = []
        for j, part in enumerate(self.content):
            if part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise APIError("only text content parts are supported",
                               param=f"messages[{index}].content[{j}]")
            pieces.append(part["text"])
        return "".join(pieces)


class ChatCompletionRequest(_SamplingRequest):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: StrictInt | None = None
    logprobs: StrictBool = False
    top_logprobs: StrictInt | None = None
    add_generation_prompt: StrictBool = True
    tools: list[Any] | None = None
    response_format: dict[str, Any] | None = None

    def _max_new_tokens(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None \
            else self.max_tokens

    def _num_logprobs(self) -> int | None:
        if self.tools:
            raise APIError("tools are not supported", param="tools")
        if self.response_format and self.response_format.get("type", "text") != "text":
            raise APIError("only response_format type 'text' is supported",
                           param="response_format")
        if self.top_logprobs is not None and not self.logprobs:
            raise APIError("top_logprobs requires logprobs to be true", param="top_logprobs")
        return (self.top_logprobs or 0) if self.logprobs else None

    def conversation(self) -> list[dict[str, str]]:
        return [{"role": m.role, "content": m.text(i)} for i, m in enumerate(self.messages)]


class TokenizeRequest(_Body):
    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: StrictBool = True
    add_generation_prompt: StrictBool = True


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[StrictInt]
