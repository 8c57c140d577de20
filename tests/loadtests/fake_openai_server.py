"""A small real HTTP server that streams OpenAI-style SSE with known timing.

Used by the load-test and tuner tests that check client-side timing (TTFT, inter-token
gaps) against ground truth and run Locust end to end without the engine. The first
token comes `ttft` seconds after the request, then one token every `itl` seconds; each
request's reply has exactly `max_tokens` tokens. /metrics exposes a request counter.
"""
from __future__ import annotations

import asyncio
import json
import threading

from aiohttp import web


class FakeOpenAIServer:
    def __init__(self, *, ttft: float = 0.05, itl: float = 0.01, fail_every: int = 0,
                 port: int = 0) -> None:
        self.ttft, self.itl, self.fail_every, self.port = ttft, itl, fail_every, port
        self.requests: list[dict] = []
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

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
        return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=f"# TYPE vllm:request_success counter\n"
                                 f"vllm:request_success_total{{model_name=\"fake\"}} "
                                 f"{len(self.requests)}\n")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        if self.fail_every and len(self.requests) % self.fail_every == 0:
            return web.json_response({"error": {"message": "injected failure"}}, status=500)
        chat = request.path.endswith("chat/completions")
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        n = int(body.get("max_tokens", 16))
        try:
            await self._stream(response, n, chat)
        except (ConnectionResetError, asyncio.CancelledError):
            pass  # the client went away (Locust stopping mid-request)
        return response

    async def _stream(self, response: web.StreamResponse, n: int, chat: bool) -> None:
        if chat:  # like vLLM: a role-only opening chunk, which is not a token
            role = {"index": 0, "delta": {"role": "assistant", "content": ""}}
            await response.write(b"data: " + json.dumps({"choices": [role]}).encode() + b"\n\n")
        await asyncio.sleep(self.ttft)
        for i in range(n):
            if i:
                await asyncio.sleep(self.itl)
            choice = {"index": 0, "delta": {"content": f"t{i} "}} if chat else \
                {"index": 0, "text": f"t{i} "}
            await response.write(b"data: " + json.dumps({"choices": [choice]}).encode() + b"\n\n")
        usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
        await response.write(b"data: " + json.dumps({"choices": [], "usage": usage}).encode()
                             + b"\n\n")
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
