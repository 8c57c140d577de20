"""/v1/completions and /v1/chat/completions: request → engine requests → JSON or SSE.

Both endpoints share one path: validate, tokenize once on the tokenizer thread
(tokenization.py; the engine gets token ids), submit one engine request per prompt, then
either collect the final outputs or stream deltas of the cumulative outputs as
`data: {...}` chunks followed by `data: [DONE]`. A request the engine fails, or one ended
by shutdown or by a backlog its client left unread, is an error response, or an error
event then `data: [DONE]` once streaming has begun.
Choice `index` is `prompt_index * n + output.index`, as in OpenAI's API. JSON never
carries NaN or infinities: a log-probability of -inf is sent as -9999.0, as vLLM does.
"""
from __future__ import annotations

import asyncio
import json
import math
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any

from fastapi import Request
from fastapi.responses import JSONResponse, StreamingResponse

from engine.entrypoints.errors import APIError, error_body
from engine.entrypoints.protocol import ChatCompletionRequest, CompletionRequest
from engine.entrypoints.request_group import RequestGroup

NEG_INF_LOGPROB = -9999.0


def _finite(value: float | None) -> float | None:
    if value is None or math.isfinite(value):
        return value
    return NEG_INF_LOGPROB  # -inf (a banned token); NaN cannot come from finite inputs


class Serving:
    def __init__(self, state: Any) -> None:
        self.state = state  # api_server.ServerState: engine, tokenizer, settings

    # --- shared ------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> str:
        self.state.require_async_engine()  # 503 while loading: nothing below exists yet
        name = self.state.model_name
        if model is not None and model != name:
            raise APIError(f"The model `{model}` does not exist; this server serves `{name}`.",
                           status=404, param="model", code="model_not_found")
        return name

    def _check_length(self, ids: list[int], max_tokens: int | None, param: str) -> None:
        limit = self.state.max_model_len
        if len(ids) >= limit:
            raise APIError(f"{param} has {len(ids)} tokens but max_model_len is {limit}; "
                           f"shorten the {param} or raise --max-model-len", param=param)
        if max_tokens is not None and len(ids) + max_tokens > limit:
            raise APIError(f"{param} ({len(ids)} tokens) plus max_tokens ({max_tokens}) "
                           f"exceeds max_model_len ({limit}); lower max_tokens",
                           param="max_tokens")

    async def _submit(self, raw: Request, req: Any, prompts: list[Any], prefix: str
                      ) -> tuple[str, RequestGroup, list[Any]]:
        params = [req.sampling_params() for _ in prompts]
        if req.stop_token_ids:
            self.state.tokenization.check_ids(req.stop_token_ids, "stop_token_ids")
        async_engine = self.state.require_async_engine()
        rid = f"{prefix}-{raw.state.request_id}"
        # The engine id gets a random tail: clients may reuse X-Request-Id values.
        group = await async_engine.submit(
            prompts, params, request_id=f"{rid}-{uuid.uuid4().hex[:8]}", priority=req.priority,
            cache_salt=req.cache_salt, arrival_time=raw.state.arrival_time)
        return rid, group, params

    async def _collect(self, raw: Request, group: RequestGroup) -> dict[int, Any]:
        """Final output per prompt; a client that disconnects meanwhile aborts the group."""
        async def consume() -> dict[int, Any]:
            last: dict[int, Any] = {}
            async for index, out in group:
                last[index] = out
            return last

        async def disconnected() -> None:
            while (await raw.receive())["type"] != "http.disconnect":
                pass

        work, watch = asyncio.ensure_future(consume()), asyncio.ensure_future(disconnected())
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if not work.done():
                raise APIError("client disconnected", status=499)
            return work.result()
        finally:
            for task in (work, watch):
                task.cancel()
            group.close()

    def _logprobs(self, c: Any, start: int, *, k: int, chat: bool, offset0: int = 0) -> Any:
        """OpenAI's logprobs object for c.token_ids[start:] with the top k alternatives per
        token (None when not requested)."""
        if c.logprobs is None:
            return None
        text = self.state.tokenization.token_text
        entries = []
        for token, top in zip(c.token_ids[start:], c.logprobs[start:]):
            ranked = sorted(top.items(), key=lambda kv: -kv[1])[:k]
            entries.append((text(token), _finite(top.get(token)),
                            [(text(t), _finite(lp)) for t, lp in ranked]))
        if chat:
            return {"content": [
                {"token": s, "logprob": lp, "bytes": list(s.encode()),
                 "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                                  for t, v in top]} for s, lp, top in entries]}
        offsets, pos = [], offset0
        for s, _, _ in entries:
            offsets.append(pos)
            pos += len(s)
        return {"tokens": [s for s, _, _ in entries], "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [dict(top) for _, _, top in entries], "text_offset": offsets}

    @staticmethod
    def _usage(finals: dict[int, Any]) -> dict[str, int]:
        prompt = sum(len(o.prompt_token_ids) for o in finals.values())
        completion = sum(len(c.token_ids) for o in finals.values() for c in o.outputs)
        return {"prompt_tokens": prompt, "completion_tokens": completion,
                "total_tokens": prompt + completion}

    # --- endpoints ---------------------------------------------------------------------

    async def completions(self, req: CompletionRequest, raw: Request) -> Any:
        model = self._check_model(req.model)
        prompts = req.prompts()
        req.sampling_params()  # a bad sampling field is a 400 before any tokenizing
        raw.state.prompt_log = prompts
        token_ids = await self.state.tokenization.encode(prompts, param="prompt")
        for ids in token_ids:
            self._check_length(ids, req.max_tokens, "prompt")
        rid, group, params = await self._submit(raw, req, token_ids, "cmpl")
        header = {"id": rid, "created": int(time.time()), "model": model}
        if req.stream:
            return _sse(self._stream(group, header, n=req.n, chat=False, k=req.logprobs or 0,
                                     usage=bool(req.stream_options and
                                                req.stream_options.include_usage)))
        finals = await self._collect(raw, group)
        choices = [{"index": i * req.n + c.index, "text": c.text,
                    "logprobs": self._logprobs(c, 0, k=req.logprobs or 0, chat=False),
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                   for i, out in sorted(finals.items()) for c in out.outputs]
        return JSONResponse({**header, "object": "text_completion", "choices": choices,
                             "usage": self._usage(finals)})

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Any:
        model = self._check_model(req.model)
        conversation = req.conversation()
        req.sampling_params()
        raw.state.prompt_log = conversation
        ids = await self.state.tokenization.render_chat(
            conversation, add_generation_prompt=req.add_generation_prompt)
        self._check_length(ids, req._max_new_tokens(), "messages")
        rid, group, params = await self._submit(raw, req, [ids], "chatcmpl")
        header = {"id": rid, "created": int(time.time()), "model": model}
        if req.stream:
            return _sse(self._stream(group, header, n=req.n, chat=True, k=req.top_logprobs or 0,
                                     usage=bool(req.stream_options and
                                                req.stream_options.include_usage)))
        finals = await self._collect(raw, group)
        choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                    "logprobs": self._logprobs(c, 0, k=req.top_logprobs or 0, chat=True),
                    "finish_reason": c.finish_reason, "stop_reason": c.stop_reason}
                   for c in finals[0].outputs]
        return JSONResponse({**header, "object": "chat.completion", "choices": choices,
                             "usage": self._usage(finals)})

    async def _stream(self, group: RequestGroup, header: dict[str, Any], *, n: int, chat: bool,
                      k: int, usage: bool) -> AsyncIterator[str]:
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(choices: list[dict[str, Any]], **extra: Any) -> str:
            body = {**header, 'object': obj, 'choices': choices, **extra}
            return f"data: {json.dumps(body, allow_nan=False)}\n\n"

        sent_chars: dict[int, int] = {}
        sent_tokens: dict[int, int] = {}
        finals: dict[int, Any] = {}
        try:
            if chat:  # the role comes first, once per choice
                yield chunk([{"index": i, "delta": {"role": "assistant", "content": ""},
                              "logprobs": None, "finish_reason": None} for i in range(n)])
            async for p_index, out in group:
                finals[p_index] = out
                choices = []
                for c in out.outputs:
                    index = p_index * n + c.index
                    if index in sent_tokens and sent_tokens[index] < 0:
                        continue  # this choice already sent its finish_reason
                    start, done = sent_tokens.get(index, 0), c.finish_reason is not None
                    if len(c.token_ids) == start and not done:
                        continue
                    text = c.text[sent_chars.get(index, 0):]
                    sent_chars[index] = len(c.text)
                    sent_tokens[index] = -1 if done else len(c.token_ids)
                    logprobs = self._logprobs(c, start, k=k, chat=chat,
                                              offset0=sent_chars[index] - len(text))
                    body = {"delta": {"content": text}} if chat else {"text": text}
                    choices.append({"index": index, **body, "logprobs": logprobs,
                                    "finish_reason": c.finish_reason,
                                    "stop_reason": c.stop_reason})
                if choices:
                    yield chunk(choices)
            if usage:
                yield chunk([], usage=self._usage(finals))
        except APIError as exc:  # engine fault, shutdown, backlog: tell the client, then end
            body = error_body(exc.message, status=exc.status, param=exc.param, code=exc.code)
            yield f"data: {json.dumps(body)}\n\n"
        finally:
            group.close()  # aborts whatever is unfinished (client gone, cancelled)
        yield "data: [DONE]\n\n"


def _sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
