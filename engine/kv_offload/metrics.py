"""Prometheus families of the KV tiers, read from their counters at scrape time.

vLLM's names where vLLM has them (its offloading connector): `vllm:kv_offload_total_bytes`
and `vllm:kv_offload_total_time` (seconds) by `transfer_type` (`GPU_to_CPU`, `CPU_to_GPU`, ...),
`vllm:kv_offload_cpu_cache_usage_perc`; the rest in the same style (docs/engine.md).
"""
from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from engine.kv_medium import Medium
from engine.kv_offload.tiers import LOAD_SECONDS_BUCKETS, OffloadTiers


def collector(tiers: OffloadTiers, model_name: str) -> Any:
    """A collector to register on the server's registry."""
    from prometheus_client.core import (CounterMetricFamily, GaugeMetricFamily,
                                        HistogramMetricFamily)

    def family(cls, name: str, doc: str, labels: tuple[str, ...] = ()) -> Any:
        return cls(name, doc, labels=["model_name", *labels])

    class Collector:
        def collect(self) -> Iterable[Any]:
            stats, kv, disk = tiers.stats, tiers.kv, tiers.disk
            bb = tiers.block_bytes
            stored = family(CounterMetricFamily, "vllm:kv_offload_blocks_stored",
                            "KV blocks copied into a tier below the device pool.", ("medium",))
            loaded = family(CounterMetricFamily, "vllm:kv_offload_blocks_loaded",
                            "KV blocks loaded into the device pool from a tier below it, by "
                            "the tier they came from.", ("medium",))
            nbytes = family(CounterMetricFamily, "vllm:kv_offload_total_bytes",
                            "Bytes moved between the KV tiers.", ("transfer_type",))
            disk_bytes = disk.file_bytes if disk is not None else bb
            for medium, per_block in ((Medium.CPU, bb), (Medium.DISK, disk_bytes)):
                stored.add_metric([model_name, medium], stats.blocks_stored[medium])
                loaded.add_metric([model_name, medium], stats.blocks_loaded[medium])
            nbytes.add_metric([model_name, "GPU_to_CPU"], stats.blocks_stored[Medium.CPU] * bb)
            nbytes.add_metric([model_name, "CPU_to_GPU"], stats.blocks_loaded[Medium.CPU] * bb)
            nbytes.add_metric([model_name, "CPU_to_Disk"],
                              stats.blocks_stored[Medium.DISK] * disk_bytes)
            nbytes.add_metric([model_name, "Disk_to_GPU"],
                              stats.blocks_loaded[Medium.DISK] * disk_bytes)
            took = family(CounterMetricFamily, "vllm:kv_offload_total_time",
                          "Seconds the copies between the KV tiers took (GPU_to_CPU: the "
                          "step thread's snapshot of the stored blocks).", ("transfer_type",))
            for kind, medium, table in (("GPU_to_CPU", Medium.CPU, stats.seconds_stored),
                                        ("CPU_to_GPU", Medium.CPU, stats.seconds_loaded),
                                        ("CPU_to_Disk", Medium.DISK, stats.seconds_stored),
                                        ("Disk_to_GPU", Medium.DISK, stats.seconds_loaded)):
                took.add_metric([model_name, kind], table[medium])
            yield from (stored, loaded, nbytes, took)

            seconds = family(HistogramMetricFamily, "vllm:kv_offload_load_seconds",
                             "Time the load worker spent on one request's KV blocks (reading "
                             "disk files, copying into the device pool), off the steps.")
            cumulative, buckets = 0, []
            for edge, count in zip((*LOAD_SECONDS_BUCKETS, float("inf")), stats.load_buckets):
                cumulative += count
                buckets.append((str(edge) if edge != float("inf") else "+Inf", cumulative))
            seconds.add_metric([model_name], buckets, stats.load_seconds_sum)
            yield seconds
            missed = family(CounterMetricFamily, "vllm:kv_offload_blocks_not_loaded",
                            "Tier hits not loaded: the request went first (cancelled), or the "
                            "block or one before it could not be read (failed: recomputed).",
                            ("reason",))
            missed.add_metric([model_name, "cancelled"], stats.loads_cancelled)
            missed.add_metric([model_name, "failed"], stats.loads_failed)
            yield missed

            usage = family(GaugeMetricFamily, "vllm:kv_offload_usage_bytes",
                           "Bytes a KV tier holds (the disk tier: the whole shared "
                           "directory, as of this engine's last write).", ("medium",))
            capacity = family(GaugeMetricFamily, "vllm:kv_offload_capacity_bytes",
                              "Bytes a KV tier may hold.", ("medium",))
            for medium, (used, cap) in tiers.usage().items():
                usage.add_metric([model_name, medium], used)
                capacity.add_metric([model_name, medium], cap)
            used, cap = tiers.usage()[Medium.CPU]
            perc = family(GaugeMetricFamily, "vllm:kv_offload_cpu_cache_usage_perc",
                          "Host KV tier usage. 1 means 100 percent usage.")
            perc.add_metric([model_name], used / cap if cap else 0.0)
            yield from (usage, capacity, perc)

            hits = family(CounterMetricFamily, "vllm:prefix_cache_tier_hits",
                          "Prefix cache hits, in prompt tokens, by the tier that held the "
                          "block (vllm:prefix_cache_hits is their sum).", ("medium",))
            for medium, count in kv.hits_by_medium.items():
                hits.add_metric([model_name, medium], count)
            yield hits
            skipped = family(CounterMetricFamily, "vllm:kv_offload_stores_skipped",
                             "Blocks not stored in a tier: the copy queue was full "
                             "(queue_full), a disk write failed (write_failed), the disk "
                             "bound is below one block (no_room).", ("reason",))
            skipped.add_metric([model_name, "queue_full"], stats.stores_dropped)
            if disk is not None:
                skipped.add_metric([model_name, "write_failed"], disk.write_failures)
                skipped.add_metric([model_name, "no_room"], disk.writes_skipped)
                bad = family(CounterMetricFamily, "vllm:kv_offload_disk_bad_files",
                             "Disk tier files read as misses: truncated, corrupt (checksum) "
                             "or foreign (another format or engine kind).", ("reason",))
                for reason, count in disk.bad_files.items():
                    bad.add_metric([model_name, reason], count)
                yield bad
            yield skipped

    return Collector()
