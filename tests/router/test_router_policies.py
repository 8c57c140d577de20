"""The policies on their own: order, ties, bounded load, prefix table, session pins."""
from __future__ import annotations

import pytest

from paged_router.hashing import CharChunkHasher
from paged_router.policies import (LeastLoadPolicy, PrefixPolicy, RoundRobinPolicy,
                                    RouteRequest, hit_bound, load_bound, make_policy)
from paged_router.pool import Backend

HASHER = CharChunkHasher(chunk_chars=32)
SYSTEM = "You are the support bot of a shoe shop; answer briefly. " * 4


def pool(n: int = 3) -> list[Backend]:
    return [Backend(f"http://127.0.0.{i + 2}:8000") for i in range(n)]


def req(text: str, session: str | None = None) -> RouteRequest:
    return RouteRequest(HASHER.hashes(text), session)


def test_round_robin_visits_each_backend_in_turn():
    backends, policy = pool(), RoundRobinPolicy()
    picks = [policy.choose(RouteRequest(), backends).order[0].url for _ in range(6)]
    assert picks == [b.url for b in backends] * 2
    assert policy.choose(RouteRequest(), backends).order[1] is backends[1]  # retry target


def test_least_load_prefers_fewest_in_flight_then_kv_usage_then_waiting():
    a, b, c = backends = pool()
    a.in_flight, b.in_flight, c.in_flight = 3, 1, 1
    b.kv_cache_usage, c.kv_cache_usage = 0.5, 0.2
    policy = LeastLoadPolicy()
    assert [x.url for x in policy.choose(RouteRequest(), backends).order] == [c.url, b.url, a.url]
    c.kv_cache_usage, b.waiting, c.waiting = 0.5, 0, 4
    assert policy.choose(RouteRequest(), backends).order[0] is b
    b.waiting = c.waiting = 0  # a full tie rotates instead of always picking the first
    assert {policy.choose(RouteRequest(), backends).order[0].url for _ in range(4)} == \
        {b.url, c.url}


def test_load_bound_is_ceil_of_one_plus_eps_times_mean_including_the_new_request():
    backends = pool(4)
    assert load_bound(backends, 0.25) == 1          # idle: 1/4 * 1.25 -> 1
    backends[0].in_flight = 7                       # (7+1)/4 * 1.25 = 2.5 -> 3
    assert load_bound(backends, 0.25) == 3
    assert load_bound(backends, 1.0) == 4


def place(policy: PrefixPolicy, backends: list[Backend], n: int, finish: bool) -> list[tuple]:
    placed = []
    for i in range(n):
        r = req(SYSTEM + f"user question {i}")
        bounds = {True: hit_bound(backends, policy.load_factor, policy.hit_load_factor),
                  False: load_bound(backends, policy.load_factor)}
        choice = policy.choose(r, backends)
        pick = choice.order[0]
        # never above the hit bound for a holder, ceil((1+eps) * mean) for a new prefix
        assert pick.in_flight + 1 <= bounds[choice.decision in ("prefix_hit", "session")]
        pick.in_flight += 0 if finish else 1
        policy.record(r, pick)
        placed.append((pick.url, choice.decision))
    return placed


def test_prefix_sends_a_shared_prompt_to_one_backend_while_load_allows():
    backends = pool()
    placed = place(PrefixPolicy(), backends, 6, finish=True)  # one at a time
    assert placed[0][1] == "hash"
    assert placed[1:] == [(placed[0][0], "prefix_hit")] * 5


def test_prefix_concentrates_concurrent_requests_up_to_the_load_bound_then_spreads():
    spread = {}
    for eps in (0.25, 1.0):
        backends = pool()
        placed = place(PrefixPolicy(load_factor=eps, hit_load_factor=eps), backends, 9,
                       finish=False)
        assert placed[0][1] == "hash" and any(d == "overflow" for _, d in placed)
        spread[eps] = sorted(b.in_flight for b in backends)
        # the backends that took an overflow hold the prefix too: they share the rest
    assert spread[0.25] == [0, 4, 5]   # the third backend only when both holders are full
    assert spread[1.0] == [0, 2, 7]    # a looser bound concentrates more


def test_prefix_follows_the_longest_prefix_a_backend_was_sent():
    backends, policy = pool(), PrefixPolicy()
    first = req(SYSTEM + "turn one")
    choice = policy.choose(first, backends)
    assert choice.decision == "hash" and choice.hit_chunks == 0
    other = choice.order[1]          # pretend the request went elsewhere (e.g. a retry)
    policy.record(first, other)
    follow_up = req(SYSTEM + "turn one" + " and the answer, then turn two" * 3)
    choice = policy.choose(follow_up, backends)
    assert choice.order[0] is other and choice.decision == "prefix_hit"
    assert choice.hit_chunks == len(first.hashes)
    unrelated = policy.choose(req("a completely different prompt " * 6), backends)
    assert unrelated.decision in ("hash", "balance") and unrelated.hit_chunks == 0


def test_prefix_table_forgets_least_recently_used_hashes():
    policy = PrefixPolicy(table_size=4)
    b = pool(1)[0]
    policy.record(RouteRequest([1, 2, 3]), b)
    policy.record(RouteRequest([9, 8]), b)
    assert list(policy.table) == [2, 3, 9, 8]
    policy.record(RouteRequest([2, 7]), b)  # touching 2 makes it the most recent
    assert list(policy.table) == [9, 8, 2, 7]


def test_a_holder_may_take_more_than_a_new_prefix_under_the_looser_hit_bound():
    backends = pool()
    policy = PrefixPolicy(load_factor=0.0, hit_load_factor=1.0)
    placed = place(policy, backends, 4, finish=False)
    holder = placed[0][0]
    # 1 in flight, mean with the new one 2/3: the tight bound is 1, the hit bound 2
    assert [u for u, _ in placed[:2]] == [holder, holder]
    assert placed[1][1] == "prefix_hit"
    assert placed[2][0] != holder and placed[2][1] == "overflow"
    # a new prefix at the same moment never goes to a backend at the tight bound
    loads = {b.url: b.in_flight for b in backends}
    other = policy.choose(req("another tenant's system prompt " * 8), backends)
    assert loads[other.order[0].url] < load_bound(backends, 0.0)


def tenant_prompts(n: int) -> list[str]:
    return [f"Tenant {i}: " + "you answer questions about our products politely. " * 6
            for i in range(n)]


def spread_of_tenants(policy: PrefixPolicy, backends: list[Backend]) -> list[int]:
    owner = {}
    for text in tenant_prompts(12):
        choice = policy.choose(req(text), backends)
        policy.record(req(text), choice.order[0])
        owner[text] = choice.order[0].url
    return sorted(list(owner.values()).count(b.url) for b in backends)


def test_cache_balance_spreads_new_prefixes_evenly_where_the_ring_alone_does_not():
    # 12 equal-sized tenants on 4 backends: the ring alone (hashes are fixed, so this is
    # deterministic) puts them unevenly; the footprint bound gives each backend 3
    unbalanced = spread_of_tenants(PrefixPolicy(cache_balance=None), pool(4))
    assert max(unbalanced) - min(unbalanced) >= 2
    assert spread_of_tenants(PrefixPolicy(cache_balance=0.0), pool(4)) == [3, 3, 3, 3]
    loose = spread_of_tenants(PrefixPolicy(cache_balance=0.25), pool(4))
    assert max(loose) <= 4 and max(loose) - min(loose) < max(unbalanced) - min(unbalanced)


def test_a_new_prefix_skipped_for_cache_footprint_is_labelled_balance_and_hits_stay_put():
    backends, policy = pool(2), PrefixPolicy(cache_balance=0.0)
    texts = tenant_prompts(8)
    first_choice = policy.choose(req(texts[0]), backends)
    policy.record(req(texts[0]), first_choice.order[0])
    # the next tenant whose ring owner is the same (now fuller) backend goes elsewhere
    for text in texts[1:]:
        choice = policy.choose(req(text), backends)
        if policy.ring.walk(req(text).hashes[0])[0] == first_choice.order[0].url:
            assert choice.decision == "balance" and choice.order[0] is not first_choice.order[0]
            break
    else:
        pytest.fail("no tenant hashed to the first tenant's backend")
    # the first tenant itself is a hit on its holder whatever the footprints
    assert policy.choose(req(texts[0] + "more"), backends).order[0] is first_choice.order[0]


def test_footprint_counts_the_table_entries_naming_each_backend_through_evictions():
    import random

    rng = random.Random(7)
    backends = pool(5)
    policy = PrefixPolicy(table_size=40)
    policy.PER_HASH = 2
    for _ in range(300):
        hashes = [rng.randrange(60) for _ in range(rng.randint(1, 6))]
        policy.record(RouteRequest(hashes), rng.choice(backends))
        expected = {b.url: sum(b.url in urls for urls in policy.table.values())
                    for b in backends}
        assert {b.url: policy.footprint[b.url] for b in backends} == expected
        assert all(len(urls) <= 2 for urls in policy.table.values())


def test_session_pins_a_conversation_until_its_backend_is_over_the_bound():
    backends, policy = pool(), PrefixPolicy(load_factor=0.0, hit_load_factor=0.0)
    first = req("hello there, my name is Ann", session="s-1")
    pinned = policy.choose(first, backends).order[-1]  # pin to a backend hashing would not pick
    policy.record(first, pinned)
    unrelated = req("an unrelated question about tax law in 1999", session="s-1")
    choice = policy.choose(unrelated, backends)
    assert choice.order[0] is pinned and choice.decision == "session"
    assert policy.choose(req("an unrelated question about tax law in 1999"),
                         backends).decision == "hash"
    pinned.in_flight = 5
    assert policy.choose(unrelated, backends).order[0] is not pinned


def test_unknown_policy_names_the_choices():
    with pytest.raises(ValueError, match="prefix, least-load, round-robin"):
        make_policy("random")
    with pytest.raises(ValueError, match="--load-factor"):
        PrefixPolicy(load_factor=-1)
    with pytest.raises(ValueError, match="--hit-load-factor"):
        PrefixPolicy(hit_load_factor=-0.5)
    with pytest.raises(ValueError, match="--cache-balance"):
        PrefixPolicy(cache_balance=-1)
