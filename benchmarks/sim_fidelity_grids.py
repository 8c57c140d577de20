"""The settings bench_sim_fidelity compares, simulated against real: the grids, and how a
setting that is no tuner setting (a pool in blocks, a disk tier) reaches each side."""
from __future__ import annotations

import dataclasses
from pathlib import Path

# spread over the space: batch limit, page size, token budget, memory fraction
GRID = [{"max_num_seqs": s, "block_size": b, "max_num_batched_tokens": t,
         "gpu_memory_utilization": g}
        for s, b, t, g in [(1, 16, 2048, 0.9), (2, 32, 512, 0.9), (4, 16, 1024, 0.7),
                           (8, 64, 2048, 0.9), (16, 16, 256, 0.9), (32, 8, 2048, 0.6),
                           (64, 128, 1024, 0.9), (256, 16, 2048, 0.9), (3, 64, 256, 0.8),
                           (12, 32, 1536, 0.9), (24, 16, 512, 0.5), (48, 32, 2048, 0.95),
                           (6, 8, 768, 0.9), (128, 64, 384, 0.9)]]
# the engine's defaults, as the grid writes them (the capacity sweep's pilot measures them)
DEFAULTS = {"max_num_seqs": 256, "block_size": 16, "max_num_batched_tokens": 2048,
            "gpu_memory_utilization": 0.9}
# the host KV tier (tuner/sim/tiers.py): device pools too small for the workload's working
# set (blocks set, so both sides have the same pool), each without and with host tiers of
# three sizes (the embedded model's 16-token block is 64 KiB: 0.02 GiB holds 327 of them)
TIER_GRID = [{"num_gpu_blocks_override": b, "kv_offloading_size": t}
             for b in (200, 400) for t in (0, 0.02, 0.1, 1.0)]
# the disk tier under a small host tier (0.02 GiB), without and with 0.1 and 1 GiB of disk;
# the real side writes a fresh directory per engine (real_launch)
DISK_GRID = [{"num_gpu_blocks_override": b, "kv_offloading_size": 0.02,
              **({"kv_disk_size": d} if d else {})} for b in (200, 400) for d in (0, 0.1, 1.0)]
GRIDS = {"spread": GRID, "tiers": TIER_GRID, "disk": DISK_GRID}
# of the prompt tokens looked up at the fixed rate, those found cached, and by which tier
HIT_RATES = ("prefix_cache_hit_rate", "host_tier_hit_rate", "disk_tier_hit_rate")


def on_disk(settings: dict, directory: str | Path) -> dict:
    """A setting with a disk tier (kv_disk_size) given its directory; others unchanged."""
    if "kv_disk_size" not in settings:
        return settings
    return {**settings, "kv_disk_dir": str(directory)}


def real_launch(launch, settings: dict, disk_dir: Path):
    """(launch, settings) of a real engine: the settings no tuner setting names (a pool
    in blocks, a disk tier in `disk_dir`) as the engine's flags."""
    flags: tuple[str, ...] = ()
    if settings.get("num_gpu_blocks_override") is not None:
        flags += ("--num-gpu-blocks-override", str(settings["num_gpu_blocks_override"]))
    if "kv_disk_size" in settings:
        flags += ("--kv-disk-dir", str(disk_dir),
                  "--kv-disk-size", str(settings["kv_disk_size"]))
    rest = {k: v for k, v in settings.items()
            if k not in ("num_gpu_blocks_override", "kv_disk_size")}
    return dataclasses.replace(launch, extra_flags=launch.extra_flags + flags), rest
