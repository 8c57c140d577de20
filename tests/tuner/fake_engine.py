"""A stand-in engine command for fast sweep tests: `python fake_engine.py --port P ...`.

It takes the engine's flags, serves the fake OpenAI server on the port, and behaves like
an engine whose settings matter: it "runs out of memory" at start for --block-size 8, and
its inter-token gap grows with --max-num-seqs (so settings rank differently).
"""
import argparse
import sys
import threading
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "loadtests"))
from fake_openai_server import FakeOpenAIServer  # noqa: E402

parser = argparse.ArgumentParser()
parser.add_argument("--host")
parser.add_argument("--port", type=int, required=True)
parser.add_argument("--block-size", type=int, default=16)
parser.add_argument("--max-num-seqs", type=int, default=8)
parser.add_argument("--gpu-memory-utilization", type=float, default=0.9)
parser.add_argument("--max-num-batched-tokens", type=int, default=2048)
parser.add_argument("--cpu-memory-gib", type=float)
parser.add_argument("--max-model-len", type=int)
args = parser.parse_args()
if args.block_size == 8:
    print("RuntimeError: CUDA out of memory. Tried to allocate 2.00 GiB", flush=True)
    sys.exit(1)
with FakeOpenAIServer(port=args.port, ttft=0.01, itl=0.002 * args.max_num_seqs):
    print("ready", flush=True)
    threading.Event().wait()
