"""The block pool's counters, copy-on-write, memoised block hashes and its own consistency
checks, each on a small hand-checked case (no model, no torch; found by scripts/mutation.py,
complementing the property tests in test_kv_scheduler_properties.py)."""
from __future__ import annotations

import pytest

from engine.kv_cache_manager import KVCacheManager, KVCacheStats
from engine.sampling_params import SamplingParams
from engine.sequence import Sequence

PARAMS = SamplingParams(max_tokens=8)


def _seq(tokens: list[int], rid: str = "r") -> Sequence:
    return Sequence(request_id=rid, token_ids=list(tokens), num_prompt_tokens=len(tokens),
                    params=PARAMS)


def _run(kv: KVCacheManager, seq: Sequence, num_new: int) -> None:
    """What the scheduler does for a step that computes num_new tokens of seq."""
    if seq.block_table:
        kv.append(seq, num_new, [])
    else:
        seq.num_computed_tokens = kv.admit(seq, kv.lookup_prefix(seq), num_new)
    seq.num_computed_tokens += num_new
    kv.cache_full_blocks(seq, num_new)


def test_a_pool_needs_at_least_one_block_of_at_least_one_token():
    assert KVCacheManager(1, 1, False).num_available == 1
    for num_blocks, block_size in ((0, 16), (4, 0), (0, 0)):
        with pytest.raises(AssertionError):
            KVCacheManager(num_blocks, block_size, False)


def test_a_fresh_pool_has_every_block_free_and_every_counter_at_zero():
    assert KVCacheManager(8, 4, True).stats() == KVCacheStats(
        num_blocks=8, num_free=8, num_cached=0, num_used=0, prefix_queries=0, prefix_hits=0,
        evictions=0, cow_copies=0)


def test_prefix_queries_and_hits_add_up_over_admissions():
    kv = KVCacheManager(16, 2, True)
    _run(kv, _seq([1, 2, 3, 4, 5]), 5)                 # 5 looked up, none found
    b = _seq([1, 2, 3, 4, 6])
    hits = kv.lookup_prefix(b)
    assert len(hits) == 2
    kv.admit(b, hits, 1)                               # 5 more, 4 found
    c = _seq([1, 2, 9])
    kv.admit(c, kv.lookup_prefix(c), 1)                # 3 more, 2 found
    stats = kv.stats()
    assert (stats.prefix_queries, stats.prefix_hits) == (13, 6)


def test_a_block_filled_by_generated_tokens_is_cached_under_its_full_content():
    kv = KVCacheManager(16, 4, True)
    a = _seq([1, 2, 3, 4, 5, 6])                       # the second block half full
    _run(kv, a, 6)
    a.token_ids += [7, 8]                              # two generated tokens fill it
    _run(kv, a, 2)
    b = _seq([1, 2, 3, 4, 5, 6, 7, 8, 9])
    assert kv.lookup_prefix(b) == a.block_table[:2]


def test_writes_into_a_shared_partial_block_copy_it_first_and_are_counted():
    kv = KVCacheManager(8, 4, False)
    parent = _seq([1, 2, 3, 4, 5, 6])
    _run(kv, parent, 6)
    children = []
    for index in (1, 2):
        child = parent.fork(index)
        kv.fork(parent, child)
        children.append(child)
    shared_full, shared_partial = parent.block_table
    copies: list[tuple[int, int]] = []
    kv.append(children[0], 1, copies)
    assert copies == [(shared_partial, children[0].block_table[1])]
    assert children[0].block_table[0] == shared_full   # the full block stays shared
    assert kv.stats().cow_copies == 1
    kv.append(children[1], 1, copies)
    assert copies[1] == (shared_partial, children[1].block_table[1])
    assert kv.stats().cow_copies == 2
    kv.append(parent, 1, copies)                       # now the partial block's only holder
    assert len(copies) == 2 and parent.block_table[1] == shared_partial
    assert kv.stats().cow_copies == 2


def test_releasing_a_block_that_nobody_holds_is_a_double_free():
    kv = KVCacheManager(4, 2, False)
    a = _seq([1, 2, 3])
    _run(kv, a, 3)
    stale = list(a.block_table)
    kv.free(a)
    a.block_table = stale                              # a table that survived its free
    with pytest.raises(AssertionError, match=f"double free of block {stale[-1]}"):
        kv.free(a)


def test_admitting_a_sequence_that_still_holds_blocks_is_refused():
    kv = KVCacheManager(4, 2, False)
    a = _seq([1, 2, 3])
    kv.admit(a, [], 3)                                 # computed count not yet set
    with pytest.raises(AssertionError):
        kv.admit(a, [], 3)                             # its two blocks would leak


def test_the_invariant_check_catches_a_used_block_in_the_free_list():
    kv = KVCacheManager(4, 2, False)
    a = _seq([1, 2, 3])
    _run(kv, a, 3)
    kv.check_invariants([a])
    kv._free.append(a.block_table[0])
    with pytest.raises(AssertionError):
        kv.check_invariants([a])


def test_the_invariant_check_catches_a_block_twice_in_the_free_list():
    kv = KVCacheManager(4, 2, False)
    kv._free.append(kv._free[0])
    with pytest.raises(AssertionError, match="^a block is twice in the free list$"):
        kv.check_invariants([])


def test_admission_counts_the_blocks_for_the_new_tokens_beyond_the_cached_prefix():
    kv = KVCacheManager(3, 2, True)
    holder = _seq([1, 2, 3, 4, 5])                     # holds all three blocks
    _run(kv, holder, 5)
    b = _seq([1, 2, 3, 4, 9, 9, 9])
    hits = kv.lookup_prefix(b)
    assert len(hits) == 2
    assert not kv.can_admit(b, hits, 3)                # 2 more blocks, none left
    assert kv.can_admit(b, hits, 0)
    kv.free(holder)                                    # its 3 blocks: 2 cached hits, 1 free
    assert not kv.can_admit(b, hits, 3)                # the hits cannot also be evicted
    assert kv.can_admit(b, hits, 2)


def test_appending_after_a_fork_needs_a_block_for_the_copy():
    kv = KVCacheManager(3, 4, False)
    parent = _seq([1, 2, 3, 4, 5, 6])
    _run(kv, parent, 6)
    child = parent.fork(1)
    kv.fork(parent, child)
    filler = _seq([7])
    _run(kv, filler, 1)                                # the pool is now full
    assert not kv.can_append(child, 1)                 # its write needs a private copy
    kv.free(filler)
    assert kv.can_append(child, 1)
