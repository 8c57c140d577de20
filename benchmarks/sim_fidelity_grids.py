"""The settings bench_sim_fidelity compares, simulated against real: the grids, how a
setting that is no tuner setting (a pool in blocks, a disk tier) reaches each side, and
how real runs of the same grid agree with each other."""
from __future__ import annotations

import dataclasses
import statistics
from pathlib import Path

from scipy.stats import kendalltau

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


def rel(sim: float | None, real: float | None) -> float | None:
    if sim is None or real is None or real == 0:
        return None
    return abs(sim - real) / real


def real_agreement(rows: list[dict], others: list[dict], labels: list[str]) -> str:
    """The real runs' Kendall tau between each pair (this run first, then --real-also's),
    and each profile's tau and median capacity error against their geometric mean."""
    reals = [[r["real_cap"] for r in rows]] + [
        [r["real_cap"] for r in o["rows"][:len(rows)]] for o in others]
    lines = ["\nthe real runs against each other (capacity over the same settings):"]
    for i in range(len(reals)):
        for j in range(i + 1, len(reals)):
            apart = statistics.median(rel(a, b) for a, b in zip(reals[i], reals[j]))
            lines.append(f"  run {i} vs run {j}: Kendall tau "
                         f"{kendalltau(reals[i], reals[j]).statistic:.2f}, median "
                         f"difference {apart:.1%}")
    mean = [statistics.geometric_mean(c) for c in zip(*reals)]
    for label in labels:
        sim = [r[f"{label}_cap"] or 0.0 for r in rows]
        err = statistics.median(rel(a, b) for a, b in zip(sim, mean))
        lines.append(f"  {label} against their geometric mean: Kendall tau "
                     f"{kendalltau(sim, mean).statistic:.2f}, capacity error {err:.1%}")
    return "\n".join(lines)


def latency_window(duration: float, rate: float, requests: int) -> float:
    """Seconds of the latencies' window at `rate`: `duration`, or long enough for
    `requests` arrivals on average where that is longer (SmolLM2's summarize, 2026-12-08:
    20 s at 0.43 req/s drew five arrivals, three finished; its p90 was their maximum)."""
    if rate <= 0:
        raise ValueError(f"the latencies' rate must be above 0, got {rate}")
    return max(duration, requests / rate)


def hit_rate_lines(rows: list[dict], label: str) -> list[str]:
    """Per tier, profile `label`'s simulated hit rates against the real ones over the rows
    that have both: the median difference in points (a rate's relative error would blow up
    near 0), and each pair."""
    lines = []
    for fig in HIT_RATES:
        pairs = [(r[f"{label}_{fig}"], r[f"real_{fig}"]) for r in rows
                 if r.get(f"{label}_{fig}") is not None and r.get(f"real_{fig}") is not None]
        if pairs:
            gap = statistics.median(abs(sim - real) for sim, real in pairs)
            lines.append(f"{fig}: median |simulated - real| {gap:.3f} over {len(pairs)} "
                         "settings (simulated / real: "
                         + ", ".join(f"{sim:.2f}/{real:.2f}" for sim, real in pairs) + ")")
    return lines
