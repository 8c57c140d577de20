"""The KV tiers' metrics on a real server's /metrics (engine/kv_offload/metrics.py)."""
from __future__ import annotations

import random

import httpx
import pytest
from tests.server.conftest import ServerProcess, scrape, wait_for
from tuner.measure import server_metrics


def test_tier_metrics_count_stores_loads_and_hits(tmp_path):
    args = ["--max-model-len", "512", "--num-gpu-blocks-override", "40", "--seed", "0",
            "--kv-offloading-size", "0.004", "--kv-disk-dir", str(tmp_path),
            "--kv-disk-size", "0.1"]
    server = ServerProcess(*args)
    try:
        rng = random.Random(0)
        prefixes = [[rng.randrange(3, 200) for _ in range(304)] for _ in range(4)]
        before = scrape(server.base_url)
        snapshot = server_metrics.scrape(server.base_url)   # the tuner's reading of a window

        def complete(prefix: list[int], tail: int) -> None:
            r = httpx.post(server.base_url + "/v1/completions", timeout=120, json={
                "model": "paged-tiny-llama-v1", "prompt": prefix + [tail], "max_tokens": 2,
                "temperature": 0})
            assert r.status_code == 200, r.text

        for p in prefixes:  # each evicts earlier ones: to the host tier, then to disk
            complete(p, 1)
        for p in prefixes:  # and back
            complete(p, 2)
        m = wait_for(lambda: (lambda s: s if s.get(
            "vllm:kv_offload_blocks_stored_total{medium=Disk}", 0) > 0 else None)(
            scrape(server.base_url)), timeout=30)
        assert m, "blocks should have spilled to disk"
        assert m["vllm:kv_offload_blocks_stored_total{medium=CPU}"] > 0
        loaded = (m["vllm:kv_offload_blocks_loaded_total{medium=CPU}"] +
                  m["vllm:kv_offload_blocks_loaded_total{medium=Disk}"])
        assert loaded > 0
        assert m["vllm:kv_offload_total_bytes_total{transfer_type=GPU_to_CPU}"] > 0
        assert m["vllm:kv_offload_load_seconds_count"] > 0
        # every copy that moved bytes took time, none that moved nothing did; a load's time
        # is within the load jobs' own (their histogram's sum)
        took = {kind: m[f"vllm:kv_offload_total_time_total{{transfer_type={kind}}}"]
                for kind in ("GPU_to_CPU", "CPU_to_GPU", "CPU_to_Disk", "Disk_to_GPU")}
        for kind, seconds in took.items():
            moved = m[f"vllm:kv_offload_total_bytes_total{{transfer_type={kind}}}"]
            assert (seconds > 0) == (moved > 0), (kind, seconds, moved)
        assert took["GPU_to_CPU"] > 0 and took["CPU_to_Disk"] > 0
        assert 0 < took["CPU_to_GPU"] + took["Disk_to_GPU"] <= \
            m["vllm:kv_offload_load_seconds_sum"]
        tiers = sum(m[f"vllm:prefix_cache_tier_hits_total{{medium={x}}}"]
                    for x in ("GPU", "CPU", "Disk"))
        hits = m["vllm:prefix_cache_hits_total"] - before["vllm:prefix_cache_hits_total"]
        warm = sum(before.get(f"vllm:prefix_cache_tier_hits_total{{medium={x}}}", 0)
                   for x in ("GPU", "CPU", "Disk"))
        assert hits == tiers - warm and hits >= loaded * 16
        assert 0 < m["vllm:kv_offload_usage_bytes{medium=CPU}"] <= \
            m["vllm:kv_offload_capacity_bytes{medium=CPU}"]
        assert 0 < m["vllm:kv_offload_cpu_cache_usage_perc"] <= 1
        assert m["vllm:kv_offload_disk_bad_files_total{reason=corrupt}"] == 0
        # a trial's figures: the share of looked-up prompt tokens each tier served
        figures = server_metrics.server_figures(snapshot, server_metrics.scrape(server.base_url))
        queries = m["vllm:prefix_cache_queries_total"] - before["vllm:prefix_cache_queries_total"]
        for medium, label in (("CPU", "host"), ("Disk", "disk")):
            key = f"vllm:prefix_cache_tier_hits_total{{medium={medium}}}"
            assert figures[f"{label}_tier_hit_rate"] == pytest.approx(
                (m[key] - before.get(key, 0)) / queries)
        assert figures["host_tier_hit_rate"] + figures["disk_tier_hit_rate"] > 0
        assert m["vllm:kv_offload_blocks_not_loaded_total{reason=failed}"] == 0
        assert m["vllm:kv_offload_blocks_not_loaded_total{reason=cancelled}"] == 0
    finally:
        server.stop()
