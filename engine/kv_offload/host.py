"""The host tier's index: block hash -> a copy of the block's KV in host memory, LRU,
bounded by bytes (no torch here: an entry's `data` is whatever the transfer made).

The engine thread owns the index (insert, lookup, evict); the transfer worker only fills
an entry's `data` and then sets `ready`. A lookup never returns an entry that is not
ready, so nothing ever waits for a copy in flight.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch


class HostEntry:
    """One block's KV off the device. `data` is set once, by the worker, before `ready`."""

    __slots__ = ("block_hash", "data", "ready", "on_disk")

    def __init__(self, block_hash: bytes, data: torch.Tensor | None = None,
                 on_disk: bool = False) -> None:
        self.block_hash = block_hash
        self.data = data
        self.on_disk = on_disk  # read from (or written to) the disk tier
        self.ready = threading.Event()
        if data is not None:
            self.ready.set()

    @property
    def loadable(self) -> bool:
        return self.ready.is_set() and self.data is not None


@runtime_checkable
class HostPolicy(Protocol):
    """The host tier's index as the tiers use it: LRU (HostTier, below) or ARC
    (arc.ArcHostTier). `get` counts as a use; `insert` returns the entries it evicted."""
    capacity_bytes: int
    block_bytes: int
    max_entries: int

    @property
    def used_bytes(self) -> int: ...

    def __len__(self) -> int: ...

    def __contains__(self, block_hash: bytes) -> bool: ...

    def get(self, block_hash: bytes) -> HostEntry | None: ...

    def insert(self, entry: HostEntry) -> list[HostEntry]: ...

    def hashes(self) -> list[bytes]: ...

    def check_invariants(self) -> None: ...


class HostTier:
    """LRU of HostEntry by block hash; `capacity_bytes // block_bytes` entries at most."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        assert capacity_bytes >= 0 and block_bytes > 0
        self.capacity_bytes = capacity_bytes
        self.block_bytes = block_bytes
        self.max_entries = capacity_bytes // block_bytes
        self._lru: OrderedDict[bytes, HostEntry] = OrderedDict()  # least recent first

    def __len__(self) -> int:
        return len(self._lru)

    def __contains__(self, block_hash: bytes) -> bool:
        return block_hash in self._lru

    @property
    def used_bytes(self) -> int:
        return len(self._lru) * self.block_bytes

    def get(self, block_hash: bytes) -> HostEntry | None:
        """The entry (most recently used from now on), or None."""
        entry = self._lru.get(block_hash)
        if entry is not None:
            self._lru.move_to_end(block_hash)
        return entry

    def insert(self, entry: HostEntry) -> list[HostEntry]:
        """Adds entry as the most recent; returns the entries evicted to make room (entry
        itself when the tier holds nothing)."""
        assert entry.block_hash not in self._lru
        if self.max_entries == 0:
            return [entry]
        evicted = []
        while len(self._lru) >= self.max_entries:
            evicted.append(self._lru.popitem(last=False)[1])
        self._lru[entry.block_hash] = entry
        return evicted

    def hashes(self) -> list[bytes]:
        return list(self._lru)

    def check_invariants(self) -> None:
        assert len(self._lru) <= self.max_entries, "the host tier holds more than its bound"
        assert self.used_bytes <= self.capacity_bytes
        for h, entry in self._lru.items():
            assert entry.block_hash == h
