"""Request bodies of the OpenAI-compatible API (pydantic), and their SamplingParams; the
chat bodies (messages, tools, `/tokenize`) are in chat_protocol.py.

Types and the ranges every engine needs are checked here, at the edge (a wrong value is
a 400 naming the field, and the OpenAPI document shows the bounds): floats are finite,
strings are valid Unicode (no lone surrogates), integers fit the 64 bits the engine's
tensors and generators hold, and `seed + n - 1` too. Finer rules (top_p in (0, 1],
min_tokens <= max_tokens, ...) are checked once more by the engine's `SamplingParams`,
whose ValueError also names the field.
"""
from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictBool, StrictInt

from engine.entrypoints.errors import APIError

# Fields of SamplingParams that a request may set directly (vLLM's names).
_DIRECT_FIELDS = ("n", "temperature", "top_p", "top_k", "min_p", "seed", "stop",
                  "stop_token_ids", "presence_penalty", "frequency_penalty",
                  "repetition_penalty", "ignore_eos", "min_tokens", "skip_special_tokens",
                  "include_stop_str_in_output")


U64_MAX = 2**64 - 1
I64_MIN, I64_MAX = -(2**63), 2**63 - 1
TOP_K_MAX = 2**31 - 1  # any top_k >= the vocabulary means "no top-k": larger ones clamp


def valid_unicode(text: str) -> str:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise ValueError(f"contains a lone surrogate (\\u{ord(text[exc.start]):04x} at "
                         f"character {exc.start}); send valid Unicode text") from None
    return text


Text = Annotated[str, AfterValidator(valid_unicode)]
Finite = Annotated[float, Field(allow_inf_nan=False)]
Int64 = Annotated[StrictInt, Field(ge=I64_MIN, le=I64_MAX)]
Count = Annotated[StrictInt, Field(ge=1, le=I64_MAX)]
TokenId = Annotated[StrictInt, Field(ge=0, le=I64_MAX)]


class RequestBody(BaseModel):
    # Unknown fields are ignored, as OpenAI's own clients send some we do not use (`user`).
    model_config = ConfigDict(extra="ignore")


class StreamOptions(RequestBody):
    include_usage: StrictBool = False


class JsonSchemaFormat(RequestBody):
    name: Text = "response"
    description: Text | None = None
    schema_: dict[str, Any] | None = Field(default=None, alias="schema")
    strict: StrictBool | None = None


class ResponseFormat(RequestBody):
    """OpenAI's `response_format`: free text, any JSON object, or JSON of a schema."""
    type: Literal["text", "json_object", "json_schema"]
    json_schema: JsonSchemaFormat | None = None


class StructuredOutputs(RequestBody):
    """vLLM's `structured_outputs` extra: exactly one constraint."""
    json_: dict[str, Any] | Text | None = Field(default=None, alias="json")
    json_object: StrictBool | None = None
    regex: Text | None = None
    choice: list[Text] | None = None
    grammar: Text | None = None


class SamplingRequest(RequestBody):
    model: Text | None = None
    n: Annotated[StrictInt, Field(ge=1, le=1024)] = 1
    max_tokens: Count | None = None
    temperature: Annotated[Finite, Field(ge=0)] | None = None
    top_p: Annotated[Finite, Field(gt=0, le=1)] | None = None
    top_k: Annotated[StrictInt, Field(ge=-1)] | None = None
    min_p: Annotated[Finite, Field(ge=0, le=1)] | None = None
    seed: Annotated[StrictInt, Field(ge=I64_MIN, le=U64_MAX)] | None = None
    stop: Text | list[Text] | None = None
    stop_token_ids: list[TokenId] | None = None
    presence_penalty: Annotated[Finite, Field(ge=-2, le=2)] | None = None
    frequency_penalty: Annotated[Finite, Field(ge=-2, le=2)] | None = None
    repetition_penalty: Annotated[Finite, Field(gt=0)] | None = None
    ignore_eos: StrictBool | None = None
    min_tokens: Annotated[StrictInt, Field(ge=0, le=I64_MAX)] | None = None
    skip_special_tokens: StrictBool | None = None
    include_stop_str_in_output: StrictBool | None = None
    stream: StrictBool = False
    stream_options: StreamOptions | None = None
    # vLLM's extras for the prefix cache and the priority scheduler.
    cache_salt: Text | None = None
    priority: Int64 = 0
    # OpenAI's: token id (a string, as JSON keys are) -> bias added to its logit.
    logit_bias: dict[str, Annotated[Finite, Field(ge=-100, le=100)]] | None = None
    # Sample best_of sequences, return the n of highest cumulative logprob (not streamable).
    best_of: Annotated[StrictInt, Field(ge=1, le=1024)] | None = None
    # vLLM's: logprobs of the prompt's tokens with this many alternatives each.
    prompt_logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    response_format: ResponseFormat | None = None
    structured_outputs: StructuredOutputs | None = None

    def _max_new_tokens(self) -> int | None:
        return self.max_tokens

    def _num_logprobs(self) -> int | None:
        return None

    def _num_prompt_logprobs(self) -> int | None:
        return self.prompt_logprobs

    def constraint(self) -> tuple[Any, str] | None:
        """(StructuredOutputsParams, the field it came from) or None, from response_format or
        structured_outputs (not both)."""
        from engine.structured_output import StructuredOutputsParams

        rf, so = self.response_format, self.structured_outputs
        if rf is not None and rf.type != "text" and so is not None:
            raise APIError("send response_format or structured_outputs, not both",
                           param="structured_outputs")
        if rf is not None and rf.type == "json_object":
            return StructuredOutputsParams(json_object=True), "response_format"
        if rf is not None and rf.type == "json_schema":
            if rf.json_schema is None or rf.json_schema.schema_ is None:
                raise APIError("response_format type json_schema needs json_schema.schema",
                               param="response_format.json_schema")
            return (StructuredOutputsParams(json=rf.json_schema.schema_),
                    "response_format.json_schema.schema")
        if so is None:
            return None
        try:
            return StructuredOutputsParams(
                json=so.json_, json_object=bool(so.json_object), regex=so.regex,
                choice=so.choice, grammar=so.grammar), "structured_outputs"
        except ValueError as exc:
            raise APIError(str(exc), param="structured_outputs") from None

    def sampling_params(self):
        """A fresh SamplingParams (one per engine request: the engine may keep state in it)."""
        from engine import SamplingParams

        if self.best_of is not None and self.best_of < self.n:
            raise APIError(f"best_of must be >= n (got best_of={self.best_of}, n={self.n})",
                           param="best_of")
        if self.best_of is not None and self.best_of > self.n and self.stream:
            raise APIError("best_of > n cannot be streamed (the best are known at the end)",
                           param="best_of")
        best_of = self.best_of or self.n
        # Sample i of a request seeded s draws from a generator seeded s + i.
        if self.seed is not None and self.seed + best_of - 1 > U64_MAX:
            raise APIError(f"seed + n - 1 must fit in 64 bits (<= {U64_MAX}); lower seed",
                           param="seed")
        if self.stream_options is not None and not self.stream:
            raise APIError("stream_options is only allowed when stream is true",
                           param="stream_options")
        kwargs: dict[str, Any] = {f: getattr(self, f) for f in _DIRECT_FIELDS
                                  if getattr(self, f) is not None}
        if kwargs.get("top_k", 0) > TOP_K_MAX:
            kwargs["top_k"] = -1  # at least the whole vocabulary: no truncation
        # OpenAI's max_tokens, when absent, means "up to the context length" in vLLM's
        # server; SamplingParams spells that max_tokens=None.
        kwargs["max_tokens"] = self._max_new_tokens()
        num_logprobs = self._num_logprobs()
        if num_logprobs is not None:
            kwargs["logprobs"] = num_logprobs
        kwargs["prompt_logprobs"] = self._num_prompt_logprobs()
        if self.best_of is not None:
            kwargs["best_of"] = self.best_of
        if self.logit_bias:
            kwargs["logit_bias"] = _token_bias(self.logit_bias)
        constraint = self.constraint()
        if constraint is not None:
            kwargs["structured_outputs"] = constraint[0]
        try:
            return SamplingParams(**kwargs)
        except (ValueError, TypeError) as exc:
            raise APIError(str(exc), param=_field_named_in(str(exc), kwargs)) from None


def _token_bias(bias: dict[str, float]) -> dict[int, float]:
    out = {}
    for key, value in bias.items():
        if not key.strip().isdigit() or int(key) > I64_MAX:
            raise APIError(f"logit_bias keys must be token ids (non-negative integers as "
                           f"strings), got {key[:40]!r}", param="logit_bias")
        out[int(key)] = value
    return out


def _field_named_in(message: str, kwargs: dict[str, Any]) -> str | None:
    """The request field an engine error message is about (it starts with the name)."""
    for name in sorted(kwargs, key=len, reverse=True):
        if message.startswith(name) or f"({name}" in message:
            return name
    return None


class CompletionRequest(SamplingRequest):
    # A string, a list of strings, a list of token ids, or a list of token-id lists.
    prompt: Text | list[Text] | list[TokenId] | list[list[TokenId]]
    # 0 only with echo: the prompt (and its logprobs) alone, as lm-evaluation-harness asks
    max_tokens: Annotated[StrictInt, Field(ge=0, le=I64_MAX)] | None = None
    logprobs: Annotated[StrictInt, Field(ge=0, le=20)] | None = None
    echo: StrictBool = False
    suffix: Text | None = None

    @property
    def prompt_only(self) -> bool:
        return self.echo and self.max_tokens == 0

    def _max_new_tokens(self) -> int | None:
        if self.max_tokens == 0:
            if not self.echo:
                raise APIError("max_tokens must be >= 1 (0 only with echo: the prompt alone)",
                               param="max_tokens")
            return 1  # the engine samples one token, which the response leaves out
        return self.max_tokens

    def _num_logprobs(self) -> int | None:
        if self.suffix:
            raise APIError("suffix is not supported", param="suffix")
        return self.logprobs

    def _num_prompt_logprobs(self) -> int | None:
        echoed = self.logprobs if self.echo else None
        asked = [k for k in (self.prompt_logprobs, echoed) if k is not None]
        return max(asked) if asked else None

    def prompts(self) -> list[str | list[int]]:
        p = self.prompt
        if isinstance(p, str):
            return [p]
        if not p:
            raise APIError("prompt must not be empty", param="prompt")
        if all(isinstance(x, int) for x in p):
            return [list(p)]
        return list(p)


class DetokenizeRequest(RequestBody):
    model: Text | None = None
    tokens: list[TokenId]
