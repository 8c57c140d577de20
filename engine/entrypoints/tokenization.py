"""Tokenizing off the event loop, with a size cap checked before any work is done.

Tokenizing a few megabytes of text takes seconds of CPU; on the event loop it would
stall every other request and the probes. All tokenizer work (encode, chat templates,
decode) runs on one worker thread that owns the server's copy of the tokenizer (fast
tokenizers are not safe to share between threads that encode at once), so the event loop
only awaits it. Text is measured in UTF-8 bytes first: past `max_prompt_bytes` the
request is a 413 naming the limit, before the tokenizer sees it.
"""
from __future__ import annotations

import asyncio
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any, TypeVar

from engine.entrypoints.errors import APIError

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

T = TypeVar("T")


class Tokenization:
    def __init__(self, tokenizer: "PreTrainedTokenizerBase", *, max_prompt_bytes: int,
                 vocab_size: int, chat_template: str | None = None) -> None:
        self.tokenizer = tokenizer
        self.chat_template = chat_template
        self.max_prompt_bytes = max_prompt_bytes
        self.vocab_size = vocab_size
        self._token_texts: dict[int, str] = {}
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tokenizer")

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)

    async def _run(self, fn: Callable[..., T], *args: Any) -> T:
        return await asyncio.get_running_loop().run_in_executor(self._executor, fn, *args)

    def check_size(self, texts: list[str], param: str) -> None:
        size = sum(len(t.encode("utf-8")) for t in texts)
        if size > self.max_prompt_bytes:
            raise APIError(f"{param} is {size} bytes of text; the limit is "
                           f"{self.max_prompt_bytes} bytes (--max-prompt-bytes); send less",
                           status=413, param=param, code="prompt_too_large")

    async def encode(self, prompts: list[str | list[int]], *, add_special_tokens: bool = True,
                     param: str = "prompt") -> list[list[int]]:
        """Token ids per prompt (token-id prompts pass through, checked against the vocab)."""
        self.check_size([p for p in prompts if isinstance(p, str)], param)
        for p in prompts:
            if not isinstance(p, str):
                self.check_ids(p, param)
        texts = [p for p in prompts if isinstance(p, str)]
        encoded = iter(await self._run(self._encode_all, texts, add_special_tokens)
                       if texts else [])
        return [next(encoded) if isinstance(p, str) else list(p) for p in prompts]

    def _encode_all(self, texts: list[str], add_special_tokens: bool) -> list[list[int]]:
        return [self.tokenizer.encode(t, add_special_tokens=add_special_tokens) for t in texts]

    async def render_chat(self, conversation: list[dict[str, Any]], *,
                          add_generation_prompt: bool, param: str = "messages",
                          tools: list[dict[str, Any]] | None = None) -> list[int]:
        self.check_size([m["content"] for m in conversation], param)
        if not conversation:
            raise APIError("messages must not be empty", param=param)
        try:
            ids = await self._run(self._render, conversation, add_generation_prompt, tools)
        except APIError:
            raise
        except Exception as exc:  # a template that rejects the conversation (roles, order)
            raise APIError(f"messages could not be rendered with the chat template: {exc}",
                           param=param) from None
        return ids

    def _render(self, conversation: list[dict[str, Any]], add_generation_prompt: bool,
                tools: list[dict[str, Any]] | None = None) -> list[int]:
        # --chat-template replaces the tokenizer's own (None: the tokenizer's)
        return list(self.tokenizer.apply_chat_template(
            conversation, add_generation_prompt=add_generation_prompt, tokenize=True,
            return_dict=False, tools=tools, chat_template=self.chat_template))

    def check_ids(self, ids: list[int], param: str) -> None:
        bad = next((t for t in ids if not 0 <= t < self.vocab_size), None)
        if bad is not None:
            raise APIError(f"token id {bad} in {param} is outside the vocabulary "
                           f"[0, {self.vocab_size})", param=param)

    async def decode(self, ids: list[int], param: str = "tokens") -> str:
        self.check_ids(ids, param)
        return await self._run(self.tokenizer.decode, ids)

    def token_text(self, token: int) -> str:
        """One token's text (logprobs), cached: streams ask for the same ids again and again.
        Decoding only reads the tokenizer, so this may run on the event loop."""
        text = self._token_texts.get(token)
        if text is None:
            if len(self._token_texts) >= 1 << 16:
                self._token_texts.clear()
            text = self._token_texts[token] = self.tokenizer.decode([token])
        return text
