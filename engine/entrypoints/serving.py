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
from engine.entrypoints.chat_protocol import ChatCompletionRequest
from engine.entrypoints.protocol import CompletionRequest
from engine.entrypoints.choices import ChatView, CompletionView
from engine.entrypoints.request_group import RequestGroup
from engine.entrypoints.tool_calls import check_tools

NEG_INF_LOGPROB = -9999.0


def _finite(value: float | None) -> float | None:
    if value is None or math.isfinite(value):
        return value
    return NEG_INF_LOGPROB  # -inf (a banned token); NaN cannot come from finite inputs


def length_refusal(prompt_tokens: int, max_tokens: int | None, limit: int,
                   param: str = "prompt") -> tuple[str, str] | None:
    """Why a request of this many prompt tokens and this max_tokens is refused (a 400:
    message, parameter) at max_model_len `limit`, or None. The simulator refuses by the
    same rule (tuner/sim/stream.py)."""
    if prompt_tokens >= limit:
        return (f"{param} has {prompt_tokens} tokens but max_model_len is {limit}; "
                f"shorten the {param} or raise --max-model-len", param)
    if max_tokens is not None and prompt_tokens + max_tokens > limit:
        return (f"{param} ({prompt_tokens} tokens) plus max_tokens ({max_tokens}) "
                f"exceeds max_model_len ({limit}); lower max_tokens", "max_tokens")
    return None


class Serving:
    def __init__(self, state: Any) -> None:
        self.state = state  # server_state.ServerState: engine, tokenizer, settings

    # --- shared ------------------------------------------------------------------------

    def _check_model(self, model: str | None) -> str:
        self.state.require_async_engine()  # 503 while loading: nothing below exists yet
        name = self.state.model_name
        if model is not None and model != name:
            raise APIError(f"The model `{model}` does not exist; this server serves `{name}`.",
                           status=404, param="model", code="model_not_found")
        return name

    def _check_length(self, ids: list[int], max_tokens: int | None, param: str) -> None:
        refused = length_refusal(len(ids), max_tokens, self.state.max_model_len, param)
        if refused:
            raise APIError(refused[0], param=refused[1])

    async def _compile(self, req: Any) -> None:
        """Compile the request's grammar on a worker thread (not the event loop); an invalid
        schema, regex or grammar is a 400 naming the field. The engine finds it cached."""
        constraint = req.constraint()
        if constraint is None:
            return
        so, field = constraint
        manager = self.state.engine.output.structured
        try:
            await asyncio.to_thread(manager.compile, so)
        except ValueError as exc:
            raise APIError(str(exc), param=field) from None

    async def _submit(self, raw: Request, req: Any, prompts: list[Any], prefix: str
                      ) -> tuple[str, RequestGroup, list[Any]]:
        await self._compile(req)
        params = [req.sampling_params() for _ in prompts]
        if req.stop_token_ids:
            self.state.tokenization.check_ids(req.stop_token_ids, "stop_token_ids")
        if req.logit_bias:
            self.state.tokenization.check_ids(list(params[0].logit_bias or {}), "logit_bias")
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

    def _entries(self, token_ids: list[int], lp_dicts: list[dict[int, float] | None], k: int
                 ) -> list[tuple[str, float | None, list[tuple[str, float]] | None]]:
        """(token text, its logprob, the top k (text, logprob)) per token; a None dict (the
        prompt's first token, which has no context) gives (text, None, None)."""
        text = self.state.tokenization.token_text
        out = []
        for token, top in zip(token_ids, lp_dicts):
            if top is None:
                out.append((text(token), None, None))
                continue
            ranked = sorted(top.items(), key=lambda kv: -kv[1])[:k]
            out.append((text(token), _finite(top.get(token)),
                        [(text(t), _finite(lp)) for t, lp in ranked]))
        return out

    @staticmethod
    def _format(entries: list, *, chat: bool, offset0: int = 0) -> dict[str, Any]:
        """OpenAI's logprobs object: chat's `content` list, or the completions' columns."""
        if chat:
            return {"content": [
                {"token": s, "logprob": lp, "bytes": list(s.encode()),
                 "top_logprobs": [{"token": t, "logprob": v, "bytes": list(t.encode())}
                                  for t, v in top]} for s, lp, top in entries]}
        offsets, pos = [], offset0
        for s, _, _ in entries:
            offsets.append(pos)
            pos += len(s)
        return {"tokens": [s for s, _, _ in entries],
                "token_logprobs": [lp for _, lp, _ in entries],
                "top_logprobs": [None if top is None else dict(top) for _, _, top in entries],
                "text_offset": offsets}

    def _vllm_prompt_logprobs(self, out: Any, k: int) -> list[dict[str, Any] | None] | None:
        """vLLM's `prompt_logprobs`: per prompt token {token id: {logprob, decoded_token}}
        for the token itself and the top k."""
        if out.prompt_logprobs is None:
            return None
        text = self.state.tokenization.token_text
        result: list[dict[str, Any] | None] = []
        for token, entry in zip(out.prompt_token_ids, out.prompt_logprobs):
            if entry is None:
                result.append(None)
                continue
            keep = dict(sorted(entry.items(), key=lambda kv: -kv[1])[:k])
            keep[token] = entry[token]
            result.append({str(t): {"logprob": _finite(lp), "decoded_token": text(t)}
                           for t, lp in keep.items()})
        return result

    @staticmethod
    def _usage(finals: dict[int, Any], prompt_only: bool = False) -> dict[str, int]:
        prompt = sum(len(o.prompt_token_ids) for o in finals.values())
        completion = 0 if prompt_only else sum(
            len(c.token_ids) for o in finals.values() for c in o.outputs)
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
            self._check_length(ids, req._max_new_tokens(), "prompt")
        echo_texts = ([p if isinstance(p, str) else await self.state.tokenization.decode(ids)
                       for p, ids in zip(prompts, token_ids)] if req.echo else None)
        rid, group, params = await self._submit(raw, req, token_ids, "cmpl")
        header = {"id": rid, "created": int(time.time()), "model": model}
        view = CompletionView(self, req, echo_texts)
        if req.stream:
            return _sse(self._stream(group, header, n=req.n, view=view, usage=bool(
                req.stream_options and req.stream_options.include_usage)))
        finals = await self._collect(raw, group)
        choices = []
        for i, out in sorted(finals.items()):
            for c in out.outputs:
                choice = view.choice(i, out, c, start=0, first=True)
                choice["index"] = i * req.n + c.index
                choices.append(choice)
        return JSONResponse({**header, "object": "text_completion", "choices": choices,
                             "usage": self._usage(finals, req.prompt_only)})

    async def chat(self, req: ChatCompletionRequest, raw: Request) -> Any:
        model = self._check_model(req.model)
        conversation = req.conversation()
        settings = self.state.settings
        mode = check_tools(req, auto_parser=settings.tool_call_parser
                           if settings.enable_auto_tool_choice else None)
        req.sampling_params()
        raw.state.prompt_log = conversation
        tools = ([t.model_dump(exclude_none=True) for t in req.tools]
                 if req.tools and mode != "none" else None)
        ids = await self.state.tokenization.render_chat(
            conversation, add_generation_prompt=req.add_generation_prompt, tools=tools)
        self._check_length(ids, req._max_new_tokens(), "messages")
        rid, group, params = await self._submit(raw, req, [ids], "chatcmpl")
        header = {"id": rid, "created": int(time.time()), "model": model}
        view = ChatView(self, req, mode)
        if req.stream:
            return _sse(self._stream(group, header, n=req.n, view=view, usage=bool(
                req.stream_options and req.stream_options.include_usage)))
        finals = await self._collect(raw, group)
        choices = [{"index": c.index, **view.choice(0, finals[0], c, start=0, first=True)}
                   for c in finals[0].outputs]
        body = {**header, "object": "chat.completion", "choices": choices,
                "usage": self._usage(finals)}
        if req.prompt_logprobs is not None:
            body["prompt_logprobs"] = self._vllm_prompt_logprobs(finals[0], req.prompt_logprobs)
        return JSONResponse(body)

    async def _stream(self, group: RequestGroup, header: dict[str, Any], *, n: int, view: Any,
                      usage: bool) -> AsyncIterator[str]:
        chat = isinstance(view, ChatView)
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
                    first = index not in sent_tokens
                    start, done = sent_tokens.get(index, 0), c.finish_reason is not None
                    num_tokens = view.num_tokens(c)
                    if num_tokens == start and not done and not (first and view.has_prefix):
                        continue
                    choice = view.choice(p_index, out, c, start=start, first=first,
                                         sent_chars=sent_chars.get(index, 0))
                    sent_chars[index] = view.num_chars(c)
                    sent_tokens[index] = -1 if done else num_tokens
                    choice["index"] = index
                    choices.append(choice)
                if choices:
                    yield chunk(choices)
            if usage:
                yield chunk([], usage=self._usage(finals, getattr(view, "prompt_only", False)))
        except APIError as exc:  # engine fault, shutdown, backlog: tell the client, then end
            body = error_body(exc.message, status=exc.status, param=exc.param, code=exc.code)
            yield f"data: {json.dumps(body)}\n\n"
        finally:
            group.close()  # aborts whatever is unfinished (client gone, cancelled)
        yield "data: [DONE]\n\n"


def _sse(body: AsyncIterator[str]) -> StreamingResponse:
    return StreamingResponse(body, media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache"})
