"""The KV tiers in virtual time: the engine's own tiers (engine/kv_offload/tiers.py: what is
stored, the LRU, lookups, loads planned and polled by the scheduler, spills to disk) with the
parts that move bytes replaced, as the model runner is (`ProfiledRunner.offload_io`).

- A store's snapshot (the pool's evicted blocks gathered on the step thread, before the
  forward) moves the clock by its bytes at the profile's `store_seconds_per_byte`; the
  store worker fills the host entries at once (they hold a marker, not KV).
- A load runs when the step starts it and is done after its blocks' time: a host block's
  bytes at `load_seconds_per_byte`, a disk block's file bytes at
  `disk_load_seconds_per_byte` (the read and the copy into the pool). `VirtualDone` holds
  the finished job back until the clock has passed that time, so the scheduler polls it at
  the first step that starts after it; a step with nothing else to run waits for it (the
  engine's `wait_for_load`) by moving the clock.
- The disk tier (`kv_disk_dir`, `kv_disk_size`) is a `VirtualDisk`: the directory as this
  replica alone fills it, from empty (engines sharing a node's directory are not
  simulated), its bound evicting the least recently written or read file as the real
  one's does; its writes run on the store worker, off the steps, and take no step time.

The rates are timed on this machine (`time_copies`: the engine's own transfer on its pool,
and its DiskTier on a temporary directory) by the calibration; a profile without them
moves blocks in no time.
"""
from __future__ import annotations

import heapq
import itertools
import queue
import statistics
import tempfile
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from engine.kv_medium import Medium
from engine.kv_offload import LOAD_QUEUE_JOBS, OffloadIO

HELD = "held in host memory"   # a host entry's data: the simulator keeps no KV


class VirtualTransfer:
    """KVTransfer's interface over no tensors; a snapshot costs the step its copy time."""

    def __init__(self, clock, block_bytes: int, store_seconds_per_byte: float) -> None:
        self.clock, self.block_bytes = clock, block_bytes
        self.store_seconds_per_byte = store_seconds_per_byte
        self.block_shape = (block_bytes,)
        self.stored = self.loaded = 0   # blocks

    def gather(self, block_ids: Sequence[int]) -> int:
        self.clock.now += len(block_ids) * self.block_bytes * self.store_seconds_per_byte
        self.stored += len(block_ids)
        return len(block_ids)

    def split(self, snapshot: int) -> list[str]:
        return [HELD] * snapshot

    def load(self, blocks: Sequence, block_ids: Sequence[int]) -> None:
        self.loaded += len(block_ids)


class InlineWorker:
    """TransferWorker's interface: a job runs when submitted (its time is the clock's
    business: VirtualTransfer, VirtualDone)."""

    def __init__(self, max_jobs: int = 256) -> None:
        self.max_jobs = max_jobs
        self.failures = 0

    def submit(self, job: Callable[[], None]) -> bool:
        job()
        return True

    def free_slots(self) -> int:
        return self.max_jobs

    def drain(self) -> None:
        pass

    def close(self) -> None:
        pass


class VirtualDone:
    """The queue a load worker posts finished jobs to (OffloadTiers' `done`): a job is
    taken only once the clock has passed its copy's end (posted time + each loaded block's
    time: a host block's bytes at `load_seconds_per_byte`, a disk block's
    `disk_seconds_per_block`)."""

    def __init__(self, clock, block_bytes: int, load_seconds_per_byte: float,
                 disk_seconds_per_block: float = 0.0) -> None:
        self.clock, self.block_bytes = clock, block_bytes
        self.load_seconds_per_byte = load_seconds_per_byte
        self.disk_seconds_per_block = disk_seconds_per_block
        self._heap: list = []   # (due, order, job)
        self._order = itertools.count()

    def put(self, job) -> None:
        host = self.block_bytes * self.load_seconds_per_byte
        job.seconds = sum(self.disk_seconds_per_block if hit.medium == Medium.DISK else host
                          for hit, _ in job.loads[:len(job.read)])
        heapq.heappush(self._heap, (self.clock.now + job.seconds, next(self._order), job))

    def get_nowait(self):
        if self._heap and self._heap[0][0] <= self.clock.now:
            return heapq.heappop(self._heap)[2]
        raise queue.Empty

    def get(self, timeout: float):
        """The engine waits for a load with nothing else to run: the clock moves to the
        first copy's end, or by `timeout` when none ends within it."""
        if self._heap and self._heap[0][0] <= self.clock.now + timeout:
            self.clock.now = max(self.clock.now, self._heap[0][0])
            return heapq.heappop(self._heap)[2]
        self.clock.now += timeout
        raise queue.Empty

    def __len__(self) -> int:
        return len(self._heap)


class VirtualDisk:
    """DiskTier's interface (engine/kv_offload/disk.py) over no files: the directory as one
    replica fills it, from empty. A file is the block's bytes and the real header; past the
    bound the least recently written or read files go, down to the real tier's
    trim_target (the real tier removes the oldest mtime, which a read refreshes)."""

    def __init__(self, capacity_bytes: int, block_bytes: int) -> None:
        from engine.kv_offload.disk import HEADER, trim_target

        self.capacity_bytes = capacity_bytes
        self.file_bytes = HEADER.size + block_bytes
        self.target = trim_target(capacity_bytes, self.file_bytes)
        self._files: OrderedDict[bytes, None] = OrderedDict()   # oldest first
        self.usage_bytes = 0
        self.write_failures = self.writes_skipped = self.files_evicted = 0
        self.bad_files = {"truncated": 0, "corrupt": 0, "foreign": 0}

    def has(self, block_hash: bytes) -> bool:
        return block_hash in self._files

    def write(self, block_hash: bytes, block) -> bool:
        if self.file_bytes > self.capacity_bytes:
            self.writes_skipped += 1
            return False
        self._files[block_hash] = None
        self._files.move_to_end(block_hash)
        if len(self._files) * self.file_bytes > self.capacity_bytes:   # down to the target
            while len(self._files) * self.file_bytes > self.target:
                self._files.popitem(last=False)
                self.files_evicted += 1
        self.usage_bytes = len(self._files) * self.file_bytes
        return True

    def read(self, block_hash: bytes):
        if block_hash not in self._files:
            return None
        self._files.move_to_end(block_hash)
        return HELD


def virtual_io(clock, block_bytes: int, *, store_seconds_per_byte: float | None,
               load_seconds_per_byte: float | None,
               disk_load_seconds_per_byte: float | None = None) -> OffloadIO:
    from engine.kv_offload.disk import HEADER

    disk_block = (HEADER.size + block_bytes) * (disk_load_seconds_per_byte or 0.0)
    return OffloadIO(VirtualTransfer(clock, block_bytes, store_seconds_per_byte or 0.0),
                     InlineWorker(), InlineWorker(LOAD_QUEUE_JOBS),
                     VirtualDone(clock, block_bytes, load_seconds_per_byte or 0.0, disk_block),
                     make_disk=lambda _directory, capacity: VirtualDisk(capacity, block_bytes))


def time_copies(block_bytes: int, *, blocks: int = 8, repeats: int = 7,
                pool=None) -> tuple[float, float, float]:
    """(store, load, disk load) seconds per byte of the engine's own block copies on this
    machine: the median of `repeats` timings of `blocks` blocks gathered out of the pool
    (the step thread's part of a store), loaded back into it, and read from the engine's
    DiskTier files (on a temporary directory) and loaded, per file byte. `pool`: the
    engine's own (the calibration's); else one of `block_bytes` per block in float32."""
    import torch

    from engine.kv_offload.disk import DiskTier
    from engine.kv_offload.transfer import make_transfer

    if pool is None:
        per_block = max(1, block_bytes // 8)   # [2, 1, n, per_block] float32 = block_bytes
        pool = torch.zeros(2, 1, 2 * blocks, per_block, 1, 1)
    transfer = make_transfer(pool)   # a GPU pool's: to pinned host memory and back
    sync = torch.cuda.synchronize if pool.device.type == "cuda" else (lambda: None)
    blocks = min(blocks, pool.shape[2])
    ids = list(range(blocks))
    keys = [i.to_bytes(16, "little") for i in ids]
    stores, loads, disk_loads = [], [], []
    with tempfile.TemporaryDirectory(prefix="kv-disk-timing-") as root:
        disk = DiskTier(root, 1 << 40, namespace=bytes(32), block_shape=transfer.block_shape,
                        dtype=pool.dtype)
        for _ in range(repeats):
            start = time.perf_counter()
            snapshot = transfer.gather(ids)
            sync()
            stores.append(time.perf_counter() - start)
            parts = transfer.split(snapshot)
            start = time.perf_counter()
            transfer.load(parts, ids)
            loads.append(time.perf_counter() - start)
            for key, part in zip(keys, parts):
                disk.write(key, part)
            start = time.perf_counter()
            transfer.load([disk.read(key) for key in keys], ids)
            disk_loads.append(time.perf_counter() - start)
    moved = blocks * transfer.block_bytes
    return (statistics.median(stores) / moved, statistics.median(loads) / moved,
            statistics.median(disk_loads) / (blocks * disk.file_bytes))
