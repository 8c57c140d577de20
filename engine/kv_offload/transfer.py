"""Moving blocks between the device pool and host memory, and the worker thread.

One interface, two implementations:
- `CPUTransfer`: the pool is in host memory already; `gather` is one index copy on the
  step thread, the store worker cuts it into one tensor per block; `load`, on the load
  worker, copies host blocks into their pool blocks while the step thread runs other
  requests' steps (the blocks are the load's alone until it returns).
- `CUDATransfer`: `gather` indexes the pool on a side stream into a device buffer (the
  compute stream waits only for that), then copies it to pinned host memory without
  blocking; the store worker waits for that copy's event. `load`, on the load worker,
  stages the blocks in pinned memory and copies them host -> device and into the pool on
  a second side stream (after the work already queued on the compute and store streams,
  which may still read or write those blocks), then waits for its event: once it
  returns, the blocks are written, and any later step sees them.

The pool is `[2, num_layers, num_blocks, block_size, kv_heads, head_dim]`
(model_runner.allocate_kv_cache); a block's copy is `[2, num_layers, block_size, kv_heads,
head_dim]`, contiguous.

`TransferWorker` runs jobs in order on one thread behind a bounded queue: the step thread
never waits for it (a full queue refuses the job: the caller counts a dropped store, or the
scheduler recomputes instead of loading). Stores and loads have one worker each.
"""
from __future__ import annotations

import logging
import queue
import threading
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any

import torch

logger = logging.getLogger("engine.kv_offload")


class KVTransfer(ABC):
    def __init__(self, pool: torch.Tensor) -> None:
        self.pool = pool
        self.block_shape = (pool.shape[0], pool.shape[1], *pool.shape[3:])
        self.block_bytes = pool[:, :, 0].numel() * pool.element_size()

    @abstractmethod
    def gather(self, block_ids: Sequence[int]) -> Any:
        """Step thread, before any of the step's writes: a snapshot of these blocks."""

    @abstractmethod
    def split(self, snapshot: Any) -> list[torch.Tensor]:
        """Worker thread: the snapshot as one host tensor per block."""

    @abstractmethod
    def load(self, blocks: Sequence[torch.Tensor], block_ids: Sequence[int]) -> None:
        """Load worker: host copies into these device blocks; returns once written."""


class CPUTransfer(KVTransfer):
    def gather(self, block_ids: Sequence[int]) -> torch.Tensor:
        idx = torch.tensor(block_ids, dtype=torch.int64)
        return self.pool.index_select(2, idx)  # a copy: [2, L, n, bs, H, D]

    def split(self, snapshot: torch.Tensor) -> list[torch.Tensor]:
        # own storage per block, so evicting one frees its memory
        return [snapshot[:, :, i].contiguous() for i in range(snapshot.shape[2])]

    def load(self, blocks: Sequence[torch.Tensor], block_ids: Sequence[int]) -> None:
        idx = torch.tensor(block_ids, dtype=torch.int64)
        self.pool.index_copy_(2, idx, torch.stack(list(blocks), dim=2))


class CUDATransfer(KVTransfer):
    """Side stream + pinned host memory (written for a GPU; importable without one)."""

    def __init__(self, pool: torch.Tensor) -> None:
        super().__init__(pool)
        self.stream = torch.cuda.Stream(device=pool.device)  # stores
        self.load_stream = torch.cuda.Stream(device=pool.device)
        self.compute = torch.cuda.current_stream(pool.device)  # the engine thread's

    def gather(self, block_ids: Sequence[int]) -> tuple[torch.Tensor, Any]:
        compute = torch.cuda.current_stream(self.pool.device)
        idx = torch.tensor(block_ids, dtype=torch.int64, device=self.pool.device)
        with torch.cuda.stream(self.stream):
            self.stream.wait_stream(compute)  # the pool as the steps so far left it
            idx.record_stream(self.stream)  # made on the compute stream, read on this one
            # [n, 2, L, bs, H, D]: each block contiguous, on the device
            staged = self.pool.index_select(2, idx).permute(2, 0, 1, 3, 4, 5).contiguous()
            gathered = torch.cuda.Event()
            gathered.record(self.stream)
            host = torch.empty(staged.shape, dtype=staged.dtype, pin_memory=True)
            host.copy_(staged, non_blocking=True)
            copied = torch.cuda.Event()
            copied.record(self.stream)
            staged.record_stream(self.stream)
        compute.wait_event(gathered)  # the step may overwrite the blocks once gathered
        return host, copied

    def split(self, snapshot: tuple[torch.Tensor, Any]) -> list[torch.Tensor]:
        host, copied = snapshot
        copied.synchronize()
        return list(host.unbind(0))  # views of one pinned buffer

    def load(self, blocks: Sequence[torch.Tensor], block_ids: Sequence[int]) -> None:
        staging = torch.empty((len(blocks), *self.block_shape), dtype=self.pool.dtype,
                              pin_memory=True)
        torch.stack(list(blocks), dim=0, out=staging)
        idx = torch.tensor(block_ids, dtype=torch.int64).pin_memory()
        with torch.cuda.stream(self.load_stream):
            self.load_stream.wait_stream(self.compute)  # earlier steps' writes to the blocks
            self.load_stream.wait_stream(self.stream)  # the store snapshots of evicted ones
            on_device = staging.to(self.pool.device, non_blocking=True)
            idx_dev = idx.to(self.pool.device, non_blocking=True)
            self.pool.index_copy_(2, idx_dev, on_device.permute(1, 2, 0, 3, 4, 5))
            loaded = torch.cuda.Event()
            loaded.record(self.load_stream)
        loaded.synchronize()  # the staging buffers may go, the blocks are written


def make_transfer(pool: torch.Tensor) -> KVTransfer:
    return CUDATransfer(pool) if pool.device.type == "cuda" else CPUTransfer(pool)


class TransferWorker:
    """One thread running jobs in submission order; the queue holds `max_jobs` at most."""

    def __init__(self, max_jobs: int = 256, name: str = "kv-offload") -> None:
        self._queue: queue.Queue[Callable[[], None] | None] = queue.Queue(maxsize=max_jobs)
        self.failures = 0
        self._thread = threading.Thread(target=self._run, daemon=True, name=name)
        self._thread.start()

    def submit(self, job: Callable[[], None]) -> bool:
        """Queues job without waiting; False when the queue is full."""
        try:
            self._queue.put_nowait(job)
            return True
        except queue.Full:
            return False

    def free_slots(self) -> int:
        """Jobs that submit would accept now (at least: only the worker takes them off)."""
        return self._queue.maxsize - self._queue.qsize()

    def drain(self) -> None:
        """Waits until every job submitted so far has run (tests and benchmarks)."""
        self._queue.join()

    def close(self) -> None:
        self._queue.put(None)
        self._thread.join(timeout=10)

    def _run(self) -> None:
        while True:
            job = self._queue.get()
            try:
                if job is None:
                    return
                job()
            except Exception:  # noqa: BLE001 - one failed copy is a miss later, not a crash
                self.failures += 1
                logger.exception("a KV offload job failed")
            finally:
                self._queue.task_done()
