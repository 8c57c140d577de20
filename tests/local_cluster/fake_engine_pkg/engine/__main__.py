"""`python -m engine serve MODEL --host H --port P [engine flags]`, faked for tuning tests.

Serves tests/loadtests/fake_openai_server.py's streaming OpenAI API (with /health, /livez
and vLLM's metrics) on the pod's address, with known goodput per setting, like
tests/tuner/fake_engine.py:
- --block-size 8 "runs out of memory" at start (exit 1 with CUDA's message): infeasible;
- the inter-token gap is FAKE_ENGINE_ITL[str(max_num_seqs)] (JSON; "*" for the rest), else
  0.002 s * max_num_seqs;
- FAKE_ENGINE_SLOW_HOSTS: comma-separated pod-name prefixes whose pods serve 50x slower
  (a regression that shows only on the live service, not on the trial services).
"""
import argparse
import json
import os
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[3] / "loadtests"))
from aiohttp import web  # noqa: E402
from fake_openai_server import FakeOpenAIServer  # noqa: E402


class PodServer(FakeOpenAIServer):
    """The fake server bound to the pod's address, with the engine's liveness path."""

    def __init__(self, *, host: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.host = host

    async def _start(self) -> str:
        app = web.Application()
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
args, _ = parser.parse_known_args()
if args.block_size == 8:
    print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
table = json.loads(os.environ.get("FAKE_ENGINE_ITL", "{}"))
itl = table.get(str(args.max_num_seqs), table.get("*", 0.002 * args.max_num_seqs))
slow = [p for p in os.environ.get("FAKE_ENGINE_SLOW_HOSTS", "").split(",") if p]
if any(os.environ.get("HOSTNAME", "").startswith(p) for p in slow):
    itl *= 50
with PodServer(host=args.host, port=args.port, ttft=0.01, itl=itl):
    print(f"fake engine ready on {args.host}:{args.port} (itl {itl:.4f} s)", flush=True)
    threading.Event().wait()
