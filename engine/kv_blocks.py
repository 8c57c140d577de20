"""The KV block pool's records (a block, the pool's counters) and its invariants, which
the tests check after every engine step (engine/kv_cache_manager.py keeps the pool)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from engine.sequence import Sequence


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    block_hash: bytes | None = None


@dataclass
class KVCacheStats:
    num_blocks: int
    num_free: int
    num_cached: int
    num_used: int
    prefix_queries: int  # prompt tokens looked up
    prefix_hits: int  # of which found in the cache (any tier)
    evictions: int
    cow_copies: int
    # prefix_hits by tier (GPU, CPU, Disk); left out of ==
    hits_by_medium: dict[str, int] | None = field(default=None, compare=False)

    @property
    def usage(self) -> float:
        return self.num_used / self.num_blocks if self.num_blocks else 0.0


def check_kv_invariants(kv: Any, live: list[Sequence]) -> None:
    """`kv`: the KVCacheManager (its private lists are read here, nothing is changed).
    Every block used (its ref count = the live block tables' and load jobs' references),
    cached (unused, hashed, evictable) or free (unused, no hash), exactly one of them; the
    hash table matches; a loading block is not yet cached; and the tiers' own invariants."""
    refs = [0] * kv.num_blocks
    for seq in live:
        for block_id in seq.block_table:
            refs[block_id] += 1
    for block_id in kv._loading:  # the load job's reference
        refs[block_id] += 1
    free = set(kv._free)
    assert len(free) == len(kv._free), "a block is twice in the free list"
    for block in kv.blocks:
        assert block.ref_count == refs[block.block_id], (
            f"block {block.block_id}: ref_count {block.ref_count} != {refs[block.block_id]} users")
        in_free = block.block_id in free
        in_evictable = block.block_id in kv._evictable
        if block.ref_count:
            assert not in_free and not in_evictable
        else:
            assert in_free != in_evictable
            assert in_evictable == (block.block_hash is not None)
        if block.block_hash is not None:
            assert kv._hash_to_block[block.block_hash] == block.block_id
    assert len(kv._hash_to_block) == sum(b.block_hash is not None for b in kv.blocks)
    for block_id in kv._loading:  # held by its load job, not yet cached
        assert kv.blocks[block_id].block_hash is None, \
            f"block {block_id} is in the prefix cache while its load is not done"
    if kv.offload is not None:
        kv.offload.check_invariants(kv)
