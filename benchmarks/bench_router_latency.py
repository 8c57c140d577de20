#!/usr/bin/env python
"""The router's added latency on this machine, without an engine's noise.

    python benchmarks/bench_router_latency.py [--requests 400] [--rounds 3]

A zero-latency OpenAI-style server (tests/loadtests/fake_openai_server.py, aiohttp)
answers tiny completions; the same async client asks it directly and through a
`python -m paged_router` in front of it, interleaved request by request, so drifts in
machine load hit both alike. Prints per round the direct and routed p50 and their
difference, and the router's own time per request from its
`paged_router_added_latency_seconds` histogram; then the median over rounds.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests" / "loadtests"))
sys.path.insert(0, str(REPO / "benchmarks"))

import routing_phases  # noqa: E402
from fake_openai_server import FakeOpenAIServer  # noqa: E402


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--requests", type=int, default=400, help="per target per round")
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    added = []
    with FakeOpenAIServer(ttft=0.0, itl=0.0) as fake, tempfile.TemporaryDirectory() as logs:
        for r in range(args.rounds):  # a fresh router each round
            res = routing_phases.added_latency(fake.url, args.requests, Path(logs))
            added.append(res["added_p50_ms"])
            print(f"round {r + 1}: direct p50 {res['direct_p50_ms']:.2f} ms, via router "
                  f"{res['routed_p50_ms']:.2f} ms, added {res['added_p50_ms']:.2f} ms; "
                  f"router's own time {res['router_own_mean_ms']:.3f} ms a request", flush=True)
    print(f"added latency p50, median of {args.rounds} rounds: {statistics.median(added):.2f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
