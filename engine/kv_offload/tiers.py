"""The tiers under the device pool, as the KV cache manager and the engine see them.

Engine thread, except the jobs run by the two workers (no torch here: the transfer and the
disk tier are handed in).

- Store: the pool evicts a full, hashed block (`evicted`, during scheduling). The
  scheduler hands the step's evictions to the engine with the batch (`blocks_to_store`);
  before anything of the step writes to the pool, `transfer` snapshots those blocks
  (`KVTransfer.gather`), indexes them in the host tier as not yet ready, and queues the
  copy for the store worker, which fills and readies them. A host eviction spills the
  block to disk (a store-worker job after the one filling it).
- Lookup: after the device pool's run, `find` looks each next block up in the host tier
  (ready entries only), then on disk (a file under the block's name: read and checked by
  the load, promoted into the host tier once loaded).
- Load (engine/kv_offload/loads.py): the scheduler admits a request with tier hits into
  fresh device blocks and plans one job (`plan_load`); `transfer` starts it after the
  step's store snapshot; the load worker copies, and `poll`, at the start of a later step,
  registers the loaded blocks in the prefix cache and hands the request back to the
  scheduler. A block that fails to load (a file found bad by then) and the ones after it
  are recomputed.
"""
from __future__ import annotations

import bisect
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from engine.kv_medium import Medium
from engine.kv_offload.host import HostEntry, HostPolicy
from engine.kv_offload.loads import LoadJob, LoadState, TierHit

if TYPE_CHECKING:   # torch's modules and the manager's parts: the annotations only
    from engine.kv_blocks import Block
    from engine.kv_events import KVEventRecorder
    from engine.kv_offload.disk import DiskTier
    from engine.kv_offload.transfer import KVTransfer, TransferWorker
    from engine.sequence import Sequence


class BlockPool(Protocol):
    """What the tiers use of the KV cache manager (engine/kv_cache_manager.py), which
    imports this package: a protocol here keeps the import one way."""
    blocks: list[Block]
    events: KVEventRecorder | None

    def end_load(self, block_id: int, register: bool) -> None: ...

# load latency histogram edges, seconds
LOAD_SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25,
                        0.5, 1.0, 2.5, 5.0)


@dataclass
class TierStats:
    blocks_stored: dict[str, int] = field(default_factory=lambda: {Medium.CPU: 0, Medium.DISK: 0})
    blocks_loaded: dict[str, int] = field(default_factory=lambda: {Medium.CPU: 0, Medium.DISK: 0})
    stores_dropped: int = 0  # the worker's queue was full
    loads_cancelled: int = 0  # blocks whose request was gone before its load was done
    loads_failed: int = 0  # blocks recomputed: their read failed (or one before them did)
    load_seconds_sum: float = 0.0
    # seconds the copies took, by the tier stored to / loaded from (the transfer types of
    # vllm:kv_offload_total_time): a host store, the step thread's snapshot of the blocks
    # (the worker's cut into one tensor per block runs off the step); a disk store, the
    # worker's file writes; a load, the load worker's copies into the pool (shared among
    # the job's blocks by their tier) and, from disk, its file reads
    seconds_stored: dict[str, float] = field(
        default_factory=lambda: {Medium.CPU: 0.0, Medium.DISK: 0.0})
    seconds_loaded: dict[str, float] = field(
        default_factory=lambda: {Medium.CPU: 0.0, Medium.DISK: 0.0})
    load_buckets: list[int] = field(default_factory=lambda: [0] * (len(LOAD_SECONDS_BUCKETS) + 1))

    def observe_load(self, seconds: float) -> None:
        self.load_seconds_sum += seconds
        self.load_buckets[bisect.bisect_left(LOAD_SECONDS_BUCKETS, seconds)] += 1


class OffloadTiers:
    def __init__(self, host: HostPolicy, transfer: KVTransfer, worker: TransferWorker,
                 disk: DiskTier | None = None, load_worker: TransferWorker | None = None,
                 done: Any = None) -> None:
        self.host, self.io, self.worker, self.disk = host, transfer, worker, disk
        self.load_worker = load_worker  # its own thread: loads never queue behind disk writes
        self.block_bytes = host.block_bytes
        self.kv: BlockPool | None = None  # set by KVCacheManager.attach_offload
        self._stores: list[tuple[int, bytes]] = []  # (device block, hash) evicted this step
        self._planned: list[LoadJob] = []  # loads admitted this step, started by transfer
        self._lock = threading.Lock()  # a job's state: the engine thread vs the load worker
        # posted by the load worker (`put`), taken by the engine (`get`, `get_nowait`); the
        # simulator's holds a job back until its copy's virtual time has passed
        self._done: queue.SimpleQueue[LoadJob] = queue.SimpleQueue() if done is None else done
        self._taken: list[LoadJob] = []  # taken off _done by wait_for_load, not yet polled
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
            return TierHit(block_hash, entry, Medium.CPU) if entry.loadable else None
        if self.disk is None or not self.disk.has(block_hash):
            return None
        return TierHit(block_hash, HostEntry(block_hash), Medium.DISK)  # read by the load

    # ---- loads (scheduler, then the step, then the load worker) ------------------------------
    def can_plan_load(self) -> bool:
        """Room in the load worker's bounded queue for one more job this step."""
        return self.load_worker.free_slots() > len(self._planned)

    def plan_load(self, seq: Sequence, loads: list[tuple[TierHit, int]], positions: list[int]
                  ) -> LoadJob:
        job = LoadJob(seq, loads, positions)
        self._planned.append(job)
        return job

    def planned_loads(self) -> list[tuple[TierHit, int]]:
        """(hit, device block) of the loads admitted this step, not yet started."""
        return [pair for job in self._planned for pair in job.loads]

    def cancel_load(self, job: LoadJob) -> None:
        """The request is gone (aborted, preempted): a job the worker has not begun gives
        its blocks back now and is skipped; a running one keeps them until it is done."""
        with self._lock:
            if job.state in (LoadState.PLANNED, LoadState.QUEUED):
                if job.state is LoadState.PLANNED:
                    self._planned.remove(job)
                job.state = LoadState.CANCELLED
            else:
                job.cancelled = True
                return
        self._end(job, kept=0)
        self.stats.loads_cancelled += len(job.loads)

    def _start_loads(self) -> None:
        planned, self._planned = self._planned, []
        for job in planned:
            job.state = LoadState.QUEUED
            if not self.load_worker.submit(lambda job=job: self._run_load(job)):
                job.state = LoadState.DONE  # no room after all: the request recomputes
                self._done.put(job)

    def _run_load(self, job: LoadJob) -> None:
        """Load worker: read the blocks (disk files checked), copy them into the pool."""
        with self._lock:
            if job.state is LoadState.CANCELLED:
                return
            job.state = LoadState.RUNNING
        start = time.perf_counter()
        try:
            for hit, _ in job.loads:
                if hit.medium == Medium.CPU:
                    data = hit.entry.data
                else:
                    read = time.perf_counter()
                    data = self.disk.read(hit.block_hash)
                    job.read_seconds += time.perf_counter() - read
                if data is None:
                    break  # a bad file: this block and the ones after it are recomputed
                job.read.append(data)
            if job.read:
                copy = time.perf_counter()
                self.io.load(job.read, job.block_ids[:len(job.read)])
                job.copy_seconds = time.perf_counter() - copy
            job.num_loaded = len(job.read)
        finally:
            job.seconds = time.perf_counter() - start
            with self._lock:
                job.state = LoadState.DONE
            self._done.put(job)

    def wait_for_load(self, timeout: float) -> bool:
        """Blocks until a load is done (or timeout): for a step with nothing else to do."""
        try:
            self._taken.append(self._done.get(timeout=timeout))
            return True
        except queue.Empty:
            return False

    def poll(self) -> list[LoadJob]:
        """The loads done since the last poll, without waiting; their blocks are in the
        prefix cache now. Returns the jobs whose request still waits for them."""
        jobs, self._taken = self._taken, []
        while True:
            try:
                jobs.append(self._done.get_nowait())
            except queue.Empty:
                break
        wanted = []
        for job in jobs:
            if job.cancelled:  # its request went while it ran: discarded
                self._end(job, kept=0)
                self.stats.loads_cancelled += len(job.loads)
                continue
            self._end(job, kept=job.num_loaded)
            self.stats.observe_load(job.seconds)
            self.stats.loads_failed += len(job.loads) - job.num_loaded
            self.stats.seconds_loaded[Medium.DISK] += job.read_seconds
            for (hit, _), data in zip(job.loads, job.read):
                self.stats.blocks_loaded[hit.medium] += 1
                self.stats.seconds_loaded[hit.medium] += job.copy_seconds / len(job.read)
                if hit.medium == Medium.DISK and hit.block_hash not in self.host:
                    hit.entry.data, hit.entry.on_disk = data, True  # promoted to host memory
                    hit.entry.ready.set()
                    self._spill(self._insert(hit.entry))
            wanted.append(job)
        return wanted

    def _end(self, job: LoadJob, kept: int) -> None:
        for i, block_id in enumerate(job.block_ids):
            self.kv.end_load(block_id, register=i < kept)

    # ---- the step's transfers (engine, before the forward) -------------------------------------
    def transfer(self, batch: Any) -> None:
        """The evicted blocks snapshotted and queued for the host tier, then this step's
        loads started (after the snapshot: a load may overwrite a block just evicted)."""
        if batch.blocks_to_store:
            self._store(batch.blocks_to_store)
        if self._planned:
            self._start_loads()

    def _store(self, stores: list[tuple[int, bytes]]) -> None:
        stores = [(b, h) for b, h in stores if h not in self.host]
        if not stores:
            return
        start = time.perf_counter()
        snapshot = self.io.gather([b for b, _ in stores])
        if self.host.max_entries:   # else they only pass through, to disk (as _fill counts)
            self.stats.seconds_stored[Medium.CPU] += time.perf_counter() - start
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
            self.stats.blocks_stored[Medium.CPU] += len(entries)

    def _insert(self, entry: HostEntry) -> list[HostEntry]:
        """Into the host tier; returns what it evicted (entry itself when it holds none)."""
        events = self.kv.events if self.kv is not None else None
        evicted = self.host.insert(entry)
        if events is not None:
            if entry not in evicted:
                events.copied(entry.block_hash, Medium.CPU)
            for old in evicted:
                if old is not entry:
                    events.removed(old.block_hash, Medium.CPU)
        return evicted

    def _spill(self, entries: list[HostEntry]) -> None:
        """Host evictions go to disk: one worker job, after the ones filling them. A block
        whose file is there already (read from disk before, by this engine or another on
        the directory) is not written again: the key is its content, and reading it
        refreshed its place in the disk tier's LRU."""
        if self.disk is not None:
            entries = [e for e in entries if not self.disk.has(e.block_hash)]
        if self.disk is None or not entries:
            return
        if not self.worker.submit(lambda: self._write(entries)):
            self.stats.stores_dropped += len(entries)
        elif self.kv is not None and self.kv.events is not None:
            for entry in entries:
                self.kv.events.copied(entry.block_hash, Medium.DISK)

    def _write(self, entries: list[HostEntry]) -> None:
        start = time.perf_counter()
        for entry in entries:
            if entry.data is not None and self.disk.write(entry.block_hash, entry.data):
                entry.on_disk = True
                self.stats.blocks_stored[Medium.DISK] += 1
        self.stats.seconds_stored[Medium.DISK] += time.perf_counter() - start

    # ---- upkeep --------------------------------------------------------------------------------
    def drain(self) -> None:
        """Waits for every queued copy, disk write and load (tests, benchmarks, shutdown);
        the next step polls the loads."""
        self.worker.drain()
        if self.load_worker is not None:
            self.load_worker.drain()

    def close(self) -> None:
        self.worker.close()
        if self.load_worker is not None:
            self.load_worker.close()

    def check_invariants(self, kv: BlockPool) -> None:
        self.host.check_invariants()
        for block_id, block_hash in self._stores:
            assert kv.blocks[block_id].block_hash != block_hash, \
                f"block {block_id} is queued for the host tier but still cached as itself"

    def usage(self) -> dict[str, tuple[int, int]]:
        """(bytes used, capacity) per tier."""
        out = {Medium.CPU: (self.host.used_bytes, self.host.capacity_bytes)}
        if self.disk is not None:
            out[Medium.DISK] = (self.disk.usage_bytes, self.disk.capacity_bytes)
        return out

