#!/usr/bin/env python
"""Routing benchmark: precise vs prefix vs least-load vs round-robin over N engine replicas.

    python benchmarks/bench_routing.py [--replicas 4] [--tenants 16] [--requests 64] ...

Starts N engines (one CPU thread each, a small KV pool each via --num-gpu-blocks-override,
so that one replica holds only a fraction of all tenants' system prompts) on 127.0.0.2..,
plus one "large" reference replica whose pool is the N pools together. The workload: T
system prompts of about 1-2k tokens (one per tenant), a short unique question each, tenants
drawn from a Zipf distribution, C closed-loop users (or, with --rate R, Poisson arrivals at
R requests/s in the measured phase: an offered load above what a policy serves shows as
a queue, and TTFT, growing through the phase). Every policy runs the same workload
shape through its own `python -m engine router`; each phase gets its own fresh set of system
prompts (same lengths, same tenant sequence), so no phase profits from an earlier one's
cache, and each measures only after the same warm-up. The large replica gets the same
workload directly: its hit rate is the reference. Prefix hit rates come from the engines'
own `vllm:prefix_cache_hits/queries`; TTFT is client-side (first streamed token).
Every engine publishes KV events (--kv-events-config), whichever policy reads them, so
the phases differ only by the router; `precise` follows them (the engines' tokenizer from
the model directory), and each phase reports the event traffic the engines sent (events/s,
payload bytes/s, from their `paged:kv_events_*` counters).
Finally the router's added latency: tiny requests, direct vs through the router.
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import signal
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx

REPO = Path(__file__).resolve().parents[1]
WORDS = ("order refund shipping account invoice warranty return parcel courier payment card "
         "bank branch loan mortgage policy claim premium deductible patient clinic doctor "
         "appointment prescription lesson student teacher homework exam library ticket train "
         "platform delay hotel booking room breakfast checkout flight baggage gate").split()


# a policy name, or one of these variants of it (for an ablation in the same run)
VARIANTS = {"prefix-ring-only": ["--policy", "prefix", "--cache-balance", "off"],
            "prefix-one-bound": ["--policy", "prefix", "--hit-load-factor", "0.25"],
            "prefix-hit-2": ["--policy", "prefix", "--hit-load-factor", "2.0"],
            "precise-hit-2": ["--policy", "precise", "--hit-load-factor", "2.0"]}


class Proc:
    def __init__(self, args: list[str], pattern: str, log: Path) -> None:
        self.log = log.open("w")
        self.p = subprocess.Popen([sys.executable, "-m", "engine", *args], cwd=REPO,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.url, seen = "", threading.Event()

        def pump() -> None:
            for line in self.p.stdout:  # type: ignore[union-attr]
                self.log.write(line)
                m = re.search(pattern + r" (http://[0-9.]+:\d+)", line)
                if m and not seen.is_set():
                    self.url = m.group(1)
                    seen.set()
        threading.Thread(target=pump, daemon=True).start()
        if not seen.wait(180):
            raise SystemExit(f"{args[0]} did not start; see {log}")

    def wait_ready(self, timeout: float = 600) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise SystemExit(f"process exited; see {self.log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=5).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.5)
        raise SystemExit(f"not ready in time; see {self.log.name}")

    def stop(self) -> None:
        self.p.kill()
        self.p.wait()


def prefix_counters(urls: list[str]) -> tuple[float, float]:
    hits = queries = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("vllm:prefix_cache_hits_total"):
                hits += float(line.rsplit(" ", 1)[1])
            elif line.startswith("vllm:prefix_cache_queries_total"):
                queries += float(line.rsplit(" ", 1)[1])
    return hits, queries


def event_counters(urls: list[str]) -> tuple[float, float]:
    """(events, payload bytes) the engines have published so far."""
    events = size = 0.0
    for url in urls:
        for line in httpx.get(url + "/metrics", timeout=10).text.splitlines():
            if line.startswith("paged:kv_events_published_total"):
                events += float(line.rsplit(" ", 1)[1])
            elif line.startswith("paged:kv_events_bytes_published_total"):
                size += float(line.rsplit(" ", 1)[1])
    return events, size


def system_prompts(url: str, n: int, lo: int, hi: int, seed: int) -> list[str]:
    """n texts of lo..hi tokens (measured with the engine's /tokenize)."""
    rng, out = random.Random(seed), []
    for i in range(n):
        target = rng.randint(lo, hi)
        words = [f"Tenant {seed}-{i} support rules:"]
        while True:
            words += rng.choices(WORDS, k=16)
            text = " ".join(words)
            size = len(httpx.post(url + "/tokenize", json={"prompt": text}).json()["tokens"])
            if size >= target:
                out.append(text)
                break
    return out


async def run_load(url: str, prompts: list[str], tenants: list[int], users: int,
                   max_tokens: int, seed: int, rate: float | None = None) -> dict:
    # url: one target, or several separated by commas (router replicas: request i goes to
    # target i mod n)
    """Closed loop: `users` workers take the next (tenant, question) until none is left.
    Open loop (`rate`): request i is sent at its Poisson arrival time (`rate` requests/s,
    seeded), whatever the server's latency, as the issue's peers measure a rate."""
    queue = list(enumerate(tenants))
    ttfts: list[float] = []
    out_tokens = errors = 0

    async def send(client: httpx.AsyncClient, i: int, tenant: int) -> None:
        nonlocal out_tokens, errors
        body = {"prompt": f"{prompts[tenant]}\nUser {seed}-{i}: question {i}?\nAnswer:",
                "max_tokens": max_tokens, "ignore_eos": True, "stream": True,
                "temperature": 0}
        start, first = time.perf_counter(), None
        targets = url.split(",")
        try:
            async with client.stream("POST", targets[i % len(targets)] + "/v1/completions",
                                     json=body) as r:
                if r.status_code != 200:
                    errors += 1
                    return
                async for line in r.aiter_lines():
                    if line.startswith("data: {") and first is None:
                        first = time.perf_counter() - start
                    if line.startswith("data: {"):
                        out_tokens += 1
        except httpx.HTTPError:
            errors += 1
            return
        if first is not None:
            ttfts.append(first)

    async def worker(client: httpx.AsyncClient) -> None:
        while queue:
            await send(client, *queue.pop(0))

    async def arrivals(client: httpx.AsyncClient) -> None:
        rng, at, t0, tasks = random.Random(seed), 0.0, time.perf_counter(), []
        for i, tenant in queue:
            at += rng.expovariate(rate)
            await asyncio.sleep(max(0.0, t0 + at - time.perf_counter()))
            tasks.append(asyncio.create_task(send(client, i, tenant)))
        await asyncio.gather(*tasks)

    start = time.perf_counter()
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=600, limits=limits) as client:
        if rate:
            await arrivals(client)
        else:
            await asyncio.gather(*(worker(client) for _ in range(users)))
    wall = time.perf_counter() - start
    return {"ttfts": ttfts, "wall": wall, "out_tokens": out_tokens, "errors": errors}


def pct(values: list[float], q: float) -> float:
    return statistics.quantiles(values, n=100, method="inclusive")[q - 1] if len(values) > 1 \
        else (values[0] if values else float("nan"))


def phase(name: str, target: str, engine_urls: list[str], args, prompts: list[str],
          tenants_warm: list[int], tenants: list[int], seed: int) -> dict:
    asyncio.run(run_load(target, prompts, tenants_warm, args.users, args.max_tokens, seed))
    h0, q0 = prefix_counters(engine_urls)
    e0, b0 = event_counters(engine_urls)
    res = asyncio.run(run_load(target, prompts, tenants, args.users, args.max_tokens, seed + 1,
                               rate=args.rate))
    h1, q1 = prefix_counters(engine_urls)
    e1, b1 = event_counters(engine_urls)
    row = {"policy": name, "hit_rate": (h1 - h0) / max(q1 - q0, 1.0),
           "events_per_s": (e1 - e0) / res["wall"], "event_bytes_per_s": (b1 - b0) / res["wall"],
           "ttft_p50": pct(res["ttfts"], 50), "ttft_p90": pct(res["ttfts"], 90),
           "req_per_s": len(res["ttfts"]) / res["wall"], "errors": res["errors"],
           "tok_per_s": res["out_tokens"] / res["wall"]}
    print(f"  {name}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items()})}",
          flush=True)
    return row


def added_latency(engine_url: str, n: int, logs: Path) -> dict:
    router = Proc(["router", "--host", "127.0.0.1", "--port", "0", "--backends", engine_url],
                  "routing on", logs / "router-latency.log")
    router.wait_ready()
    direct, routed = [], []

    async def measure() -> str:  # the same async client both ways (as the router's own)
        async with httpx.AsyncClient(timeout=60) as client:
            body = {"prompt": "hi", "max_tokens": 1}
            for _ in range(5):  # connections and caches warm
                await client.post(engine_url + "/v1/completions", json=body)
                await client.post(router.url + "/v1/completions", json=body)
            for _ in range(n):  # interleaved, so drifts in machine load hit both alike
                for url, out in ((engine_url, direct), (router.url, routed)):
                    t = time.perf_counter()
                    (await client.post(url + "/v1/completions", json=body)).raise_for_status()
                    out.append(time.perf_counter() - t)
            return (await client.get(router.url + "/metrics")).text

    text = asyncio.run(measure())
    router.stop()
    m = re.search(r"paged_router_added_latency_seconds_sum (\S+)", text)
    c = re.search(r"paged_router_added_latency_seconds_count (\S+)", text)
    return {"direct_p50_ms": 1000 * statistics.median(direct),
            "routed_p50_ms": 1000 * statistics.median(routed),
            "added_p50_ms": 1000 * (statistics.median(routed) - statistics.median(direct)),
            "router_own_mean_ms": 1000 * float(m.group(1)) / float(c.group(1))}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="engine model (default: the tiny built-in)")
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--blocks", type=int, default=400,
                   help="KV blocks per replica (--num-gpu-blocks-override); the reference "
                        "replica gets replicas x this")
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--prompt-tokens", default="1000-1600", help="system prompt sizes, LO-HI")
    p.add_argument("--zipf", type=float, default=1.1, help="Zipf exponent of tenant choice")
    p.add_argument("--warmup", type=int, default=32, help="requests before measuring")
    p.add_argument("--requests", type=int, default=64, help="measured requests per phase")
    p.add_argument("--users", type=int, default=8, help="concurrent closed-loop clients")
    p.add_argument("--rate", type=float, default=None,
                   help="measure open loop instead: Poisson arrivals at this many requests/s "
                        "(the warm-up stays closed loop)")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--latency-requests", type=int, default=200)
    p.add_argument("--policies", default="precise,prefix,least-load,round-robin",
                   help="comma-separated: precise, prefix, least-load, round-robin, or the prefix "
                        f"variants {', '.join(VARIANTS)}")
    p.add_argument("--routers", type=int, default=1,
                   help="router replicas per policy, requests spread over them in turn (each "
                        "router sees only its share: the prefix policy's table is per router, "
                        "the engines' KV events are the same for all)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--logs", default="/tmp/bench_routing")
    p.add_argument("--out", default=None, help="write the results as JSON here")
    args = p.parse_args()
    # a SIGTERM still runs the `finally` below, which stops every engine this started
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    lo, hi = (int(x) for x in args.prompt_tokens.split("-"))
    logs = Path(args.logs)
    logs.mkdir(parents=True, exist_ok=True)
    common = ["serve", *([args.model] if args.model else []), "--port", "0",
              "--cpu-threads", "1", "--max-model-len", "2048", "--seed", "0"]

    def events(host: str) -> list[str]:
        return ["--kv-events-config", json.dumps({
            "enable_kv_cache_events": True, "endpoint": f"tcp://{host}:*",
            "replay_endpoint": f"tcp://{host}:*"})]

    from engine.model_loader import resolve_model_path  # the engines' tokenizer, for precise
    model_dir = str(resolve_model_path(args.model))
    t0 = time.perf_counter()
    engines = [Proc([*common, "--host", f"127.0.0.{i + 2}", "--num-gpu-blocks-override",
                     str(args.blocks), *events(f"127.0.0.{i + 2}")], "serving on",
                    logs / f"engine-{i}.log")
               for i in range(args.replicas)]
    large = Proc([*common, "--host", f"127.0.0.{args.replicas + 2}",
                  "--num-gpu-blocks-override", str(args.blocks * args.replicas),
                  *events(f"127.0.0.{args.replicas + 2}")],
                 "serving on", logs / "engine-large.log")
    procs = [*engines, large]
    try:
        for e in procs:
            e.wait_ready()
        print(f"{len(procs)} engines ready in {time.perf_counter() - t0:.0f}s", flush=True)
        urls = [e.url for e in engines]
        rng = random.Random(args.seed)
        weights = [1 / (k + 1) ** args.zipf for k in range(args.tenants)]
        tenants_warm = rng.choices(range(args.tenants), weights, k=args.warmup)
        tenants = rng.choices(range(args.tenants), weights, k=args.requests)
        rows = []
        policies = [x for x in args.policies.split(",") if x]
        for k, policy in enumerate(policies):
            prompts = system_prompts(urls[0], args.tenants, lo, hi, seed=100 + k)
            routers = [Proc(["router", "--host", "127.0.0.1", "--port", "0",
                             *VARIANTS.get(policy, ["--policy", policy]),
                             *(["--tokenizer", model_dir]
                               if "precise" in VARIANTS.get(policy, [policy]) else []),
                             "--backends", ",".join(urls)], "routing on",
                            logs / f"router-{policy}-{j}.log") for j in range(args.routers)]
            for router in routers:
                router.wait_ready()
            rows.append(phase(policy, ",".join(r.url for r in routers), urls, args, prompts,
                              tenants_warm, tenants, seed=10 * k))
            for router in routers:
                router.stop()
        prompts = system_prompts(urls[0], args.tenants, lo, hi, seed=99)
        rows.append(phase("single large replica (reference)", large.url, [large.url], args,
                          prompts, tenants_warm, tenants, seed=99))
        latency = added_latency(urls[0], args.latency_requests, logs)
    finally:
        for e in procs:
            e.stop()
    print(f"\n{args.replicas} replicas x {args.blocks} blocks, {args.routers} router(s), "
          f"{args.tenants} tenants "
          f"({lo}-{hi} token system prompts, Zipf {args.zipf}), "
          f"{f'open loop at {args.rate:g} req/s' if args.rate else f'{args.users} users'}, "
          f"{args.requests} measured requests after {args.warmup} warm-up, "
          f"max_tokens {args.max_tokens}; total {time.perf_counter() - t0:.0f}s\n")
    reference = rows[-1]
    print("| policy | prefix hit rate | vs large replica | TTFT p50 (s) | TTFT p90 (s) | "
          "req/s | tokens/s | KV events/s | event KiB/s | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['policy']} | {r['hit_rate']:.1%} | "
              f"{r['hit_rate'] / max(reference['hit_rate'], 1e-9):.1%} | {r['ttft_p50']:.2f} | "
              f"{r['ttft_p90']:.2f} | {r['req_per_s']:.2f} | {r['tok_per_s']:.1f} | "
              f"{r['events_per_s']:.0f} | {r['event_bytes_per_s'] / 1024:.1f} | "
              f"{r['errors']} |")
    print(f"\nrouter added latency (tiny requests, {args.latency_requests} each, interleaved): "
          f"direct p50 {latency['direct_p50_ms']:.2f} ms, via router p50 "
          f"{latency['routed_p50_ms']:.2f} ms, added {latency['added_p50_ms']:.2f} ms; "
          f"router's own time per request (mean) {latency['router_own_mean_ms']:.3f} ms")
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows,
                                              "added_latency": latency}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
