"""ARC for the host tier (engine/kv_offload/arc.py, `kv_offloading_eviction_policy: arc`):
the lists and the target p step by step as Megiddo and Modha's algorithm defines them, its
resistance to one-off scans that LRU lacks, and the engine's greedy output unchanged with
it under forced eviction from both the pool and the host tier."""
from __future__ import annotations

import random

import pytest
from test_kv_offload import block_gib, prompts, run_phases, with_tail

from engine import LLM
from engine.kv_medium import Medium
from engine.kv_offload import ArcHostTier, HostEntry, HostTier

B = 64  # bytes per block in the unit tests


def entry(name: str) -> HostEntry:
    return HostEntry(name.encode(), data=name)


def request(tier, name: str) -> list[str]:
    """One reference as a cache sees it: a hit, else the block inserted. Returns what left."""
    if tier.get(name.encode()) is not None:
        return []
    return [e.data for e in tier.insert(entry(name))]


def state(tier: ArcHostTier) -> tuple:
    names = (lambda d: "".join(h.decode() for h in d))
    return names(tier.t1), names(tier.t2), names(tier.b1), names(tier.b2), tier.p


def replay(tier: ArcHostTier, steps: list[tuple]) -> None:
    """(reference, evicted, (T1, T2, B1, B2, p)) per step: lists least recent first."""
    for ref, evicted, expected in steps:
        assert request(tier, ref) == evicted, ref
        assert state(tier) == expected, ref
        tier.check_invariants()


def test_each_reference_moves_the_lists_as_arc_defines():
    tier = ArcHostTier(2 * B, B)  # c = 2
    steps = [
        ("a", [], ("a", "", "", "", 0)),
        ("b", [], ("ab", "", "", "", 0)),
        ("a", [], ("b", "a", "", "", 0)),           # a hit in T1 moves to T2
        ("c", ["b"], ("c", "a", "b", "", 0)),       # full, |T1| > p: T1's oldest to B1
        ("b", ["a"], ("c", "b", "", "a", 1)),       # back from B1: p + 1; |T1| = p: T2's to B2
        ("a", ["c"], ("", "ba", "c", "", 0)),       # back from B2: p - 1; T1's oldest to B1
        ("d", ["b"], ("d", "a", "c", "b", 0)),      # T1 empty: T2's oldest goes to B2
        ("e", ["d"], ("e", "a", "d", "b", 0)),      # |T1|+|B1| = c: B1's oldest forgotten
        ("a", [], ("e", "a", "d", "b", 0)),         # a hit in T2 stays there, most recent
    ]
    replay(tier, steps)


def test_p_moves_by_the_ghost_lists_ratio_and_a_tie_with_p_evicts_from_t1():
    tier = ArcHostTier(3 * B, B)  # c = 3
    for ref in "cfcbfed":
        request(tier, ref)
    assert state(tier) == ("d", "cf", "be", "", 0)
    steps = [
        ("e", ["c"], ("d", "fe", "b", "c", 1)),     # from B1: p + max(0/2, 1)
        ("g", ["f"], ("dg", "e", "b", "cf", 1)),    # |T1| = 2 > p = 1 is false: T2's oldest
        ("b", ["e"], ("dg", "b", "", "cfe", 3)),    # from B1: p + |B2|/|B1| = 1 + 2/1
        ("f", ["d"], ("g", "bf", "d", "ce", 2)),    # from B2: p - 1; |T1| = p: T1's oldest
    ]
    replay(tier, steps)


def test_p_falls_by_the_ratio_of_b1_to_b2_for_a_block_back_from_b2():
    tier = ArcHostTier(4 * B, B)  # c = 4
    for ref in "bhffjcbdhg":
        request(tier, ref)
    assert state(tier) == ("cdg", "h", "j", "fb", 2)
    steps = [
        ("j", ["h"], ("cdg", "j", "", "fbh", 4)),   # from B1: p + |B2|/|B1| = 2 + 2/1
        ("h", ["c"], ("dg", "jh", "c", "fb", 3)),   # from B2: p - max(0/3, 1)
        ("f", ["d"], ("g", "jhf", "cd", "b", 2)),   # from B2: p - max(1/2, 1)
        ("b", ["g"], ("", "jhfb", "cdg", "", 0)),   # from B2: p - |B1|/|B2| = 2 - 2/1
    ]
    replay(tier, steps)


def test_t1_filling_the_whole_tier_drops_its_oldest_without_a_ghost():
    tier = ArcHostTier(2 * B, B)
    assert request(tier, "a") == [] and request(tier, "b") == []
    assert request(tier, "c") == ["a"]
    assert state(tier) == ("bc", "", "", "", 0)


def test_the_directory_holds_at_most_2c_hashes_and_p_stays_in_bounds():
    rng = random.Random(0)
    tier = ArcHostTier(5 * B + B - 1, B)  # room for 5 whole blocks
    assert tier.max_entries == 5
    seen_b2_hit = seen_b1_hit = False
    for _ in range(3000):
        name = f"{rng.randrange(4) if rng.random() < 0.5 else 4 + rng.randrange(20)}"
        h = name.encode()
        seen_b1_hit |= h in tier.b1
        seen_b2_hit |= h in tier.b2
        left = request(tier, name)
        assert name.encode() in tier and name not in left
        tier.check_invariants()
    assert seen_b1_hit and seen_b2_hit, "the sequence should have come back from both ghosts"
    with pytest.raises(AssertionError):
        ArcHostTier(-1, B)
    empty = ArcHostTier(B - 1, B)
    e = entry("x")
    assert empty.insert(e) == [e] and len(empty) == 0


def _scan_hits(tier) -> int:
    """A recurring set of 4 blocks, referenced twice, then 40 one-off blocks with the set
    referenced after every 4 of them: how many of the set's references hit."""
    hot = [f"h{i}" for i in range(4)]
    for _ in range(2):
        for h in hot:
            request(tier, h)
    hits = 0
    for i in range(40):
        request(tier, f"s{i}")
        if i % 4 == 3:
            for h in hot:
                hits += tier.get(h.encode()) is not None
                if h.encode() not in tier:
                    tier.insert(entry(h))
    return hits


def test_a_scan_of_one_off_blocks_keeps_the_recurring_ones_where_lru_loses_them():
    arc, lru = _scan_hits(ArcHostTier(6 * B, B)), _scan_hits(HostTier(6 * B, B))
    assert arc == 40, "ARC keeps the set referenced twice in T2 through the scan"
    assert lru < 20, f"LRU: {lru} of 40; the scan (4 blocks between uses) pushes the set out"


@pytest.mark.parametrize("block_size", [1, 16])
def test_greedy_output_is_the_same_with_arc_under_eviction_from_pool_and_host(
        tiny_checkpoints, block_size):
    """A host tier of about three prefixes for six: ARC and LRU evict different blocks,
    so which come back from the tier differs; the tokens may not."""
    first = prompts(seed=20 + block_size, count=6, prefix_len=48)
    again = [with_tail(p, i) for i, p in enumerate(first)]
    phases = [[p] for p in first] + [[again[0]], [again[0]], again[:3], again[3:]]
    outs, stats = {}, {}
    for policy in (None, "lru", "arc"):
        kw = dict(model=tiny_checkpoints["llama"], block_size=block_size,
                  num_gpu_blocks_override=128 // block_size + 2, max_model_len=128)
        if policy:
            kw.update(kv_offloading_size=block_gib(block_size, 3 * 48 // block_size),
                      kv_offloading_eviction_policy=policy)
        llm = LLM(**kw)
        outs[policy] = run_phases(llm, phases)
        if policy:
            tier = llm.llm_engine.offload.host
            tier.check_invariants()
            assert isinstance(tier, ArcHostTier) == (policy == "arc")
            stats[policy] = llm.llm_engine.offload.stats
    assert outs["arc"] == outs["lru"] == outs[None]
    assert all(s.blocks_loaded[Medium.CPU] > 0 for s in stats.values())


def test_the_policy_is_checked_against_the_settings_table():
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="kv_offloading_eviction_policy must be one of lru, arc"):
        EngineConfig(model="m", kv_offloading_eviction_policy="lfu")


def test_lru_and_arc_are_both_the_host_policy_the_tiers_take():
    from engine.kv_offload.host import HostPolicy
    for index in (HostTier(4096, 1024), ArcHostTier(4096, 1024)):
        assert isinstance(index, HostPolicy), type(index)
    assert not isinstance(object(), HostPolicy)
