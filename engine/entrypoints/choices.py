"""What one choice of a response shows of an engine output (whole, or a stream's delta).

`CompletionView`: with echo the prompt's text (and, with logprobs, its tokens' logprobs)
first; with max_tokens 0 nothing generated; vLLM's prompt_logprobs on the first. `ChatView`:
the message or its delta, tool calls as tool_calls.py shapes them. The logprob entries and
their JSON come from `serving` (Serving._entries, _format, _vllm_prompt_logprobs).
"""
from __future__ import annotations

from typing import Any

from engine.entrypoints.chat_protocol import ChatCompletionRequest
from engine.entrypoints.protocol import CompletionRequest
from engine.entrypoints.tool_calls import ToolStream
from engine.entrypoints.tool_calls import message as tool_message


class CompletionView:
    """What a /v1/completions choice shows of an engine output: with echo the prompt's text
    (and, with logprobs, its tokens' logprobs) first; with max_tokens 0 nothing generated."""

    def __init__(self, serving: Any, req: CompletionRequest,
                 echo_texts: list[str] | None) -> None:
        self.serving, self.req, self.echo_texts = serving, req, echo_texts
        self.prompt_only = req.prompt_only
        self.has_prefix = echo_texts is not None or req.prompt_logprobs is not None

    def num_tokens(self, c: Any) -> int:
        return 0 if self.prompt_only else len(c.token_ids)

    def num_chars(self, c: Any) -> int:
        return 0 if self.prompt_only else len(c.text)

    def choice(self, p_index: int, out: Any, c: Any, *, start: int, first: bool,
               sent_chars: int = 0) -> dict[str, Any]:
        req, serving = self.req, self.serving
        ids, lps, text = (([], [], "") if self.prompt_only
                          else (c.token_ids, c.logprobs or [], c.text))
        k = req.logprobs or 0
        entries = serving._entries(ids[start:], lps[start:], k)
        prefix, offset0 = "", sent_chars
        if first and self.echo_texts is not None:
            prefix = self.echo_texts[p_index]
            if req.logprobs is not None:
                entries = serving._entries(out.prompt_token_ids, out.prompt_logprobs, k) + entries
            offset0 = 0
        body = {"text": prefix + text[sent_chars:],
                "logprobs": (serving._format(entries, chat=False, offset0=offset0)
                             if req.logprobs is not None else None),
                "finish_reason": ("length" if self.prompt_only and c.finish_reason
                                  else c.finish_reason),
                "stop_reason": None if self.prompt_only else c.stop_reason}
        if first and req.prompt_logprobs is not None:
            body["prompt_logprobs"] = serving._vllm_prompt_logprobs(out, req.prompt_logprobs)
        return body


class ChatView:
    """What a chat choice shows: the message (or, streaming, its delta) and logprobs."""

    has_prefix = False

    def __init__(self, serving: Any, req: ChatCompletionRequest, mode: str) -> None:
        self.serving, self.req, self.mode = serving, req, mode
        self.named = req.tool_choice.function.name if mode == "named" else None
        self.streams: dict[int, ToolStream] = {}  # choice index -> its tool-call deltas

    @staticmethod
    def num_tokens(c: Any) -> int:
        return len(c.token_ids)

    @staticmethod
    def num_chars(c: Any) -> int:
        return len(c.text)

    def choice(self, p_index: int, out: Any, c: Any, *, start: int, first: bool,
               sent_chars: int | None = None) -> dict[str, Any]:
        req, serving = self.req, self.serving
        logprobs = None
        if req.logprobs:
            entries = serving._entries(c.token_ids[start:], (c.logprobs or [])[start:],
                                       req.top_logprobs or 0)
            logprobs = serving._format(entries, chat=True)
        finish = c.finish_reason
        if self.mode == "none":
            body = ({"message": {"role": "assistant", "content": c.text}} if sent_chars is None
                    else {"delta": {"content": c.text[sent_chars:]}})
        elif sent_chars is None:
            msg, finish = tool_message(self.mode, c.text, finish, named=self.named)
            body = {"message": msg}
        else:
            stream = self.streams.setdefault(c.index, ToolStream(self.mode, self.named))
            delta, finish = stream.delta(c.text, finish)
            body = {"delta": delta}
        return {**body, "logprobs": logprobs, "finish_reason": finish,
                "stop_reason": c.stop_reason}
