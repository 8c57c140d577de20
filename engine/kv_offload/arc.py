"""The host tier's index with ARC instead of LRU (`kv_offloading_eviction_policy: arc`).

Adaptive Replacement Cache (Megiddo and Modha, FAST 2003) over block hashes: T1 holds
blocks seen once since they entered the tier, T2 blocks referenced again (a prefix lookup
that found them, or the device pool evicting a block whose copy is here); B1 and B2
remember the hashes last evicted from each (ghosts, no data). A block coming back from B1
says T1 was too small, one from B2 that T2 was: the target size of T1, `p`, moves toward
whichever list would have kept it. A stream of blocks used once (one-off long documents)
then passes through T1 without flushing the prefixes that recur, which LRU would evict.

Same interface as HostTier (engine/kv_offload/host.py): the engine thread calls get and
insert; insert returns the entries it evicted (they go on to the disk tier).
"""
from __future__ import annotations

from collections import OrderedDict

from engine.kv_offload.host import HostEntry


class ArcHostTier:
    """ARC of HostEntry by block hash; `capacity_bytes // block_bytes` entries at most."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        assert capacity_bytes >= 0 and block_bytes > 0
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.max_entries = capacity_bytes // block_bytes
        self.p = 0.0  # the target size of T1
        # least recent first in each
        self.t1: OrderedDict[bytes, HostEntry] = OrderedDict()
        self.t2: OrderedDict[bytes, HostEntry] = OrderedDict()
        self.b1: OrderedDict[bytes, None] = OrderedDict()
        self.b2: OrderedDict[bytes, None] = OrderedDict()

    def __len__(self) -> int:
        return len(self.t1) + len(self.t2)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self.t1 or block_hash in self.t2

    @property
    def used_bytes(self) -> int:
        return len(self) * self.block_bytes

    def get(self, block_hash: bytes) -> HostEntry | None:
        """The entry, or None; a reference: the entry is T2's most recent from now on."""
        entry = self.t1.pop(block_hash, None)
        if entry is not None:
            self.t2[block_hash] = entry
            return entry
        entry = self.t2.get(block_hash)
        if entry is not None:
            self.t2.move_to_end(block_hash)
        return entry

    def insert(self, entry: HostEntry) -> list[HostEntry]:
        """Adds entry (to T2 if its hash is a ghost, else to T1); returns the entries evicted
        to make room (entry itself when the tier holds nothing)."""
        h, c = entry.block_hash, self.max_entries
        assert h not in self
        if c == 0:
            return [entry]
        evicted: list[HostEntry] = []
        if h in self.b1:  # T1 was too small to keep it
            self.p = min(float(c), self.p + max(len(self.b2) / len(self.b1), 1.0))
            del self.b1[h]
            self._replace(evicted, in_b2=False)
            self.t2[h] = entry
            return evicted
        if h in self.b2:  # T2 was too small to keep it
            self.p = max(0.0, self.p - max(len(self.b1) / len(self.b2), 1.0))
            del self.b2[h]
            self._replace(evicted, in_b2=True)
            self.t2[h] = entry
            return evicted
        if len(self.t1) + len(self.b1) >= c:
            if len(self.t1) < c:
                self.b1.popitem(last=False)
                self._replace(evicted, in_b2=False)
            else:  # T1 is the whole tier and B1 is empty: T1's oldest goes, no ghost
                evicted.append(self.t1.popitem(last=False)[1])
        elif len(self) + len(self.b1) + len(self.b2) >= c:
            if len(self) + len(self.b1) + len(self.b2) >= 2 * c:
                self.b2.popitem(last=False)
            self._replace(evicted, in_b2=False)
        self.t1[h] = entry
        return evicted

    def _replace(self, evicted: list[HostEntry], in_b2: bool) -> None:
        """Room for one entry when the tier is full: T1's oldest to B1 if T1 is over its
        target (or at it, for a hash coming back from B2), else T2's oldest to B2."""
        if self.t1 and (len(self.t1) > self.p or (in_b2 and len(self.t1) == self.p)):
            h, old = self.t1.popitem(last=False)
            self.b1[h] = None
        else:
            h, old = self.t2.popitem(last=False)
            self.b2[h] = None
        evicted.append(old)

    def hashes(self) -> list[bytes]:
        return list(self.t1) + list(self.t2)

    def check_invariants(self) -> None:
        c = self.max_entries
        assert len(self) <= c, "the host tier holds more than its bound"
        assert self.used_bytes <= self.capacity_bytes
        assert len(self.t1) + len(self.b1) <= c, "ARC: |T1| + |B1| > c"
        assert len(self) + len(self.b1) + len(self.b2) <= 2 * c, "ARC: more than 2c hashes"
        assert 0 <= self.p <= c
        lists = (self.t1, self.t2, self.b1, self.b2)
        assert sum(map(len, lists)) == len(set().union(*lists)), "ARC: a hash in two lists"
        for table in (self.t1, self.t2):
            for h, entry in table.items():
                assert entry.block_hash == h
