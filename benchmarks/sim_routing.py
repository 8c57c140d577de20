#!/usr/bin/env python
"""A discrete-event model of the routing benchmark, for comparing policy variants quickly.

    python benchmarks/sim_routing.py [--seeds 30] [--users 8] [--requests 128]

The router's real policy objects (paged_router.policies) place requests on N modelled
replicas (`precise` with its index fed by the modelled caches, as KV events without delay); each replica is a FIFO server with an LRU block cache of --blocks blocks (16
tokens each), a prefill cost per uncached token and a decode cost per output token.
The workload is benchmarks/bench_routing.py's: T tenants with 1,000-1,600-token system
prompts, Zipf-chosen, closed-loop users. It prints, per variant, the medians over seeds
of the token hit rate, TTFT p50/p90 (model seconds) and requests/s, and the hit rate's
mean and worst seed. A model, not a measurement: the engines batch and share CPUs,
which it leaves out; use it to rank variants, the benchmark to measure them.
"""
from __future__ import annotations

import argparse
import heapq
import random
import statistics
from collections import OrderedDict

from paged_router.hashing import ring_point
from paged_router.policies import PrecisePolicy, PrefixPolicy, RouteRequest, make_policy
from paged_router.pool import Backend

BLOCK = 16
CHUNK_TOKENS = 32  # the router's 128-character chunks, about 32 tokens of this text


def block_hash(seed: int, tenant: int, k: int) -> int:
    return ring_point(f"{seed}-{tenant}-{k}")


def simulate(policy, *, replicas: int, blocks: int, tenants: int, zipf: float, users: int,
             warmup: int, requests: int, seed: int, prefill_s: float, decode_s: float,
             out_tokens: int, rate: float | None = None, event_lag: bool = False
             ) -> tuple[float, float, float, float]:
    """Closed loop (`users`), or with `rate` the warm-up closed loop and then the measured
    requests as Poisson arrivals at `rate` per second, as bench_routing.py --rate."""
    rng = random.Random(seed)
    sizes = [rng.randint(1000, 1600) for _ in range(tenants)]
    weights = [1 / (k + 1) ** zipf for k in range(tenants)]
    order = rng.choices(range(tenants), weights, k=warmup + requests)
    backends = [Backend(f"http://replica-{i}") for i in range(replicas)]
    caches: list[OrderedDict] = [OrderedDict() for _ in range(replicas)]
    free_at = [0.0] * replicas
    events: list[tuple] = []
    hits = queried = 0
    ttfts: list[float] = []
    nxt, start_measured = 0, 0.0

    def submit(now: float, user: int) -> None:
        nonlocal nxt, hits, queried
        if nxt >= len(order):
            return
        i, tenant = nxt, order[nxt]
        nxt += 1
        precise = isinstance(policy, PrecisePolicy)  # hashes blocks, as the engines do
        chunk = BLOCK if precise else CHUNK_TOKENS
        hashes = [block_hash(seed, tenant, k) for k in range(sizes[tenant] // chunk)]
        request = RouteRequest(hashes=hashes + [ring_point(f"{seed}-question-{i}")])
        backend = policy.choose(request, backends).order[0]
        policy.record(request, backend)
        backend.in_flight += 1
        r = backends.index(backend)
        cache, held, n = caches[r], 0, sizes[tenant] // BLOCK
        while held < n and (tenant, held) in cache:  # the longest cached run of the prompt
            held += 1
        for k in reversed(range(n)):  # the engine frees a sequence's blocks tail first:
            cache[(tenant, k)] = None  # a prompt's head is evicted last
            cache.move_to_end((tenant, k))
        if precise and not event_lag:  # the KV events, without delay
            policy.index.store(backend.url, hashes[held:])
        while len(cache) > blocks - 2 * backend.in_flight:  # running requests hold blocks too
            t, k = cache.popitem(last=False)[0]
            if precise:
                policy.index.remove(backend.url, [block_hash(seed, t, k)])
        if i >= warmup:
            hits, queried = hits + held * BLOCK, queried + sizes[tenant]
        start = max(now, free_at[r])
        first_token = start + (sizes[tenant] - held * BLOCK + 10) * prefill_s
        free_at[r] = first_token + out_tokens * decode_s
        heapq.heappush(events, (free_at[r], 1, user, r, i >= warmup, first_token - now))
        if precise and event_lag:  # the engine reports the blocks once its prefill ran
            heapq.heappush(events, (first_token, 2, (tenant, held, n), r, False, 0.0))

    for user in range(users):
        submit(0.0, user)
    end = 0.0
    while events:
        end, kind, user, r, measured, ttft = heapq.heappop(events)
        if kind == 2:  # stored events arrive: the blocks computed that are still cached
            tenant, held, n = user
            policy.index.store(backends[r].url, [block_hash(seed, tenant, k) for k in
                                                 range(held, n) if (tenant, k) in caches[r]])
            continue
        if kind == 0:  # an open-loop arrival
            submit(end, -1)
            continue
        backends[r].in_flight -= 1
        if measured:
            ttfts.append(ttft)
        if rate is None or nxt < warmup:
            submit(end, user)
        elif nxt == warmup and not any(e[1] == 1 for e in events):  # warm-up done: open loop
            t = start_measured = end
            for _ in range(requests):
                t += rng.expovariate(rate)
                heapq.heappush(events, (t, 0, -1, -1, False, 0.0))
    end -= start_measured
    ttfts.sort()
    return (hits / queried, ttfts[len(ttfts) // 2], ttfts[int(len(ttfts) * 0.9)],
            len(ttfts) / end)


VARIANTS = {
    "prefix (defaults)": lambda: PrefixPolicy(),
    "prefix, hit factor 2.0": lambda: PrefixPolicy(hit_load_factor=2.0),
    "prefix, cache balance off": lambda: PrefixPolicy(cache_balance=None),
    "prefix, one tight bound": lambda: PrefixPolicy(hit_load_factor=0.25),
    "prefix, one tight bound, ring only": lambda: PrefixPolicy(hit_load_factor=0.25,
                                                                cache_balance=None),
    "precise (defaults; index = the modelled caches)": lambda: PrecisePolicy(),
    "precise, footprint = blocks held only": lambda: PrecisePolicy(count_evictions=False),
    "precise, cache balance 0.25 (the default before run 17)":
        lambda: PrecisePolicy(cache_balance=0.25),
    "precise, hit factor 2.0": lambda: PrecisePolicy(hit_load_factor=2.0),
    "least-load": lambda: make_policy("least-load"),
    "round-robin": lambda: make_policy("round-robin"),
}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--seeds", type=int, default=30)
    p.add_argument("--replicas", type=int, default=4)
    p.add_argument("--blocks", type=int, default=400)
    p.add_argument("--tenants", type=int, default=16)
    p.add_argument("--zipf", type=float, default=1.1)
    p.add_argument("--users", type=int, default=8)
    p.add_argument("--rate", type=float, default=None,
                   help="measured requests as Poisson arrivals at this rate (the warm-up "
                        "stays closed loop with --users)")
    p.add_argument("--warmup", type=int, default=32)
    p.add_argument("--requests", type=int, default=128)
    p.add_argument("--prefill-s", type=float, default=1 / 3000, help="seconds per prompt token")
    p.add_argument("--decode-s", type=float, default=0.03, help="seconds per output token")
    p.add_argument("--out-tokens", type=int, default=8)
    p.add_argument("--event-lag", action="store_true",
                   help="`precise` learns a request's blocks when its prefill ends (as the "
                        "engines' KV events), not when it is placed")
    p.add_argument("--only", default=None, help="variants whose name contains this")
    args = p.parse_args()
    common = dict(blocks=args.blocks, tenants=args.tenants, zipf=args.zipf, users=args.users,
                  warmup=args.warmup, requests=args.requests, rate=args.rate, prefill_s=args.prefill_s,
                  decode_s=args.decode_s, out_tokens=args.out_tokens, event_lag=args.event_lag)
    rows = [(name, [simulate(make(), replicas=args.replicas, seed=s, **common)
                    for s in range(args.seeds)]) for name, make in VARIANTS.items()
            if args.only is None or args.only in name]
    rows.append(("one large replica (reference)", [
        simulate(make_policy("round-robin"), replicas=1, seed=s,
                 **{**common, "blocks": args.blocks * args.replicas}) for s in range(args.seeds)]))
    print("| variant | hit rate (median) | mean | worst seed | TTFT p50 | TTFT p90 | req/s |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for name, runs in rows:
        hit, p50, p90, rate = (statistics.median(x) for x in zip(*runs))
        hit_rates = [r[0] for r in runs]
        print(f"| {name} | {hit:.3f} | {statistics.fmean(hit_rates):.3f} | "
              f"{min(hit_rates):.3f} | {p50:.2f} | {p90:.2f} | {rate:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
