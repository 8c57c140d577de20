"""KV tiers under the device pool: host memory (`kv_offloading_size`) and a disk directory
shared by the engines of a node (`kv_disk_dir`, `kv_disk_size`). tiers.py says how blocks
move; host.py, disk.py and transfer.py are the parts."""
from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from engine.kv_offload.arc import ArcHostTier
from engine.kv_offload.host import HostEntry, HostTier
from engine.kv_offload.tiers import OffloadTiers, TierHit, TierStats

__all__ = ["ArcHostTier", "HostEntry", "HostTier", "OffloadIO", "OffloadTiers",
           "TierHit", "TierStats", "make_offload", "pool_io"]

GIB = 2**30
LOAD_QUEUE_JOBS = 64  # requests whose loads may wait for the load worker at once
MODEL_IDS_DIR = ".model-ids"  # in kv_disk_dir: the weight files' content digests


@dataclass
class OffloadIO:
    """How blocks move under the tiers and who moves them: a `KVTransfer` (transfer.py's
    interface), the store and load workers (`TransferWorker`'s), the queue the load
    worker posts finished jobs to (None: the tiers' own), and what makes the disk tier
    (`make_disk(kv_disk_dir, capacity_bytes)`; None: disk.py's `DiskTier` on that
    directory). The model runner supplies them (`runner.offload_io()`): its pool and two
    threads (`pool_io`), or the simulator's copies and disk in virtual time
    (tuner/sim/tiers.py), under the same tiers."""
    transfer: Any
    store_worker: Any
    load_worker: Any
    done: Any = None
    make_disk: Any = None


def pool_io(pool: Any) -> OffloadIO:
    """The real parts: copies of `pool`'s blocks (CPU or CUDA), each direction on its thread."""
    from engine.kv_offload.transfer import TransferWorker, make_transfer

    return OffloadIO(make_transfer(pool), TransferWorker(),
                     TransferWorker(LOAD_QUEUE_JOBS, name="kv-load"))


def make_offload(config: Any, runner: Any, kv: Any, model_path: str) -> OffloadTiers | None:
    """The tiers the config asks for, attached to the KV cache manager `kv`, their blocks
    moved by the runner's `offload_io()`; None when both are off (or prefix caching is)."""
    host_gib = config.kv_offloading_size or 0.0
    if host_gib == 0 and config.kv_disk_dir is None:
        return None
    if not config.enable_prefix_caching:
        logging.getLogger("engine.kv_offload").warning(
            "the KV tiers (kv_offloading_size, kv_disk_dir) are off: they need prefix caching")
        return None
    from engine.kv_offload.disk import DiskTier, namespace_digest

    io = runner.offload_io()
    transfer = io.transfer
    disk = None
    if config.kv_disk_dir is not None and io.make_disk is not None:
        disk = io.make_disk(config.kv_disk_dir, int(config.kv_disk_size * GIB))
    elif config.kv_disk_dir is not None:
        dtype = str(runner.dtype).removeprefix("torch.")
        disk = DiskTier(config.kv_disk_dir, int(config.kv_disk_size * GIB),
                        namespace=namespace_digest(
                            model_path=model_path, dtype=dtype, block_shape=transfer.block_shape,
                            cache_dir=Path(config.kv_disk_dir) / MODEL_IDS_DIR),
                        block_shape=transfer.block_shape, dtype=runner.dtype)
    index = ArcHostTier if config.kv_offloading_eviction_policy == "arc" else HostTier
    tiers = OffloadTiers(index(int(host_gib * GIB), transfer.block_bytes), transfer,
                         io.store_worker, disk, load_worker=io.load_worker, done=io.done)
    kv.attach_offload(tiers)
    return tiers
