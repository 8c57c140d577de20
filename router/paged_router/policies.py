"""Routing policies: small objects behind one interface.

`choose(request, backends)` returns the backends in the order to try them (the first is
the pick, the next is the retry target) and a label for the decision; `record(request,
backend)` tells the policy where a request went once a backend accepted it. Policies see
only healthy backends and read their in-flight counts and scraped load.
"""
from __future__ import annotations

import itertools
import math
from collections import Counter, OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from paged_router.hashing import ring_point
from paged_router.kv_index import KVIndex
from paged_router.pool import Backend
from paged_router.ring import HashRing

POLICIES = ("prefix", "least-load", "round-robin", "precise")
# --cache-balance when not given: `precise` places a new prefix on the first backend along
# its ring walk at or below the mean footprint. Its footprint is what the engines report,
# so no slack is needed for a guess; with 0.25 the routing benchmark's ring gave two
# replicas more tenants than their pools hold (runs 15 and 16). `prefix` counts what it
# sent, a guess, and keeps 0.25.
CACHE_BALANCE = {"prefix": 0.25, "precise": 0.0}


def precise_hit_load_factor(num_backends: int) -> float:
    """`precise`'s bound for holders of a prefix when `--hit-load-factor` is not given:
    2.0 with four backends or more, else 1.0 (the prefix policy's). At 16 req/s on four
    replicas, 1.0 turned hot tenants' holders away at low bounds (e.g. 3 in flight against
    [0, 0, 1]: the bound ceil(2 x 5/4) = 3) and the misses fed each other: 82.8 % of one
    large replica's prefix hits and P90 TTFT 0.21x round-robin, against 98.4 % and 0.02x
    with 2.0 (docs/benchmarks/routing.md, run 19; 98.2-99.9 % against 93-96 % at 2 req/s,
    runs 10 and 11). With N backends a factor of N - 1 or more lifts the bound entirely
    (ceil((1+eps_h) x mean) is then never below a holder's count), so 2.0 is kept for N >= 4,
    where a holder may still take at most 3/N of what is in flight."""
    return 2.0 if num_backends >= 4 else 1.0


@dataclass
class RouteRequest:
    hashes: list[int] = field(default_factory=list)  # chained prefix hashes of the prompt
    session: str | None = None                        # x-session-id header or `user`


@dataclass
class Choice:
    order: list[Backend]
    decision: str
    hit_chunks: int = 0  # prefix policy: chunks the pick is believed to hold already
    # what the decision was made on, per backend in `backends` order (the router's
    # decision log, `--log-decisions`): held blocks or chunks, in-flight, the two bounds
    detail: dict = field(default_factory=dict)


class Policy:
    name = ""

    def choose(self, request: RouteRequest, backends: Sequence[Backend]) -> Choice:
        raise NotImplementedError

    def record(self, request: RouteRequest, backend: Backend) -> None:
        """Called once a backend accepted the request (no-op for stateless policies)."""


class RoundRobinPolicy(Policy):
    name = "round-robin"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RouteRequest, backends: Sequence[Backend]) -> Choice:
        start = next(self._counter) % len(backends)
        return Choice(list(backends[start:]) + list(backends[:start]), "round_robin")


class LeastLoadPolicy(Policy):
    """Fewest in-flight requests; ties by lower KV-cache usage, then fewer waiting
    requests (both scraped from the backends), then in rotation."""

    name = "least-load"

    def __init__(self) -> None:
        self._counter = itertools.count()

    def choose(self, request: RouteRequest, backends: Sequence[Backend]) -> Choice:
        turn, n = next(self._counter), len(backends)
        ranked = sorted(enumerate(backends), key=lambda ib: (
            ib[1].in_flight, ib[1].kv_cache_usage, ib[1].waiting, (ib[0] - turn) % n))
        return Choice([b for _, b in ranked], "least_load")


def load_bound(backends: Sequence[Backend], load_factor: float) -> int:
    """The most in-flight requests a backend may hold after taking this one:
    ceil((1+eps) * mean), the mean counting the new request (bounded-load hashing)."""
    total = sum(b.in_flight for b in backends) + 1
    return math.ceil(total / len(backends) * (1 + load_factor))


def hit_bound(backends: Sequence[Backend], load_factor: float, hit_load_factor: float) -> int:
    """The bound for a backend that holds the request's prefix (or its session):
    ceil((1+eps_h) * mean), and never less than one above the tight bound for new
    prefixes. At low load both round up to the same small number (4 backends, 1 request in
    flight plus this one: mean 0.5, so ceil(1.25*0.5) = ceil(2*0.5) = 1), which would turn
    a hot prefix's second concurrent request away from its holder, onto a replica that
    must prefill it and evict another tenant to keep it: the routing benchmark's decision
    log showed every prefix hit the precise policy lost at 2 req/s lost that way. The +1
    changes nothing at higher loads, where ceil((1+eps_h) * mean) is the larger (with the
    defaults, always from a mean of 8/3 up)."""
    return max(load_bound(backends, hit_load_factor), load_bound(backends, load_factor) + 1)


def place_new_prefix(ring_order: list[Backend], bound: int, footprint: Mapping[str, float],
                     cache_balance: float | None) -> tuple[Backend, str]:
    """A new prefix (or one whose holders are all full): its place on the ring, skipping
    backends at the load bound ("overflow") or above the cache-footprint bound
    `(1+cache_balance) * mean footprint` ("balance")."""
    fitting = [b for b in ring_order if b.in_flight < bound]
    if cache_balance is not None and fitting:
        cap = (1 + cache_balance) * sum(footprint.get(b.url, 0) for b in ring_order) \
            / len(ring_order)
        for b in fitting:
            if footprint.get(b.url, 0) <= cap:
                return b, ("hash" if b is ring_order[0] else
                           "overflow" if ring_order[0].in_flight >= bound else "balance")
    if fitting:
        return fitting[0], "hash" if fitting[0] is ring_order[0] else "overflow"
    return ring_order[0], "hash"  # unreachable: some backend is at most the mean



def check_bounds(load_factor: float, hit_load_factor: float | None,
                 cache_balance: float | None) -> None:
    """The bounded-load settings the affinity policies share; ValueError naming the flag."""
    for flag, value in (("--load-factor", load_factor),
                        ("--hit-load-factor", 0.0 if hit_load_factor is None else hit_load_factor),
                        ("--cache-balance", 0.0 if cache_balance is None else cache_balance)):
        if value < 0:
            raise ValueError(f"{flag} must be >= 0, got {value}")

class PrefixPolicy(Policy):
    """Longest known prefix first, consistent hashing for new prefixes, bounded load.

    The table maps each chained chunk hash to the backends it was sent to (first-seen
    order, a few at most) and forgets least-recently-used hashes beyond `table_size`.

    Two bounds, both `ceil((1+eps) * mean in-flight)`: a backend that already holds the
    request's prefix (or its session) may take it up to `hit_load_factor`, since a cached
    prefix makes the request a fraction of a miss's work there; a new prefix, and every
    overflow, goes by `load_factor`. New prefixes are also balanced by cache footprint: the
    router counts the chunks it believes each backend holds (its table's entries), and a
    new prefix skips, along its ring walk, a backend whose footprint is above
    `(1+cache_balance) * mean` (bounded-load consistent hashing, with the cache as the
    load), so a few tenants hashing to one replica do not overflow its KV pool while
    another's sits idle.
    """

    name = "prefix"
    PER_HASH = 4

    def __init__(self, *, load_factor: float = 0.25, hit_load_factor: float = 1.0,
                 cache_balance: float | None = 0.25, table_size: int = 200_000,
                 session_table_size: int = 100_000, ring_replicas: int = 100) -> None:
        check_bounds(load_factor, hit_load_factor, cache_balance)
        self.load_factor, self.hit_load_factor = load_factor, hit_load_factor
        self.cache_balance, self.table_size = cache_balance, table_size
        self.session_table_size = session_table_size
        self.table: OrderedDict[int, list[str]] = OrderedDict()
        self.footprint: Counter[str] = Counter()  # table entries naming each backend
        self.sessions: OrderedDict[str, str] = OrderedDict()
        self.ring = HashRing(replicas=ring_replicas)

    def choose(self, request: RouteRequest, backends: Sequence[Backend]) -> Choice:
        by_url = {b.url: b for b in backends}
        self.ring.set_nodes(by_url)
        bound = load_bound(backends, self.load_factor)
        hits_bound = hit_bound(backends, self.load_factor, self.hit_load_factor)

        key = request.hashes[0] if request.hashes else ring_point(request.session or "")
        ring_order = [by_url[u] for u in self.ring.walk(key)]

        def first(pick: Backend, decision: str) -> Choice:
            rest = [b for b in ring_order if b is not pick]
            return Choice([pick, *rest], decision, self._held(request, pick.url))

        pinned = by_url.get(self.sessions.get(request.session, "")) if request.session else None
        if pinned is not None and pinned.in_flight < hits_bound:
            return first(pinned, "session")
        for h in reversed(request.hashes):  # the longest prefix some fitting backend holds
            for url in self.table.get(h, ()):
                b = by_url.get(url)
                if b is not None and b.in_flight < hits_bound:
                    return first(b, "prefix_hit")
        pick, decision = place_new_prefix(ring_order, bound, self.footprint, self.cache_balance)
        return first(pick, decision)

    def _held(self, request: RouteRequest, url: str) -> int:
        for i in range(len(request.hashes) - 1, -1, -1):
            if url in self.table.get(request.hashes[i], ()):
                return i + 1
        return 0

    def record(self, request: RouteRequest, backend: Backend) -> None:
        for h in request.hashes:
            urls = self.table.get(h)
            if urls is None:
                self.table[h] = [backend.url]
                self.footprint[backend.url] += 1
            else:
                if backend.url not in urls:
                    urls.append(backend.url)
                    self.footprint[backend.url] += 1
                    for dropped in urls[:-self.PER_HASH]:
                        self.footprint[dropped] -= 1
                    del urls[:-self.PER_HASH]
                self.table.move_to_end(h)
        while len(self.table) > self.table_size:
            for url in self.table.popitem(last=False)[1]:
                self.footprint[url] -= 1
        if request.session:
            self.sessions[request.session] = backend.url
            self.sessions.move_to_end(request.session)
            while len(self.sessions) > self.session_table_size:
                self.sessions.popitem(last=False)


class PrecisePolicy(Policy):
    """Where the prefix is, as the engines say: scores each backend by the blocks of the
    request's prefix its prefix cache holds (the KV index that the engines' KV events keep,
    router/paged_router/kv_index.py; `hashes` are the engine's own block hashes of the request),
    most first (of equal runs, more on the device, then on the host tier), under the hit
    bound (`hit_load_factor`; None: `precise_hit_load_factor` of the backends' count); a new
    prefix, or one whose holders are all full, goes
    as in the prefix policy (its place on the ring, the tight bound, and the footprint
    bound). The footprint is each backend's demand on its cache: the blocks it holds plus
    those it lost recently (KVIndex.demand). The blocks held alone stop growing at the
    pool's size, so they cannot tell a replica that evicts its tenants in turn from a full
    one that keeps them; `count_evictions=False` uses them alone (for comparison)."""

    name = "precise"

    def __init__(self, *, load_factor: float = 0.25, hit_load_factor: float | None = None,
                 cache_balance: float | None = CACHE_BALANCE["precise"], ring_replicas: int = 100,
                 index: KVIndex | None = None, count_evictions: bool = True) -> None:
        check_bounds(load_factor, hit_load_factor, cache_balance)
        self.load_factor, self.hit_load_factor = load_factor, hit_load_factor
        self.cache_balance, self.count_evictions = cache_balance, count_evictions
        self.index = KVIndex() if index is None else index
        self.ring = HashRing(replicas=ring_replicas)

    def choose(self, request: RouteRequest, backends: Sequence[Backend]) -> Choice:
        by_url = {b.url: b for b in backends}
        self.ring.set_nodes(by_url)
        bound = load_bound(backends, self.load_factor)
        hit_factor = (precise_hit_load_factor(len(backends)) if self.hit_load_factor is None
                      else self.hit_load_factor)
        hits_bound = hit_bound(backends, self.load_factor, hit_factor)
        key = request.hashes[0] if request.hashes else ring_point(request.session or "")
        ring_order = [by_url[u] for u in self.ring.walk(key)]
        held = self.index.prefix_blocks(request.hashes, by_url)

        footprint = {url: self.footprint(url) for url in by_url}

        def first(pick: Backend, decision: str) -> Choice:
            rest = [b for b in ring_order if b is not pick]
            return Choice([pick, *rest], decision, held[pick.url], {
                "held": [held[b.url] for b in backends], "bound": bound,
                "hit_bound": hits_bound, "in_flight": [b.in_flight for b in backends],
                "footprint": [round(footprint[b.url]) for b in backends],
                "cached": [self.index.size(b.url) for b in backends]})

        holders = sorted((i, b) for i, b in enumerate(ring_order) if held[b.url])
        # most blocks of the prefix first; of equal runs, the one with more of them on the
        # device, then on the host tier (a load from the tiers below beats recomputing, but
        # not the device), then the least loaded
        media = self.index.leading_media(request.hashes, {b.url: held[b.url] for _, b in holders})
        holders.sort(key=lambda ib: (-held[ib[1].url], -media[ib[1].url][0],
                                     -media[ib[1].url][1], ib[1].in_flight, ib[0]))
        for _, b in holders:
            if b.in_flight < hits_bound:
                return first(b, "prefix_hit")
        return first(*place_new_prefix(ring_order, bound, footprint, self.cache_balance))

    def footprint(self, url: str) -> float:
        return self.index.demand(url) if self.count_evictions else self.index.size(url)


def make_policy(name: str, *, load_factor: float = 0.25, hit_load_factor: float | None = None,
                cache_balance: float | None | str = "default", table_size: int = 200_000
                ) -> Policy:
    if cache_balance == "default":
        cache_balance = CACHE_BALANCE.get(name)
    if name == "prefix":
        return PrefixPolicy(load_factor=load_factor,
                            hit_load_factor=1.0 if hit_load_factor is None else hit_load_factor,
                            cache_balance=cache_balance, table_size=table_size)
    if name == "precise":
        return PrecisePolicy(load_factor=load_factor, hit_load_factor=hit_load_factor,
                             cache_balance=cache_balance)
    if name == "least-load":
        return LeastLoadPolicy()
    if name == "round-robin":
        return RoundRobinPolicy()
    raise ValueError(f"unknown policy {name!r}; choose one of {', '.join(POLICIES)}")
