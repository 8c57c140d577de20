"""Scheduling and cache policy, each pinned by a case that fails on the wrong policy
(no model, no torch: the policy layer alone)."""
from __future__ import annotations

import pytest

from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence

PARAMS = SamplingParams(max_tokens=8)


def _seq(rid: str, tokens: list[int], arrival: int, priority: int = 0,
         salt: str | None = None) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(tokens), num_prompt_tokens=len(tokens),
                    params=PARAMS, priority=priority, arrival_order=arrival, cache_salt=salt)


def _step(sched: Scheduler):
    """One step with a fake model: count the computed tokens, give every sequence that
    reached its end one new token."""
    batch = sched.schedule()
    for seq, n in zip(batch.seqs, batch.num_new_tokens):
        sched.advance(seq, n)
        if seq.num_computed_tokens == seq.num_tokens:
            seq.token_ids.append(1)
    return batch


def _full_pool(policy: str, priorities: list[int]):
    """Three running sequences, each filling exactly one 2-token block of a 3-block pool,
    and two more waiting: the next decode needs a block that is not there."""
    kv = KVCacheManager(num_blocks=3, block_size=2, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=3, max_num_batched_tokens=64, policy=policy)
    running = [_seq(name, [10 + i, 20 + i], i, prio) for i, (name, prio)
               in enumerate(zip("ABC", priorities))]
    for seq in running:
        sched.add(seq)
    assert set(_step(sched).seqs) == set(running)
    for i, name in enumerate("DE"):
        sched.add(_seq(name, [30 + i], 3 + i))
    return sched


def _names(seqs):
    return [s.request_id for s in seqs]


def test_preemption_victim_is_the_latest_arrival_among_equals():
    sched = _full_pool("fcfs", [0, 0, 0])
    batch = _step(sched)
    # A needs a block: the latest arrival (C) goes; then B needs one and only B is left
    assert _names(batch.preempted) == ["C", "B"]
    assert _names(batch.seqs) == ["A"]
    # ... and they go back to their original places in the queue, ahead of later arrivals
    assert _names(sched.waiting) == ["B", "C", "D", "E"]
    assert all(s.num_computed_tokens == 0 and not s.block_table for s in batch.preempted)


def test_preemption_victim_is_the_lowest_priority_first():
    # A arrived first but has the lowest priority (the largest value, as in vLLM)
    sched = _full_pool("priority", [2, 0, 1])
    assert _names(sched.running) == ["B", "C", "A"]  # admitted in priority order
    batch = _step(sched)
    # B needs a block: A (priority 2) goes, not C (1); then C needs one and only C is left
    assert _names(batch.preempted) == ["A", "C"]
    assert _names(batch.seqs) == ["B"]
    # back in (priority, arrival) order: D and E (priority 0) first
    assert _names(sched.waiting) == ["D", "E", "C", "A"]


def _cached(kv: KVCacheManager, rid: str, tokens: list[int], salt: str | None = None) -> Sequence:
    """Admit, compute and free a sequence: its full blocks stay in the cache."""
    seq = _seq(rid, tokens, 0, salt=salt)
    hits = kv.lookup_prefix(seq)
    seq.num_computed_tokens = kv.admit(seq, hits, len(tokens) - len(hits) * kv.block_size)
    n = len(tokens) - seq.num_computed_tokens
    seq.num_computed_tokens += n
    kv.cache_full_blocks(seq, n)
    kv.free(seq)
    return seq


def _hits(kv: KVCacheManager, tokens: list[int], salt: str | None = None) -> int:
    return len(kv.lookup_prefix(_seq("probe", tokens, 0, salt=salt)))


def _take_one(kv: KVCacheManager, token: int) -> None:
    seq = _seq(f"z{token}", [token, token], 0)
    kv.admit(seq, [], 2)  # one fresh block: with no free block left, one eviction


def test_eviction_is_least_recently_freed_first_and_tail_before_head():
    kv = KVCacheManager(num_blocks=5, block_size=2, enable_prefix_caching=True)
    x = [1, 2, 3, 4, 5, 6]  # three full blocks, freed first
    y = [7, 8, 9, 10]  # two full blocks, freed later
    _cached(kv, "x", x)
    _cached(kv, "y", y)
    assert kv.stats().num_free == 0 and kv.stats().num_cached == 5
    assert _hits(kv, x + [0]) == 3 and _hits(kv, y + [0]) == 2
    _take_one(kv, 40)  # evicts x's tail block: x keeps its head, y is untouched
    assert (_hits(kv, x + [0]), _hits(kv, y + [0])) == (2, 2)
    _take_one(kv, 41)
    assert (_hits(kv, x + [0]), _hits(kv, y + [0])) == (1, 2)
    _take_one(kv, 42)
    assert (_hits(kv, x + [0]), _hits(kv, y + [0])) == (0, 2)
    _take_one(kv, 43)  # now y, tail first
    assert _hits(kv, y + [0]) == 1
    assert kv.evictions == 4


@pytest.mark.parametrize("block_size", [2, 4])
def test_same_tokens_after_a_different_prefix_miss_the_cache(block_size):
    kv = KVCacheManager(num_blocks=16, block_size=block_size, enable_prefix_caching=True)
    head_p, head_q = [1] * block_size, [9] * block_size
    body = list(range(20, 20 + block_size))
    _cached(kv, "p", head_p + body + [5])
    _cached(kv, "q", head_q + body + [5])
    r = _seq("r", head_q + body + [6], 0)
    q_blocks = kv.lookup_prefix(r)
    p_blocks = kv.lookup_prefix(_seq("p2", head_p + body + [6], 0))
    assert len(q_blocks) == len(p_blocks) == 2
    # the second block holds the same tokens in both, but its K/V depend on what came before
    assert q_blocks[1] != p_blocks[1]
    assert _hits(kv, [7] * block_size + body + [6]) == 0


def test_cache_salt_separates_tenants():
    kv = KVCacheManager(num_blocks=16, block_size=2, enable_prefix_caching=True)
    tokens = [1, 2, 3, 4, 5]
    _cached(kv, "a", tokens, salt="tenant-a")
    assert _hits(kv, tokens, salt="tenant-a") == 2
    assert _hits(kv, tokens, salt="tenant-b") == 0
    assert _hits(kv, tokens) == 0
    _cached(kv, "plain", tokens)
    assert _hits(kv, tokens) == 2 and _hits(kv, tokens, salt="tenant-b") == 0


def test_preemption_victim_by_priority_not_by_admission_order():
    """A low-priority sequence admitted early is still the victim, not the latest admitted."""
    kv = KVCacheManager(num_blocks=2, block_size=2, enable_prefix_caching=False)
    sched = Scheduler(kv, max_num_seqs=4, max_num_batched_tokens=64, policy="priority")
    sched.add(_seq("A", [5], 0, priority=2))
    _step(sched)
    sched.add(_seq("B", [6, 7], 1, priority=0))
    _step(sched)
    assert _names(sched.running) == ["A", "B"]
    batch = _step(sched)  # both need a third block; only one can have it
    assert _names(batch.preempted) == ["A"] and _names(batch.seqs) == ["B"]
