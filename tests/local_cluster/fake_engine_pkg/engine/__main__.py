"""`python -m engine serve MODEL --host H --port P [engine flags]`, faked for tuning tests.

Serves tests/loadtests/fake_openai_server.py's streaming OpenAI API (with /health, /livez
and vLLM's metrics) on the pod's address, with known goodput per setting, like
tests/tuner/fake_engine.py:
- --block-size 8 "runs out of memory" at start (exit 1 with CUDA's message): infeasible;
- the inter-token gap is FAKE_ENGINE_ITL[str(max_num_seqs)] (JSON; "*" for the rest), else
  0.002 s * max_num_seqs;
- FAKE_ENGINE_SLOW_HOSTS: comma-separated pod-name prefixes whose pods serve 50x slower
  (a regression that shows only on the live service, not on the trial services);
- FAKE_ENGINE_HOST_ITL: {"pod-name prefix": {max_num_seqs: gap, "*": gap}} (JSON): pods
  whose name starts with a prefix take their gap from its table instead (a setting that
  is better on the trial services and worse on the live one);
- --api-key-file (the operator's apiKeySecretRef mount): /v1/* answers 401 without
  `Authorization: Bearer KEY`, as the engine does;
- at most --max-num-seqs requests stream at once, the rest queue (FIFO) and show in
  vllm:num_requests_waiting (the fake server's gauge), as in the engine (the
  autoscaler's queueDepth metric);
- FAKE_ENGINE_REQUEST_LOG: a folder where every pod appends one JSON line per completion
  request it receives to <pod name>.jsonl: {"t": arrival (epoch s), "prompt": the prompt's
  first 8 token ids or its text, "prompt_len", "max_tokens"}; the tests compare it with
  the tuner's samples and with a replayed trace.
"""
import argparse
import json
import os
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "loadtests"))
from aiohttp import web  # noqa: E402
from fake_openai_server import FakeOpenAIServer  # noqa: E402


class PodServer(FakeOpenAIServer):
    """The fake server bound to the pod's address, with the engine's liveness path."""

    def __init__(self, *, host: str, api_key: str | None = None,
                 request_log: Path | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.host, self.api_key, self.request_log = host, api_key, request_log

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        if self.request_log is not None:
            body = await request.json()
            prompt = body.get("prompt", body.get("messages"))
            record = {"t": time.time(), "max_tokens": body.get("max_tokens"),
                      "prompt": prompt[:8] if isinstance(prompt, list) else prompt,
                      "prompt_len": len(prompt) if isinstance(prompt, list) else None}
            with open(self.request_log, "a") as log:
                log.write(json.dumps(record) + "\n")
        return await super()._complete(request)

    @web.middleware
    async def _auth(self, request: web.Request, handler):
        if self.api_key and request.path.startswith("/v1/") and \
                request.headers.get("Authorization") != f"Bearer {self.api_key}":
            return web.json_response({"error": {"code": "invalid_api_key"}}, status=401)
        return await handler(request)

    async def _start(self) -> str:
        app = web.Application(middlewares=[self._auth])
        app.router.add_get("/v1/models", self._models)
        for path in ("/health", "/ready", "/livez"):
            app.router.add_get(path, self._ok)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_post("/v1/completions", self._complete)
        app.router.add_post("/v1/chat/completions", self._complete)
        self._runner = web.AppRunner(app)
        await self._runner.setup()
        await web.TCPSite(self._runner, self.host, self.port).start()
        return f"http://{self.host}:{self.port}"


parser = argparse.ArgumentParser()
parser.add_argument("command", choices=["serve"])
parser.add_argument("model", nargs="?")
parser.add_argument("--host", default="127.0.0.1")
parser.add_argument("--port", type=int, default=8000)
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--max-num-seqs", type=int, default=256)
parser.add_argument("--api-key-file", default=None)
args, _ = parser.parse_known_args()
if args.block_size == 8:
    print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
table = json.loads(os.environ.get("FAKE_ENGINE_ITL", "{}"))
itl = table.get(str(args.max_num_seqs), table.get("*", 0.002 * args.max_num_seqs))
slow = [p for p in os.environ.get("FAKE_ENGINE_SLOW_HOSTS", "").split(",") if p]
if any(os.environ.get("HOSTNAME", "").startswith(p) for p in slow):
    itl *= 50
for prefix, gaps in json.loads(os.environ.get("FAKE_ENGINE_HOST_ITL", "{}")).items():
    if os.environ.get("HOSTNAME", "").startswith(prefix):
        itl = gaps.get(str(args.max_num_seqs), gaps.get("*", itl))
key = Path(args.api_key_file).read_text().strip() if args.api_key_file else None
log_dir = os.environ.get("FAKE_ENGINE_REQUEST_LOG")
request_log = Path(log_dir) / f"{os.environ.get('HOSTNAME', 'pod')}.jsonl" if log_dir else None
with PodServer(host=args.host, port=args.port, ttft=0.01, itl=itl, api_key=key,
               request_log=request_log, max_running=args.max_num_seqs):
    print(f"fake engine ready on {args.host}:{args.port} (itl {itl:.4f} s)", flush=True)
    threading.Event().wait()
