"""A small real HTTP server that streams OpenAI-style SSE with known timing.

Used by the load-test and tuner tests that check client-side timing (TTFT, inter-token
gaps) against ground truth and run Locust end to end without the engine. The first
token comes `ttft` seconds after the request, then one token every `itl` seconds; each
request's reply has exactly `max_tokens` tokens. /metrics exposes, under vLLM's names
and buckets, a request counter, the TTFT / inter-token / end-to-end latency histograms
(observed from the server's own timing) and the running- and waiting-requests gauges.
With `max_running` > 0 at most that many requests stream at once and the rest queue
(FIFO), like an engine's max_num_seqs: its capacity is max_running / (ttft + (n-1) itl)
requests/s for n-token replies, a known knee for the capacity search.
With `eos_after` > 0 the fake "model" says EOS after that many tokens: a request without
`ignore_eos: true` gets min(max_tokens, eos_after) tokens, like a real model's short reply.
With `max_model_len` > 0 a prompt counts one token per word (a chat request: its messages'
contents), a request whose prompt and max_tokens pass max_model_len is refused with HTTP
400 as the engine refuses it, and /v1/models reports max_model_len unless
`report_max_model_len` is False.
"""
from __future__ import annotations

import asyncio
import json
import threading

import time

from aiohttp import web
from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

# vLLM's bucket edges (engine/entrypoints/metrics.py), repeated so the fake imports no engine
TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5,
                5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0)
ITL_BUCKETS = (0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0,
               7.5, 10.0, 20.0, 40.0, 80.0)
E2E_BUCKETS = (0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0,
               60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0)
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
PROMPT_TOKENS = 5


class FakeOpenAIServer:
    def __init__(self, *, ttft: float = 0.05, itl: float = 0.01, fail_every: int = 0,
                 port: int = 0, max_running: int = 0, eos_after: int = 0,
                 max_model_len: int = 0, report_max_model_len: bool = True) -> None:
        self.ttft, self.itl, self.fail_every, self.port = ttft, itl, fail_every, port
        self.eos_after = eos_after
        self.max_model_len, self.report_max_model_len = max_model_len, report_max_model_len
        self.refused = 0
        self.max_running = max_running
        # made here, not in _start, so that servers with their own _start queue too
        # (asyncio's semaphore binds to the loop that first waits on it)
        self._slots = asyncio.Semaphore(max_running) if max_running > 0 else None
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""
        self.registry = reg = CollectorRegistry()
        lbl = ["model_name"]
        self._success = Counter("vllm:request_success", "Finished requests.", lbl,
                                registry=reg).labels("fake")
        self._running = Gauge("vllm:num_requests_running", "Running requests.", lbl,
                              registry=reg).labels("fake")
        self._waiting = Gauge("vllm:num_requests_waiting", "Queued requests (max_running).",
                              lbl, registry=reg).labels("fake")
        self._ttft = Histogram("vllm:time_to_first_token_seconds", "TTFT.", lbl,
                               buckets=TTFT_BUCKETS, registry=reg).labels("fake")
        self._itl = Histogram("vllm:inter_token_latency_seconds", "ITL.", lbl,
                              buckets=ITL_BUCKETS, registry=reg).labels("fake")
        self._e2e = Histogram("vllm:e2e_request_latency_seconds", "E2E.", lbl,
                              buckets=E2E_BUCKETS, registry=reg).labels("fake")
        # lengths as the engine counts them (the fake's prompts count PROMPT_TOKENS)
        self._prompt = Counter("vllm:prompt_tokens", "Prompt tokens.", lbl,
                               registry=reg).labels("fake")
        self._generated = Counter("vllm:generation_tokens", "Generated tokens.", lbl,
                                  registry=reg).labels("fake")
        self._prompt_len = Histogram("vllm:request_prompt_tokens", "Prompt lengths.", lbl,
                                     buckets=TOKEN_BUCKETS, registry=reg).labels("fake")
        self._output_len = Histogram("vllm:request_generation_tokens", "Output lengths.", lbl,
                                     buckets=TOKEN_BUCKETS, registry=reg).labels("fake")

    def __enter__(self) -> "FakeOpenAIServer":
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_) -> None:
        asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/health", self._ok)
        app.router.add_get("/ready", self._ok)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        site = web.TCPSite(self._runner, "127.0.0.1", self.port)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}"

    async def _ok(self, request: web.Request) -> web.Response:
        return web.Response(text="ok")

    async def _models(self, request: web.Request) -> web.Response:
        model = {"id": "fake-model"}
        if self.max_model_len and self.report_max_model_len:
            model["max_model_len"] = self.max_model_len
        return web.json_response({"object": "list", "data": [model]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(body=generate_latest(self.registry),
                            content_type="text/plain", charset="utf-8")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self._success.inc()
        if self.fail_every and len(self.requests) % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        chat = request.path.endswith("chat/completions")
        n = int(body.get("max_tokens", 16))
        prompt = PROMPT_TOKENS
        if self.max_model_len:
            text = " ".join(m["content"] for m in body["messages"]) if chat else body["prompt"]
            prompt = len(text.split())
            if prompt + n > self.max_model_len:
                self.refused += 1
                return web.json_response({"error": {"message": (
                    f"prompt ({prompt}) + max_tokens ({n}) exceeds max_model_len "
                    f"({self.max_model_len})")}}, status=400)
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        if self.eos_after and not body.get("ignore_eos"):
            n = min(n, self.eos_after)
        try:
            if self._slots is not None:
                self._waiting.inc()
                try:
                    await self._slots.acquire()
                finally:
                    self._waiting.dec()
            self._running.inc()
            try:
                await self._stream(response, n, chat, prompt)
            finally:
                self._running.dec()
                if self._slots is not None:
                    self._slots.release()
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away (Locust stopping mid-request)
        return response

    async def _stream(self, response: web.StreamResponse, n: int, chat: bool,
                      prompt: int = PROMPT_TOKENS) -> None:
        if chat:  # like vLLM: a role-only opening chunk, which is not a token
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            await response.write(b"data: " + json.dumps({"choices": [role]}).encode() + b"\n\n")
        start = time.monotonic()
        await asyncio.sleep(self.ttft)
        last = time.monotonic()
        self._ttft.observe(last - start)
        for i in range(n):
            if i:
                await asyncio.sleep(self.itl)
                now = time.monotonic()
                self._itl.observe(now - last)
                last = now
            choice = {"index": 0, "delta": {"content": f"t{i} "}} if chat else \
                {"index": 0, "text": f"t{i} "}
            await response.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": prompt, "completion_tokens": n,
                 "total_tokens": n + prompt}
        self._prompt.inc(prompt)
        self._generated.inc(n)
        self._prompt_len.observe(prompt)
        self._output_len.observe(n)
        await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        self._e2e.observe(time.monotonic() - start)
