"""The tiers under the device pool, as the KV cache manager and the engine see them.

Engine thread only (no torch here: the transfer and the disk tier are handed in).

- Store: the pool evicts a full, hashed block (`evicted`, during scheduling). The
  scheduler hands the step's evictions to the engine with the batch (`blocks_to_store`);
  before anything of the step writes to the pool, `transfer` snapshots those blocks
  (`KVTransfer.gather`), indexes them in the host tier as not yet ready, and queues the
  copy for the worker, which fills and readies them. A host eviction spills the block to
  disk (a worker job after the one filling it).
- Lookup: after the device pool's run, `find` looks each next block up in the host tier
  (ready entries only), then on disk (a whole, verified file; promoted into the host tier).
- Load: the KV cache manager admits a hit into a fresh device block and plans the load
  (`blocks_to_load` of the batch); `transfer` copies the planned loads still wanted (an
  aborted request's are not) into their blocks before the step's forward, and the manager
  then registers the loaded blocks in the prefix cache.
"""
from __future__ import annotations

import bisect
import time
from dataclasses import dataclass, field
from typing import Any, Protocol

from engine.kv_offload.host import HostEntry, HostTier


class BlockPool(Protocol):
    """What the tiers use of the KV cache manager (engine/kv_cache_manager.py), which
    imports this package: a protocol here keeps the import one way."""
    blocks: list[Any]
    events: Any

    def is_loading(self, block_id: int, hit: "TierHit") -> bool: ...

    def finish_load(self, block_id: int) -> None: ...

# vLLM's medium names (vllm/v1/kv_offload/mediums.py), also in KV events
MEDIUM_GPU, MEDIUM_CPU, MEDIUM_DISK = "GPU", "CPU", "Disk"
# load latency histogram edges, seconds
LOAD_SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                        0.5, 1.0, 2.5, 5.0)


@dataclass(eq=False)
class TierHit:
    """A prefix block found below the device pool; `medium`: where (CPU or Disk)."""
    block_hash: bytes
    entry: HostEntry
    medium: str


@dataclass
class TierStats:
    blocks_stored: dict[str, int] = field(default_factory=lambda: {MEDIUM_CPU: 0, MEDIUM_DISK: 0})
    blocks_loaded: dict[str, int] = field(default_factory=lambda: {MEDIUM_CPU: 0, MEDIUM_DISK: 0})
    stores_dropped: int = 0  # the worker's queue was full
    loads_cancelled: int = 0  # the request was gone before its load ran
    load_seconds_sum: float = 0.0
    load_buckets: list[int] = field(default_factory=lambda: [0] * (len(LOAD_SECONDS_BUCKETS) + 1))

    def observe_load(self, seconds: float) -> None:
        self.load_seconds_sum += seconds
        self.load_buckets[bisect.bisect_left(LOAD_SECONDS_BUCKETS, seconds)] += 1


class OffloadTiers:
    def __init__(self, host: HostTier, transfer: Any, worker: Any, disk: Any = None) -> None:
        self.host, self.io, self.worker, self.disk = host, transfer, worker, disk
        self.block_bytes = host.block_bytes
        self.kv: BlockPool | None = None  # set by KVCacheManager.attach_offload
        self._stores: list[tuple[int, bytes]] = []  # (device block, hash) evicted this step
        self.stats = TierStats()

    # ---- scheduling (KV cache manager) -------------------------------------------------------
    def evicted(self, block_id: int, block_hash: bytes) -> None:
        """The pool gave this hashed block to new content: keep a copy unless one exists."""
        if self.host.get(block_hash) is None:
            self._stores.append((block_id, block_hash))

    def take_stores(self) -> list[tuple[int, bytes]]:
        stores, self._stores = self._stores, []
        return stores

    def find(self, block_hash: bytes) -> TierHit | None:
        entry = self.host.get(block_hash)
        if entry is not None:
            return TierHit(block_hash, entry, MEDIUM_CPU) if entry.loadable else None
        if self.disk is None:
            return None
        data = self.disk.read(block_hash)
        if data is None:
            return None
        entry = HostEntry(block_hash, data, on_disk=True)
        self._spill(self._insert(entry))  # promoted: the next lookup finds it in host memory
        return TierHit(block_hash, entry, MEDIUM_DISK)

    # ---- the step's transfers (engine, before the forward) -------------------------------------
    def transfer(self, batch: Any) -> None:
        if batch.blocks_to_store:
            self._store(batch.blocks_to_store)
        kv = self.kv
        loads = [(hit, b) for hit, b in batch.blocks_to_load if kv.is_loading(b, hit)]
        self.stats.loads_cancelled += len(batch.blocks_to_load) - len(loads)
        if not loads:
            return
        start = time.perf_counter()
        self.io.load([hit.entry.data for hit, _ in loads], [b for _, b in loads])
        self.stats.observe_load(time.perf_counter() - start)
        for hit, block_id in loads:
            self.stats.blocks_loaded[hit.medium] += 1
            kv.finish_load(block_id)

    def _store(self, stores: list[tuple[int, bytes]]) -> None:
        stores = [(b, h) for b, h in stores if h not in self.host]
        if not stores:
            return
        snapshot = self.io.gather([b for b, _ in stores])
        entries = [HostEntry(h) for _, h in stores]
        if not self.worker.submit(lambda: self._fill(snapshot, entries)):
            self.stats.stores_dropped += len(entries)
            return
        self._spill([old for entry in entries for old in self._insert(entry)])

    def _fill(self, snapshot: Any, entries: list[HostEntry]) -> None:
        """Worker thread: the snapshot's blocks into their entries, then ready."""
        for entry, data in zip(entries, self.io.split(snapshot)):
            entry.data = data
            entry.ready.set()
        if self.host.max_entries:  # else they only pass through, to disk
            self.stats.blocks_stored[MEDIUM_CPU] += len(entries)

    def _insert(self, entry: HostEntry) -> list[HostEntry]:
        """Into the host tier; returns what it evicted (entry itself when it holds none)."""
        events = self.kv.events if self.kv is not None else None
        evicted = self.host.insert(entry)
        if events is not None:
            if entry not in evicted:
                events.copied(entry.block_hash, MEDIUM_CPU)
            for old in evicted:
                if old is not entry:
                    events.removed(old.block_hash, MEDIUM_CPU)
        return evicted

    def _spill(self, entries: list[HostEntry]) -> None:
        """Host evictions go to disk: one worker job, after the ones filling them. A block
        whose file is there already (read from disk before, by this engine or another on
        the directory) is not written again: the key is its content, and reading it
        refreshed its place in the disk tier's LRU."""
        if self.disk is not None:
            entries = [e for e in entries if not self.disk.path_for(e.block_hash).exists()]
        if self.disk is None or not entries:
            return
        if not self.worker.submit(lambda: self._write(entries)):
            self.stats.stores_dropped += len(entries)
        elif self.kv is not None and self.kv.events is not None:
            for entry in entries:
                self.kv.events.copied(entry.block_hash, MEDIUM_DISK)

    def _write(self, entries: list[HostEntry]) -> None:
        for entry in entries:
            if entry.data is not None and self.disk.write(entry.block_hash, entry.data):
                entry.on_disk = True
                self.stats.blocks_stored[MEDIUM_DISK] += 1

    # ---- upkeep --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Waits for every queued copy and disk write (tests, benchmarks, shutdown)."""
        self.worker.drain()

    def close(self) -> None:
        self.worker.close()

    def check_invariants(self, kv: BlockPool) -> None:
        self.host.check_invariants()
        for block_id, block_hash in self._stores:
            assert kv.blocks[block_id].block_hash != block_hash, \
                f"block {block_id} is queued for the host tier but still cached as itself"

    def usage(self) -> dict[str, tuple[int, int]]:
        """(bytes used, capacity) per tier."""
        out = {MEDIUM_CPU: (self.host.used_bytes, self.host.capacity_bytes)}
        if self.disk is not None:
            out[MEDIUM_DISK] = (self.disk.usage_bytes, self.disk.capacity_bytes)
        return out

