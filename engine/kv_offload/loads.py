"""Loads from the tiers below into the device pool, off the step's critical path.

One job per admitted request (no torch here: the transfer and the disk tier do the copies):

  planned   the scheduler admitted the request with its tier hits in fresh device blocks
            (KVCacheManager.admit_loading); the job holds a reference on each of them, so
            they stay out of the pool until the worker is done with them, whatever the
            request does meanwhile
  queued    started by OffloadTiers.transfer once the step's stores are snapshotted (a
            block the admission evicted is copied out before the worker overwrites it)
  running   the load worker reads each block (the host copy, or the disk file, checked)
            and copies them into their device blocks, in order, up to the first that fails
  done      posted on the completion queue; the engine thread takes it at the start of a
            step without waiting (OffloadTiers.poll): the loaded blocks enter the prefix
            cache, the job's references go, and the request computes the rest

Until then the request waits (Scheduler.loading) and no step reads those blocks: they are
in no running sequence's block table and not in the prefix cache. Cancelled (the request
aborted or preempted): a planned or queued job gives its blocks back at once and the
worker skips it; a running one keeps them until it is done, and its result is discarded.
"""
from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import TYPE_CHECKING

from engine.kv_medium import Medium
from engine.kv_offload.host import HostEntry

if TYPE_CHECKING:
    import torch

    from engine.sequence import Sequence


@dataclass(eq=False)
class TierHit:
    """A prefix block found below the device pool; `medium`: where (CPU or Disk)."""
    block_hash: bytes
    entry: HostEntry
    medium: Medium


class LoadState(enum.Enum):
    PLANNED = "planned"
    QUEUED = "queued"
    RUNNING = "running"
    DONE = "done"
    CANCELLED = "cancelled"


class LoadJob:
    """`loads`: (TierHit, device block) in block-table order; `positions`: each one's index
    in the request's block table (device hits sit between them)."""

    def __init__(self, seq: Sequence, loads: list[tuple[TierHit, int]],
                 positions: list[int]) -> None:
        self.seq = seq
        self.loads = loads
        self.positions = positions
        self.state = LoadState.PLANNED  # under OffloadTiers._lock once queued
        self.cancelled = False  # the request went while the worker ran the job
        self.num_loaded = 0  # leading blocks now in the pool (worker, before DONE)
        # the blocks read (disk hits are promoted to host with them)
        self.read: list[torch.Tensor] = []
        self.seconds = 0.0
        self.read_seconds = 0.0  # of `seconds`: reading disk files
        self.copy_seconds = 0.0  # of `seconds`: copying the blocks read into the pool

    @property
    def block_ids(self) -> list[int]:
        return [b for _, b in self.loads]

    def kept_blocks(self) -> int:
        """How many of the request's block-table entries hold its KV once the job is done:
        all when every load succeeded, else those before the first failed one."""
        if self.num_loaded == len(self.loads):
            return len(self.seq.block_table)
        return self.positions[self.num_loaded]
