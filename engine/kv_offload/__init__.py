"""KV tiers under the device pool: host memory (`kv_offloading_size`) and a disk directory
shared by the engines of a node (`kv_disk_dir`, `kv_disk_size`). tiers.py says how blocks
move; host.py, disk.py and transfer.py are the parts."""
from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from engine.kv_offload.arc import ArcHostTier
from engine.kv_offload.host import HostEntry, HostTier
from engine.kv_offload.tiers import OffloadTiers, TierHit, TierStats

__all__ = ["ArcHostTier", "HostEntry", "HostTier", "OffloadTiers",
           "TierHit", "TierStats", "make_offload"]

GIB = 2**30
LOAD_QUEUE_JOBS = 64  # requests whose loads may wait for the load worker at once
MODEL_IDS_DIR = ".model-ids"  # in kv_disk_dir: the weight files' content digests


def make_offload(config: Any, runner: Any, kv: Any, model_path: str) -> OffloadTiers | None:
    """The tiers the config asks for, attached to the KV cache manager `kv` and reading and
    writing the runner's pool; None when both are off (or prefix caching is)."""
    host_gib = config.kv_offloading_size or 0.0
    if host_gib == 0 and config.kv_disk_dir is None:
        return None
    if not config.enable_prefix_caching:
        logging.getLogger("engine.kv_offload").warning(
            "the KV tiers (kv_offloading_size, kv_disk_dir) are off: they need prefix caching")
        return None
    from engine.kv_offload.disk import DiskTier, namespace_digest
    from engine.kv_offload.transfer import TransferWorker, make_transfer

    transfer = make_transfer(runner.kv_pool)
    disk = None
    if config.kv_disk_dir is not None:
        dtype = str(runner.dtype).removeprefix("torch.")
        disk = DiskTier(config.kv_disk_dir, int(config.kv_disk_size * GIB),
                        namespace=namespace_digest(
                            model_path=model_path, dtype=dtype, block_shape=transfer.block_shape,
                            cache_dir=Path(config.kv_disk_dir) / MODEL_IDS_DIR),
                        block_shape=transfer.block_shape, dtype=runner.dtype)
    index = ArcHostTier if config.kv_offloading_eviction_policy == "arc" else HostTier
    tiers = OffloadTiers(index(int(host_gib * GIB), transfer.block_bytes), transfer,
                         TransferWorker(), disk,
                         load_worker=TransferWorker(LOAD_QUEUE_JOBS, name="kv-load"))
    kv.attach_offload(tiers)
    return tiers
