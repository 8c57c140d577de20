"""The routing benchmark's phases (benchmarks/bench_routing.py runs them), each through a
policy's own router: the measured phase (closed or open loop), a router restart, bursts
released at once, and the router's added latency."""
from __future__ import annotations

import asyncio
import json
import statistics
import time
from pathlib import Path

import httpx
from routing_load import Proc, event_counters, pct, prefix_counters, run_load, samples

def router_counters(router_urls: list[str]) -> dict[str, float]:
    """Summed over the routers: decisions (`decision:<label>`), the router's own time
    (`own_s`, `own_n`: parsing, hashing, routing, connecting) and in-flight per backend
    (`in_flight:<url>`)."""
    out: dict[str, float] = {}
    keys = {"paged_router_added_latency_seconds_sum": "own_s",
            "paged_router_added_latency_seconds_count": "own_n"}
    for url in router_urls:
        for sample in samples(httpx.get(url + "/metrics", timeout=10).text):
            if sample.name == "paged_router_requests_total":
                key = f"decision:{sample.labels.get('decision')}"
            elif sample.name == "paged_router_in_flight_requests":
                key = f"in_flight:{sample.labels['backend']}"
            elif sample.name in keys:
                key = keys[sample.name]
            else:
                continue
            out[key] = out.get(key, 0.0) + sample.value
    return out


def phase(name: str, target: str, routers: list[str], engine_urls: list[str], args,
          prompts: list[str], tenants_warm: list[int], tenants: list[int], seed: int) -> dict:
    """Warm-up (closed loop), then the measured requests; hit rate from the engines'
    counters, event traffic per engine, the router's decisions and its own time."""
    asyncio.run(run_load(target, prompts, tenants_warm, args.users, args.max_tokens, seed))
    h0, q0 = prefix_counters(engine_urls)
    e0, b0 = event_counters(engine_urls)
    r0 = router_counters(routers)
    res = asyncio.run(run_load(target, prompts, tenants, args.users, args.max_tokens, seed + 1,
                               rate=args.rate))
    h1, q1 = prefix_counters(engine_urls)
    e1, b1 = event_counters(engine_urls)
    r1 = router_counters(routers)
    n, wall = len(engine_urls), res["wall"]
    row = {"policy": name, "hit_rate": (h1 - h0) / max(q1 - q0, 1.0),
           "events_per_s_engine": (e1 - e0) / wall / n,
           "event_bytes_per_s_engine": (b1 - b0) / wall / n,
           "ttft_p50": pct(res["ttfts"], 50), "ttft_p90": pct(res["ttfts"], 90),
           "req_per_s": len(res["ttfts"]) / wall, "errors": res["errors"],
           "tok_per_s": res["out_tokens"] / wall,
           "router_own_ms": 1000 * (r1.get("own_s", 0) - r0.get("own_s", 0))
           / max(r1.get("own_n", 0) - r0.get("own_n", 0), 1) if routers else float("nan"),
           "decisions": {k[9:]: r1[k] - r0.get(k, 0) for k in r1
                         if k.startswith("decision:") and r1[k] > r0.get(k, 0)}}
    show(name, row)
    return row


def show(name: str, row: dict) -> None:
    print(f"  {name}: {json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in row.items() if k != 'policy'})}",
          flush=True)


def index_synced(router_url: str, want: dict[str, int]) -> bool:
    """The router answers /health and (precise) has applied every engine's batches up to
    `want` (engine URL -> its last published seq)."""
    try:
        r = httpx.get(router_url + "/health", timeout=5)
    except httpx.HTTPError:
        return False
    have = r.json().get("kv_events") if r.status_code == 200 else {}
    return r.status_code == 200 and (have is None or all(
        have.get(u, {}).get("last_seq", -1) >= s for u, s in want.items()))


def published(engine_urls: list[str]) -> dict[str, int]:
    return {u: httpx.get(u + "/kv_events", timeout=10).json()["last_seq"] for u in engine_urls}


def burst(name: str, target: str, routers: list[str], engine_urls: list[str], args,
          prompt: str, seed: int) -> dict:
    """Two bursts of `args.burst` requests released at once: one sharing `prompt`, which
    every replica caches first (equal scores: llm-d-router PR 2515's case), one of as many
    new prefixes (`prompt` behind a distinct first line each). The routers' in-flight
    gauges are sampled throughout; at the sample with the most requests in flight:
    max/mean over the replicas."""
    def warm_everywhere() -> None:
        body = {"prompt": prompt + "\nWarm-up:", "max_tokens": 1}
        for url in engine_urls:
            httpx.post(url + "/v1/completions", json=body, timeout=600).raise_for_status()
        want = published(engine_urls)
        deadline = time.monotonic() + 30
        while not all(index_synced(r, want) for r in routers):
            if time.monotonic() > deadline:
                raise SystemExit(f"the {name} router's index never caught up")
            time.sleep(0.01)

    async def run(prompts: list[str]) -> tuple[dict, list[list[float]]]:
        samples: list[list[float]] = []
        done = asyncio.Event()

        async def poll() -> None:
            async with httpx.AsyncClient(timeout=10) as client:
                while not done.is_set():
                    counts = dict.fromkeys(engine_urls, 0.0)
                    for url in routers:
                        text = (await client.get(url + "/metrics")).text
                        for sample in samples(text):
                            if sample.name == "paged_router_in_flight_requests":
                                backend = sample.labels["backend"]
                                counts[backend] = counts.get(backend, 0.0) + sample.value
                    samples.append([counts[u] for u in engine_urls])
                    await asyncio.sleep(0.005)

        poller = asyncio.create_task(poll())
        try:
            res = await run_load(target, prompts, list(range(len(prompts))), len(prompts),
                                 args.max_tokens, seed)
        finally:
            done.set()
            await poller
        return res, samples

    row: dict = {}
    warm_everywhere()
    for label, prompts in (("shared", [prompt] * args.burst),
                           ("new", [f"Burst {seed}-{i}.\n{prompt}" for i in range(args.burst)])):
        res, samples = asyncio.run(run(prompts))
        peak = max(samples, key=sum)
        mean = sum(peak) / len(peak)
        row[f"burst_{label}"] = {"peak": peak, "max_over_mean": max(peak) / mean if mean
                                 else float("nan"), "ttft_p90": pct(res["ttfts"], 90),
                                 "errors": res["errors"]}
    show(f"{name} burst", row)
    return row


def restart(name: str, start_router, old: "Proc", engine_urls: list[str], args,
            prompts: list[str], tenants: list[int], seed: int) -> tuple[dict, "Proc"]:
    """Stops the router and starts a fresh one; from the moment it listens: the time until
    its /health answers 200 (ready) and until its KV index has applied every batch the
    engines had published (precise); then one request per tenant of the measured phase,
    sent one after another as soon as it is ready: their prefix hit rate against the
    steady phase's, and how many the router placed as prefix hits."""
    want = published(engine_urls)
    old.stop()
    spawned = time.perf_counter()
    new = start_router()  # returns once it listens
    t0 = time.perf_counter()
    ready = synced = None
    while synced is None:
        try:
            r = httpx.get(new.url + "/health", timeout=5)
        except httpx.HTTPError:
            r = None
        now = time.perf_counter() - t0
        if r is not None and r.status_code == 200:
            ready = now if ready is None else ready
            synced = now if index_synced(new.url, want) else None
        if now > 60:
            raise SystemExit(f"the restarted {name} router never became ready")
        time.sleep(0.005)
    order = sorted(set(tenants), key=tenants.index)  # each tenant of the phase, first seen first
    h0, q0 = prefix_counters(engine_urls)
    res = asyncio.run(run_load(new.url, prompts, order, 1, args.max_tokens, seed))
    h1, q1 = prefix_counters(engine_urls)
    decisions = router_counters([new.url])
    row = {"restart_listen_s": t0 - spawned, "restart_ready_s": ready, "restart_synced_s": synced,
           "restart_requests": len(order), "restart_wall_s": res["wall"],
           "restart_hit_rate": (h1 - h0) / max(q1 - q0, 1.0),
           "restart_prefix_hits": decisions.get("decision:prefix_hit", 0.0)}
    show(f"{name} restart", row)
    return row, new


def added_latency(engine_url: str, n: int, logs: Path) -> dict:
    router = Proc(["paged_router", "--host", "127.0.0.1", "--port", "0", "--backends", engine_url],
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
    own = {s.name: s.value for s in samples(text)}
    own_s, own_n = (own["paged_router_added_latency_seconds_" + k] for k in ("sum", "count"))
    return {"direct_p50_ms": 1000 * statistics.median(direct),
            "routed_p50_ms": 1000 * statistics.median(routed),
            "added_p50_ms": 1000 * (statistics.median(routed) - statistics.median(direct)),
            "router_own_mean_ms": 1000 * own_s / own_n}
