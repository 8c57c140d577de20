"""The KV block pool: block tables, reference counts, prefix caching, copy-on-write.

Deals in block ids and token ids only; the model runner owns the tensors. A block is in
exactly one of three states:
  used       ref_count > 0 (in some sequence's block table)
  cached     ref_count == 0, holds a full block registered under its prefix hash; reusable
             by a later request until evicted (least recently freed first)
  free       ref_count == 0, no hash
With KV tiers (engine/kv_offload/) an evicted cached block is copied below the pool, and a
prefix run goes on into those tiers: such a hit gets a fresh block that a load worker
fills while the request waits ("loading": used, held by the request and by its load job,
no hash until loaded; engine/kv_offload/loads.py).
"""
from __future__ import annotations

from collections import OrderedDict
from typing import TYPE_CHECKING

from engine.block_hash import hash_block  # shared with the router (engine/block_hash.py)
from engine.kv_blocks import Block, KVCacheStats, check_kv_invariants
from engine.kv_medium import Medium
from engine.sequence import Sequence

if TYPE_CHECKING:
    from engine.kv_events import KVEventRecorder
    from engine.kv_offload import OffloadTiers, TierHit

__all__ = ["Block", "KVCacheManager", "KVCacheStats", "hash_block"]


class KVCacheManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool) -> None:
        assert num_blocks > 0 and block_size > 0
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        self._free: list[int] = list(range(num_blocks - 1, -1, -1))  # stack, block 0 on top
        self._evictable: OrderedDict[int, None] = OrderedDict()  # cached, LRU first
        self._hash_to_block: dict[bytes, int] = {}
        self.prefix_queries = 0
        self.prefix_hits = 0
        self.evictions = 0
        self.cow_copies = 0
        # KV events (engine/kv_events.py): told when blocks enter or leave the prefix cache
        self.events: KVEventRecorder | None = None
        # KV tiers under the pool (engine/kv_offload/); None: evicted blocks are gone
        self.offload: OffloadTiers | None = None
        self._loading: dict[int, TierHit] = {}  # block id -> the hit its load job writes
        self.hits_by_medium = {Medium.GPU: 0}

    def attach_offload(self, tiers: OffloadTiers) -> None:
        self.offload, tiers.kv = tiers, self
        self.hits_by_medium.update({Medium.CPU: 0, Medium.DISK: 0})

    # ---- accounting -------------------------------------------------------------------
    @property
    def num_available(self) -> int:
        return len(self._free) + len(self._evictable)

    def stats(self) -> KVCacheStats:
        num_cached = len(self._evictable)
        num_free = len(self._free)
        return KVCacheStats(self.num_blocks, num_free, num_cached,
                            self.num_blocks - num_free - num_cached, self.prefix_queries,
                            self.prefix_hits, self.evictions, self.cow_copies,
                            dict(self.hits_by_medium))

    def blocks_for(self, num_tokens: int) -> int:
        return -(-num_tokens // self.block_size)

    # ---- block life cycle ---------------------------------------------------------------
    def _take(self) -> Block:
        """A block for new content: a never-cached one first, else evict the LRU cached one."""
        if self._free:
            block = self.blocks[self._free.pop()]
        else:
            block_id, _ = self._evictable.popitem(last=False)
            block = self.blocks[block_id]
            if self.offload is not None:
                self.offload.evicted(block_id, block.block_hash)
            if self.events is not None:
                self.events.removed(block.block_hash)
            del self._hash_to_block[block.block_hash]
            block.block_hash = None
            self.evictions += 1
        assert block.ref_count == 0
        block.ref_count = 1
        return block

    def _share(self, block: Block) -> None:
        if block.ref_count == 0:
            del self._evictable[block.block_id]
        block.ref_count += 1

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        assert block.ref_count > 0, f"double free of block {block_id}"
        block.ref_count -= 1
        if block.ref_count == 0:
            if block.block_hash is not None:
                self._evictable[block_id] = None
            else:
                self._free.append(block_id)

    # ---- prefix cache ---------------------------------------------------------------------
    def _full_block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """Hashes of seq's first num_blocks full blocks, memoised on the sequence."""
        bs = self.block_size
        while len(seq.block_hashes) < num_blocks:
            i = len(seq.block_hashes)
            parent = seq.block_hashes[-1] if seq.block_hashes else None
            seq.block_hashes.append(
                hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs], seq.cache_salt))
        return seq.block_hashes[:num_blocks]

    def lookup_prefix(self, seq: Sequence) -> list[int | TierHit]:
        """Longest run of cached blocks for a sequence not yet holding blocks: device block
        ids, and TierHits for blocks found in the tiers below the pool.

        The last token is never served from the cache: its logits are needed.
        """
        if not self.enable_prefix_caching or seq.wants_prompt_logits:
            return []
        hits: list[int | TierHit] = []
        for h in self._full_block_hashes(seq, (seq.num_tokens - 1) // self.block_size):
            hit = self._hash_to_block.get(h)
            if hit is None and self.offload is not None:
                hit = self.offload.find(h)
            if hit is None:
                break
            hits.append(hit)
        return hits

    def cache_full_blocks(self, seq: Sequence, num_new_tokens: int) -> None:
        """Register the blocks that the last step's `num_new_tokens` filled, so later
        requests can reuse them (only those: earlier ones were offered already)."""
        if not self.enable_prefix_caching:
            return
        first = (seq.num_computed_tokens - num_new_tokens) // self.block_size
        num_full = seq.num_computed_tokens // self.block_size
        if first >= num_full:   # no block filled (most decode steps): nothing to hash
            return
        hashes = self._full_block_hashes(seq, num_full)
        for i in range(first, num_full):
            block = self.blocks[seq.block_table[i]]
            if block.block_hash is None and hashes[i] not in self._hash_to_block:
                block.block_hash = hashes[i]
                self._hash_to_block[hashes[i]] = block.block_id
                if self.events is not None:
                    bs = self.block_size
                    self.events.stored(hashes[i], hashes[i - 1] if i else None,
                                       seq.token_ids[i * bs:(i + 1) * bs])

    # ---- check/act pairs ------------------------------------------------------------------
    def can_admit(self, seq: Sequence, hits: list[int | TierHit], num_new_tokens: int) -> bool:
        on_device = [b for b in hits if type(b) is int]
        needed = self.blocks_for(len(hits) * self.block_size + num_new_tokens) - len(on_device)
        reclaimed = sum(1 for b in on_device if self.blocks[b].ref_count == 0)
        return needed <= self.num_available - reclaimed

    def admit(self, seq: Sequence, hits: list[int], num_new_tokens: int) -> int:
        """First allocation of a waiting sequence: reuse the cached prefix, add fresh blocks.
        Returns the number of tokens the cache already holds (the caller's computed count)."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        assert all(type(h) is int for h in hits), "tier hits are admitted by admit_loading"
        assert self.can_admit(seq, hits, num_new_tokens)
        for hit in hits:
            self._share(self.blocks[hit])
        seq.block_table = list(hits)
        num_cached = len(hits) * self.block_size
        self._count_hits(seq, hits)
        needed = self.blocks_for(num_cached + num_new_tokens) - len(hits)
        seq.block_table.extend(self._take().block_id for _ in range(needed))
        return num_cached

    def _count_hits(self, seq: Sequence, hits: list[int | TierHit]) -> None:
        if self.enable_prefix_caching:
            self.prefix_queries += seq.num_tokens
            self.prefix_hits += len(hits) * self.block_size
            for hit in hits:
                medium = Medium.GPU if type(hit) is int else hit.medium
                self.hits_by_medium[medium] += self.block_size

    # ---- loads from the tiers below (engine/kv_offload/loads.py) ----------------------------
    def admit_loading(self, seq: Sequence, hits: list[int | TierHit], num_new_tokens: int
                      ) -> tuple[list[tuple[TierHit, int]], list[int]]:
        """Admit a waiting sequence whose prefix run reaches the tiers: its block table is
        the run, device hits shared and each tier hit in a fresh block that its load job
        also holds (`end_load` drops that). Room for its first `num_new_tokens` is checked
        too, not taken. Returns the loads, (hit, block), and their block-table positions."""
        assert not seq.block_table and seq.num_computed_tokens == 0
        assert self.can_admit(seq, hits, num_new_tokens)
        for hit in hits:  # device hits first: a fresh block must not be taken from them
            if type(hit) is int:
                self._share(self.blocks[hit])
        loads, positions = [], []
        for i, hit in enumerate(hits):
            if type(hit) is int:
                seq.block_table.append(hit)
                continue
            block = self._take()
            block.ref_count += 1  # the load job's
            self._loading[block.block_id] = hit
            seq.block_table.append(block.block_id)
            loads.append((hit, block.block_id))
            positions.append(i)
        self._count_hits(seq, hits)
        return loads, positions

    def end_load(self, block_id: int, register: bool) -> None:
        """The load job is done with the block: if `register`, it holds its hit's KV and
        joins the prefix cache; the job's reference goes (the block is free if its request
        went meanwhile)."""
        h = self._loading.pop(block_id).block_hash
        block = self.blocks[block_id]
        if register and h not in self._hash_to_block:
            block.block_hash, self._hash_to_block[h] = h, block_id
            if self.events is not None:
                self.events.copied(h, Medium.GPU)
        self._release(block_id)

    def keep_prefix(self, seq: Sequence, num_blocks: int, media: dict[int, str]) -> None:
        """After its loads: seq keeps the first num_blocks of its run (a load failed at the
        next one); the rest go back and are no hits (they will be computed). `media`: the
        tier of each loaded position (the others were device hits)."""
        dropped = range(num_blocks, len(seq.block_table))
        if self.enable_prefix_caching:
            for i in dropped:
                self.prefix_hits -= self.block_size
                self.hits_by_medium[media.get(i, Medium.GPU)] -= self.block_size
        for block_id in reversed(seq.block_table[num_blocks:]):
            self._release(block_id)
        del seq.block_table[num_blocks:]

    def _needs_cow(self, seq: Sequence) -> bool:
        """Will the next write land in a partially filled block that another sequence shares?"""
        if seq.num_computed_tokens % self.block_size == 0:
            return False
        last = self.blocks[seq.block_table[seq.num_computed_tokens // self.block_size]]
        return last.ref_count > 1

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        return needed + int(self._needs_cow(seq)) <= self.num_available

    def append(self, seq: Sequence, num_new_tokens: int, copies: list[tuple[int, int]]) -> None:
        """Grow seq's block table for its next tokens; copy-on-write a shared partial block.

        A copy is recorded as (src, dst) in `copies` for the model runner to perform
        before this step's cache writes.
        """
        assert self.can_append(seq, num_new_tokens)
        if self._needs_cow(seq):
            idx = seq.num_computed_tokens // self.block_size
            src = seq.block_table[idx]
            dst = self._take().block_id
            copies.append((src, dst))
            self._release(src)
            seq.block_table[idx] = dst
            self.cow_copies += 1
        needed = self.blocks_for(seq.num_computed_tokens + num_new_tokens) - len(seq.block_table)
        seq.block_table.extend(self._take().block_id for _ in range(needed))

    def trim(self, seq: Sequence) -> None:
        """Give back the blocks past seq's computed tokens: after a speculative step, those
        that only rejected drafts reached (never registered in the prefix cache: only full
        computed blocks are)."""
        keep = self.blocks_for(seq.num_computed_tokens)
        while len(seq.block_table) > keep:
            block_id = seq.block_table.pop()
            assert self.blocks[block_id].block_hash is None, "a rejected draft's block is cached"
            self._release(block_id)

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """Child shares all of parent's blocks, the partially filled last one included."""
        child.block_table = list(parent.block_table)
        for block_id in child.block_table:
            self._share(self.blocks[block_id])

    def free(self, seq: Sequence) -> None:
        """Drop seq's blocks; tail first so that prefix heads stay cached the longest."""
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []

    # ---- invariants (tests call this after every step) -------------------------------------
    def check_invariants(self, live: list[Sequence]) -> None:
        check_kv_invariants(self, live)
