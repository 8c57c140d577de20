"""Small OpenAI-style backends on their own loopback addresses, for the router tests.

Each one answers `/v1/completions` and `/v1/chat/completions` (streamed or not) after a
set delay (a stream sends its headers first, then its first token `ttft` later), says who
it is in every reply, and counts what happened: requests, in-flight and the most in flight
at once, streams the client abandoned, the connections requests came on. `fail_next(n,
status)` makes the next n generation requests fail with that status before any byte is
sent (status 0: the connection is dropped without an answer); `health_status` is what
`/health` answers. `/metrics` shows vLLM's load gauges; `/kv_events` advertises a KV event
publisher's endpoints when given one (`kv_events_info`, answered after `kv_events_delay`).
"""
from __future__ import annotations

import asyncio
import json
import threading
from typing import Any

from aiohttp import web


class FakeBackend:
    def __init__(self, host: str = "127.0.0.1", *, delay: float = 0.0, itl: float = 0.005,
                 tokens: int = 4, port: int = 0) -> None:
        self.host, self.delay, self.itl, self.tokens = host, delay, itl, tokens
        self.ttft = 0.0
        self.connections: set[tuple[str, int]] = set()  # client address of each request
        self.port = port
        self.requests: list[dict[str, Any]] = []
        self.headers: list[dict[str, str]] = []
        self.in_flight = self.max_in_flight = self.abandoned = 0
        self.health_status = 200
        self.probes = 0  # /health requests seen
        self.kv_cache_usage = self.waiting = 0.0
        # GET /kv_events: what to advertise (a publisher's info()), after how long; 404 if None
        self.kv_events_info: dict[str, Any] | None = None
        self.kv_events_delay = 0.0
        self._fail: list[int] = []
        self._unhealthy_after_fail = False
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, daemon=True)
        self.url = ""

    def fail_next(self, n: int, status: int = 503, then_unhealthy: bool = False) -> None:
        self._fail.extend([status] * n)
        self._unhealthy_after_fail = then_unhealthy

    def __enter__(self) -> "FakeBackend":
        self._thread.start()
        self.url = asyncio.run_coroutine_threadsafe(self._start(), self._loop).result(10)
        return self

    def __exit__(self, *_: Any) -> None:
        self.close()

    def close(self) -> None:
        """Stops listening: new connections are refused from now on."""
        if self._thread.is_alive():
            asyncio.run_coroutine_threadsafe(self._runner.cleanup(), self._loop).result(10)
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(10)

    async def _start(self) -> str:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/kv_events", self._kv_events)
        app.router.add_post("/v1/completions", self._generate)
        app.router.add_post("/v1/chat/completions", self._generate)
        self._runner = web.AppRunner(app, shutdown_timeout=0.5, handler_cancellation=True)
        await self._runner.setup()
        site = web.TCPSite(self._runner, self.host, self.port)
        await site.start()
        return f"http://{self.host}:{site._server.sockets[0].getsockname()[1]}"

    async def _health(self, request: web.Request) -> web.Response:
        self.probes += 1
        return web.Response(status=self.health_status, text="")

    async def _metrics(self, request: web.Request) -> web.Response:
        return web.Response(text=(
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            f'vllm:kv_cache_usage_perc{{model_name="fake"}} {self.kv_cache_usage}\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            f'vllm:num_requests_waiting{{model_name="fake"}} {self.waiting}\n'))

    async def _kv_events(self, request: web.Request) -> web.Response:
        await asyncio.sleep(self.kv_events_delay)
        if self.kv_events_info is None:
            return web.json_response({"error": {"message": "KV events are off"}}, status=404)
        return web.json_response(self.kv_events_info)

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response({"object": "list", "data": [{"id": "fake", "owner": self.url}]})

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.requests.append(body)
        self.headers.append(dict(request.headers))
        self.connections.add(request.transport.get_extra_info("peername")[:2])
        if self._fail:
            status = self._fail.pop(0)
            if self._unhealthy_after_fail:
                self.health_status = 503
            if status == 0:
                request.transport.abort()  # reset, no answer
                raise web.HTTPInternalServerError()  # never reaches the router
            return web.json_response({"error": {"message": "injected"}}, status=status)
        self.in_flight += 1
        self.max_in_flight = max(self.max_in_flight, self.in_flight)
        try:
            await asyncio.sleep(self.delay)
            if not body.get("stream"):
                return web.json_response({"object": "text_completion", "served_by": self.url,
                                          "choices": [{"index": 0, "text": "ok"}]})
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            await asyncio.sleep(self.ttft)
            for i in range(self.tokens):
                chunk = {"served_by": self.url, "choices": [{"index": 0, "text": f"t{i} "}]}
                await response.write(b"data: " + json.dumps(chunk).encode() + b"\n\n")
                await asyncio.sleep(self.itl)
            await response.write(b"data: [DONE]\n\n")
            await response.write_eof()
            return response
        except (asyncio.CancelledError, ConnectionResetError):
            self.abandoned += 1
            raise
        finally:
            self.in_flight -= 1
