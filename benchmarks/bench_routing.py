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
shape through its own `python -m paged_router`; each phase gets its own fresh set of system
prompts (same lengths, same tenant sequence), so no phase profits from an earlier one's
cache, and each measures only after the same warm-up. The large replica gets the same
workload directly: its hit rate is the reference. Prefix hit rates come from the engines'
own `vllm:prefix_cache_hits/queries`; TTFT is client-side (first streamed token).
Every engine publishes KV events (--kv-events-config), whichever policy reads them, so
the phases differ only by the router; `precise` follows them (the engines' tokenizer from
the model directory), and each phase reports the event traffic the engines sent (events/s,
payload bytes/s, from their `paged:kv_events_*` counters).
After its measured phase each policy's router is restarted (the time until it is ready
and its index synced, then one request per tenant: their hit rate), and gets a burst:
--burst requests sharing one fresh prefix, released at once (max/mean in-flight over the
replicas at the burst's peak, from the routers' own gauges). Finally the router's added
latency: tiny requests, direct vs through the router. The router's own time per request
with the real prompts (hashing included) is in each phase's row. The phases themselves
are in benchmarks/routing_phases.py; routers log every decision (--log-decisions) under
--logs.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import time
from pathlib import Path

from routing_load import Proc, system_prompts
from routing_phases import added_latency, burst, phase, restart

# a policy name, or one of these variants of it (for an ablation in the same run)
VARIANTS = {"prefix-ring-only": ["--policy", "prefix", "--cache-balance", "off"],
            "prefix-one-bound": ["--policy", "prefix", "--hit-load-factor", "0.25"],
            "prefix-hit-2": ["--policy", "prefix", "--hit-load-factor", "2.0"],
            "precise-hit-2": ["--policy", "precise", "--hit-load-factor", "2.0"],
            # precise's footprint bound before run 17 (its default is now the mean)
            "precise-balance-0.25": ["--policy", "precise", "--cache-balance", "0.25"]}


def print_tables(rows: list[dict], latency: dict, args) -> None:
    reference, rr = rows[-1], next((r for r in rows if r["policy"] == "round-robin"), None)
    print("| policy | prefix hit rate | vs large replica | TTFT p50 (s) | TTFT p90 (s) | "
          "p90 vs round-robin | req/s | router's own ms | KV events/s per engine | "
          "event B/s per engine | errors |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        ratio = f"{r['ttft_p90'] / rr['ttft_p90']:.2f}x" if rr else "-"
        print(f"| {r['policy']} | {r['hit_rate']:.1%} | "
              f"{r['hit_rate'] / max(reference['hit_rate'], 1e-9):.1%} | {r['ttft_p50']:.2f} | "
              f"{r['ttft_p90']:.2f} | {ratio} | {r['req_per_s']:.2f} | "
              f"{r['router_own_ms']:.2f} | {r['events_per_s_engine']:.1f} | "
              f"{r['event_bytes_per_s_engine']:.0f} | {r['errors']} |")
    print("\n| policy | burst, prefix on every replica: max/mean in flight (at peak) | "
          "TTFT p90 (s) | burst, new prefixes: max/mean (at peak) | TTFT p90 (s) | "
          "restart: ready (s) | index synced (s) | hit rate of the first requests | "
          "of steady | placed as prefix hits |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    nan = {"max_over_mean": float("nan"), "peak": "-", "ttft_p90": float("nan")}
    for r in rows[:-1]:
        shared, new = r.get("burst_shared", nan), r.get("burst_new", nan)
        print(f"| {r['policy']} | {shared['max_over_mean']:.2f} ({shared['peak']}) | "
              f"{shared['ttft_p90']:.2f} | {new['max_over_mean']:.2f} ({new['peak']}) | "
              f"{new['ttft_p90']:.2f} | {r['restart_ready_s']:.2f} | "
              f"{r['restart_synced_s']:.2f} | {r['restart_hit_rate']:.1%} | "
              f"{r['restart_hit_rate'] / max(r['restart_of'], 1e-9):.1%} | "
              f"{r['restart_prefix_hits']:.0f}/{r['restart_requests']} |")
    print(f"\nrouter added latency (tiny requests, {args.latency_requests} each, interleaved): "
          f"direct p50 {latency['direct_p50_ms']:.2f} ms, via router p50 "
          f"{latency['routed_p50_ms']:.2f} ms, added {latency['added_p50_ms']:.2f} ms; "
          f"router's own time per request (mean) {latency['router_own_mean_ms']:.3f} ms")
    print(f"load average (1, 5, 15 min) at the end: {os.getloadavg()}")


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
    p.add_argument("--burst", type=int, default=64,
                   help="requests in the burst phase (0: none)")
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
    common = ["engine", "serve", *([args.model] if args.model else []), "--port", "0",
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
            flags = VARIANTS.get(policy, ["--policy", policy])

            def start_router(j: int, flags=flags, policy=policy) -> Proc:
                r = Proc(["paged_router", "--host", "127.0.0.1", "--port", "0", *flags,
                          *(["--tokenizer", model_dir] if "precise" in flags else []),
                          "--backends", ",".join(urls), "--log-decisions"], "routing on",
                         logs / f"router-{policy}-{j}-{time.monotonic_ns()}.log")
                return r

            routers = [start_router(j) for j in range(args.routers)]
            for router in routers:
                router.wait_ready()
            try:
                row = phase(policy, ",".join(r.url for r in routers), [r.url for r in routers],
                            urls, args, prompts, tenants_warm, tenants, seed=10 * k)
                again, routers[0] = restart(policy, lambda: start_router(0), routers[0], urls,
                                            args, prompts, tenants, seed=10 * k + 2)
                row.update(again, restart_of=row["hit_rate"])
                if args.burst:
                    fresh = system_prompts(urls[0], 1, lo, hi, seed=200 + k)[0]
                    row.update(burst(policy, ",".join(r.url for r in routers),
                                     [r.url for r in routers], urls, args, fresh,
                                     seed=10 * k + 3))
                rows.append(row)
            finally:
                for router in routers:
                    router.stop()
        prompts = system_prompts(urls[0], args.tenants, lo, hi, seed=99)
        rows.append(phase("single large replica (reference)", large.url, [], [large.url], args,
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
    print_tables(rows, latency, args)
    if args.out:
        Path(args.out).write_text(json.dumps({"args": vars(args), "rows": rows,
                                              "added_latency": latency}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
