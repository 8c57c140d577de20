"""The host KV tier in virtual time: the engine's own tiers (engine/kv_offload/tiers.py:
what is stored, the LRU, lookups, loads planned and polled by the scheduler) with the parts
that move bytes replaced, as the model runner is (`ProfiledRunner.offload_io`).

- A store's snapshot (the pool's evicted blocks gathered on the step thread, before the
  forward) moves the clock by its bytes at the profile's `store_seconds_per_byte`; the
  store worker fills the host entries at once (they hold a marker, not KV).
- A load runs when the step starts it and is done `load_seconds_per_byte` per byte later:
  `VirtualDone` holds the finished job back until the clock has passed that time, so the
  scheduler polls it at the first step that starts after it; a step with nothing else to
  run waits for it (the engine's `wait_for_load`) by moving the clock.

The two rates are timed on this machine's copies (`time_copies`: the engine's own
transfer on its pool) by the calibration; a profile without them moves blocks in no time.
"""
from __future__ import annotations

import heapq
import itertools
import queue
import statistics
import time
from collections.abc import Callable, Sequence

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
    taken only once the clock has passed its copy's end (posted time + its loaded bytes
    at `load_seconds_per_byte`)."""

    def __init__(self, clock, block_bytes: int, load_seconds_per_byte: float) -> None:
        self.clock, self.block_bytes = clock, block_bytes
        self.load_seconds_per_byte = load_seconds_per_byte
        self._heap: list = []   # (due, order, job)
        self._order = itertools.count()

    def put(self, job) -> None:
        job.seconds = len(job.read) * self.block_bytes * self.load_seconds_per_byte
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


def virtual_io(clock, block_bytes: int, *, store_seconds_per_byte: float | None,
               load_seconds_per_byte: float | None) -> OffloadIO:
    return OffloadIO(VirtualTransfer(clock, block_bytes, store_seconds_per_byte or 0.0),
                     InlineWorker(), InlineWorker(LOAD_QUEUE_JOBS),
                     VirtualDone(clock, block_bytes, load_seconds_per_byte or 0.0))


def time_copies(block_bytes: int, *, blocks: int = 8, repeats: int = 7,
                pool=None) -> tuple[float, float]:
    """(store, load) seconds per byte of the engine's own block copies on this machine: the
    median of `repeats` timings of `blocks` blocks gathered out of the pool (the step
    thread's part of a store) and loaded back into it. `pool`: the engine's own (the
    calibration's); else one of `block_bytes` per block in float32."""
    import torch

    from engine.kv_offload.transfer import make_transfer

    if pool is None:
        per_block = max(1, block_bytes // 8)   # [2, 1, n, per_block] float32 = block_bytes
        pool = torch.zeros(2, 1, 2 * blocks, per_block, 1, 1)
    transfer = make_transfer(pool)   # a GPU pool's: to pinned host memory and back
    sync = torch.cuda.synchronize if pool.device.type == "cuda" else (lambda: None)
    blocks = min(blocks, pool.shape[2])
    ids = list(range(blocks))
    stores, loads = [], []
    for _ in range(repeats):
        start = time.perf_counter()
        snapshot = transfer.gather(ids)
        sync()
        stores.append(time.perf_counter() - start)
        parts = transfer.split(snapshot)
        start = time.perf_counter()
        transfer.load(parts, ids)
        loads.append(time.perf_counter() - start)
    moved = blocks * transfer.block_bytes
    return statistics.median(stores) / moved, statistics.median(loads) / moved
