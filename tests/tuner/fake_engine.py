"""A stand-in engine command for fast sweep tests: `python fake_engine.py --port P ...`.

It takes the engine's flags (with the engine's defaults), serves the fake OpenAI server on
the port, and behaves like an engine whose settings matter: it "runs out of memory" at
start for --block-size 8, and its inter-token gap is

  FAKE_ENGINE_ITL[str(max_num_seqs)] (a JSON mapping; key "*" for the rest), or else
  0.002 s * max_num_seqs;

times a log-normal noise factor exp(N(0, FAKE_ENGINE_NOISE)) drawn once per process (a
fresh engine, a fresh draw), so its goodput per setting is known up to known noise.
FAKE_ENGINE_LUCKY=N makes --max-num-seqs N run 4x faster on its first start only (one
lucky measurement: better only by noise); FAKE_ENGINE_STATE names the folder where the
starts are counted.
FAKE_ENGINE_SLOTS=1 makes --max-num-seqs a cap on requests streaming at once (the rest
queue): a known capacity of max_num_seqs / (ttft + (n-1) itl) requests/s.
"""
import argparse
import json
import math
import os
import random
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtests"))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--max-num-seqs", type=int, default=256)
parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
parser.add_argument("--cpu-memory-gib", type=float)
parser.add_argument("--max-model-len", type=int)
parser.add_argument("--speculative-config")   # accepted; drafts change nothing here
parser.add_argument("--kv-offloading-size", type=float)  # accepted; no KV tier here
args = parser.parse_args()
if args.block_size == 8:
    print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)

table = json.loads(os.environ.get("FAKE_ENGINE_ITL", "{}"))
itl = table.get(str(args.max_num_seqs), table.get("*", 0.002 * args.max_num_seqs))
itl *= math.exp(random.gauss(0.0, float(os.environ.get("FAKE_ENGINE_NOISE", "0"))))
lucky = os.environ.get("FAKE_ENGINE_LUCKY")
if lucky is not None and int(lucky) == args.max_num_seqs:
    marker = Path(os.environ["FAKE_ENGINE_STATE"]) / f"started-{args.max_num_seqs}"
    if not marker.exists():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.write_text("1")
        itl /= 4
slots = args.max_num_seqs if os.environ.get("FAKE_ENGINE_SLOTS") == "1" else 0
with FakeOpenAIServer(port=args.port, ttft=0.01, itl=itl, max_running=slots):
    print(f"ready (itl {itl:.4f} s)", flush=True)
    threading.Event().wait()
