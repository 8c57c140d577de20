"""The bounded-load rule, for every placement a load-bounded policy makes.

A new prefix (decisions `hash`, `balance`, `overflow`, `least_load`) never takes a backend
to more than the tight bound ceil((1+eps)*mean); a holder of the request's prefix or
session (`prefix_hit`, `session`) never to more than the hit bound
max(ceil((1+eps_h)*mean), tight bound + 1); with the cache-footprint balance on and off. Random workloads: tenants sharing system
prompts, follow-ups extending earlier prompts, sessions, requests finishing at random.
"""
from __future__ import annotations

import math
import random

import pytest

from paged_router.hashing import CharChunkHasher
from paged_router.policies import LeastLoadPolicy, Policy, PrefixPolicy, RouteRequest, load_bound
from paged_router.pool import Backend

HASHER = CharChunkHasher(chunk_chars=16)
HIT_DECISIONS = ("prefix_hit", "session")


def random_requests(rng: random.Random, n: int) -> list[RouteRequest]:
    tenants = [f"tenant {t} system prompt, be helpful. " * 3 for t in range(6)]
    sent: list[str] = []
    out = []
    for _ in range(n):
        roll = rng.random()
        if sent and roll < 0.3:
            text = rng.choice(sent) + f" follow-up {rng.randrange(1000)}"  # extends a prompt
        else:
            text = rng.choice(tenants) + f" question {rng.randrange(1000)}" * rng.randint(1, 3)
        sent.append(text)
        session = f"s{rng.randrange(5)}" if rng.random() < 0.2 else None
        out.append(RouteRequest(HASHER.hashes(text), session))
    return out


def check_placements(policy: Policy, *, seed: int, n_backends: int, load_factor: float,
                     hit_load_factor: float, steps: int = 400) -> set[str]:
    """Places random requests (some finishing each step) and asserts both bounds on every
    pick; returns the decisions seen, so a test can say which paths it covered.
    `hit_load_factor` is the factor the bound is checked with (the policy's own, or what
    its default comes to for `n_backends`)."""
    rng = random.Random(seed)
    backends = [Backend(f"http://10.0.0.{i}:8000") for i in range(n_backends)]
    open_requests: list[Backend] = []
    seen = set()
    for request in random_requests(rng, steps):
        mean = (sum(b.in_flight for b in backends) + 1) / len(backends)  # with this one
        tight = math.ceil((1 + load_factor) * mean)
        hit = max(math.ceil((1 + hit_load_factor) * mean), tight + 1)
        choice = policy.choose(request, backends)
        pick = choice.order[0]
        seen.add(choice.decision)
        bound = hit if choice.decision in HIT_DECISIONS else tight
        assert pick.in_flight + 1 <= bound, (
            f"{choice.decision}: {pick.url} would hold {pick.in_flight + 1} in flight, "
            f"bound {bound} (loads {[b.in_flight for b in backends]})")
        pick.in_flight += 1
        open_requests.append(pick)
        policy.record(request, pick)
        for _ in range(rng.choice((0, 0, 1, 1, 2))):  # finish some, so loads go up and down
            if open_requests:
                open_requests.pop(rng.randrange(len(open_requests))).in_flight -= 1
    return seen


@pytest.mark.parametrize("cache_balance", [0.25, 0.0, None], ids=["balance", "tight", "off"])
@pytest.mark.parametrize("load_factor,hit_load_factor", [(0.25, 1.0), (0.0, 0.5), (0.5, 0.5)])
def test_prefix_policy_keeps_new_prefixes_under_the_tight_bound_and_hits_under_the_hit_bound(
        cache_balance, load_factor, hit_load_factor):
    seen: set[str] = set()
    for seed in range(6):
        policy = PrefixPolicy(load_factor=load_factor, hit_load_factor=hit_load_factor,
                              cache_balance=cache_balance)
        seen |= check_placements(policy, seed=seed, n_backends=2 + seed % 3,
                                 load_factor=load_factor, hit_load_factor=hit_load_factor)
    # the workload reaches the paths the bounds guard
    assert {"prefix_hit", "session", "hash", "overflow"} <= seen
    if cache_balance is not None:
        assert "balance" in seen


def test_a_new_prefix_whose_ring_owner_is_at_the_tight_bound_goes_elsewhere():
    # the bound is reached exactly: in_flight == bound is full (the new request would exceed it)
    policy = PrefixPolicy(load_factor=0.0, hit_load_factor=1.0, cache_balance=None)
    backends = [Backend(f"http://10.0.0.{i}:8000") for i in range(2)]
    request = RouteRequest(HASHER.hashes("a brand new tenant's prompt " * 4))
    policy.choose(request, backends)  # sets up the ring
    owner = next(b for b in backends if b.url == policy.ring.walk(request.hashes[0])[0])
    other = next(b for b in backends if b is not owner)
    owner.in_flight, other.in_flight = 1, 0       # mean with the new one: 1 -> bound 1
    assert load_bound(backends, 0.0) == 1
    choice = policy.choose(request, backends)
    assert choice.order[0] is other and choice.decision == "overflow"
    # under the hit bound (2) the owner would still fit: only a holder may use it
    policy.record(request, owner)
    assert policy.choose(request, backends).order[0] is owner


def test_least_load_never_exceeds_the_tight_bound():
    for seed in range(4):
        check_placements(LeastLoadPolicy(), seed=seed, n_backends=3, load_factor=0.0,
                         hit_load_factor=0.0)
