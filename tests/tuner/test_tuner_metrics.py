"""Prometheus scraping arithmetic on hand-built exposition text."""
import math

import pytest

from tuner.measure import server_metrics as metrics

# Two scrapes of the same server: between them 10 TTFT observations were added,
# 4 in (0, 0.1], 4 in (0.1, 0.5], 2 in (0.5, 1.0]; counters use prometheus_client's
# `_total` suffix and are split over two label sets that must be summed.
BEFORE = """\
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 1
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 2
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 2
vllm:time_to_first_token_seconds_count{model_name="m"} 2
vllm:time_to_first_token_seconds_sum{model_name="m"} 0.9
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 100
vllm:prefix_cache_queries_created{model_name="m"} 1.7e9
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 10
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 1
vllm:request_success_total{finished_reason="length",model_name="m"} 1
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
"""
AFTER = """\
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_bucket{le="0.1",model_name="m"} 5
vllm:time_to_first_token_seconds_bucket{le="0.5",model_name="m"} 9
vllm:time_to_first_token_seconds_bucket{le="1.0",model_name="m"} 12
vllm:time_to_first_token_seconds_bucket{le="+Inf",model_name="m"} 12
vllm:time_to_first_token_seconds_count{model_name="m"} 12
vllm:time_to_first_token_seconds_sum{model_name="m"} 3.0
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{model_name="m"} 300
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{model_name="m"} 160
# TYPE vllm:request_success counter
vllm:request_success_total{finished_reason="stop",model_name="m"} 4
vllm:request_success_total{finished_reason="length",model_name="m"} 8
# TYPE vllm:num_preemptions counter
vllm:num_preemptions_total{model_name="m"} 3
"""


def test_counters_are_differenced_summed_over_labels_and_accept_total_suffix():
    before, after = metrics.parse(BEFORE), metrics.parse(AFTER)
    assert metrics.counter_delta(before, after, "vllm:request_success") == 10
    assert metrics.counter_delta(before, after, "vllm:prefix_cache_hits_total") == 150
    assert after.value("vllm:prefix_cache_queries_created") is None  # creation stamps dropped
    assert metrics.counter_delta(before, after, "vllm:not_there") is None


def test_histogram_delta_and_promql_quantile_interpolation():
    before, after = metrics.parse(BEFORE), metrics.parse(AFTER)
    buckets = metrics.histogram_delta(before, after, metrics.TTFT)
    assert buckets == [(0.1, 4), (0.5, 8), (1.0, 10), (math.inf, 10)]
    # rank 5 of 10 lies in (0.1, 0.5], 1 of its 4 observations in: 0.1 + 0.4 * 1/4
    assert metrics.histogram_quantile(0.5, buckets) == pytest.approx(0.2)
    # rank 9.9 lies in (0.5, 1.0], 1.9 of its 2 observations in
    assert metrics.histogram_quantile(0.99, buckets) == pytest.approx(0.5 + 0.5 * 1.9 / 2)
    # the lowest bucket interpolates from 0
    assert metrics.histogram_quantile(0.2, buckets) == pytest.approx(0.05)


def test_quantile_in_the_inf_bucket_returns_highest_finite_bound_and_empty_is_none():
    assert metrics.histogram_quantile(0.99, [(0.5, 1), (1.0, 2), (math.inf, 10)]) == 1.0
    assert metrics.histogram_quantile(0.5, [(0.5, 0), (math.inf, 0)]) is None
    assert metrics.histogram_quantile(0.5, []) is None
    with pytest.raises(ValueError):
        metrics.histogram_quantile(1.5, [(math.inf, 1)])


def test_server_figures_of_a_window():
    figures = metrics.server_figures(metrics.parse(BEFORE), metrics.parse(AFTER))
    assert figures["prefix_cache_hit_rate"] == pytest.approx(150 / 200)
    assert figures["server_requests"] == 10
    assert figures["server_preemptions"] == 3  # absent before: counted from zero
    assert figures["server_ttft_p50"] == pytest.approx(0.2)
    assert "server_itl_p50" not in figures  # no ITL histogram in the text


def test_malformed_text_is_an_error():
    with pytest.raises(ValueError):
        metrics.parse("vllm:x{model_name=\"m\" 1\n")


def _tiers(cpu: float, disk: float, *, disk_on: bool) -> str:
    """The KV tiers' families as the engine exports them (engine/kv_offload/metrics.py):
    tier hits for every medium once a tier is on, capacities only for the tiers that are."""
    text = ("# TYPE vllm:prefix_cache_tier_hits counter\n"
            f'vllm:prefix_cache_tier_hits_total{{medium="GPU",model_name="m"}} 40\n'
            f'vllm:prefix_cache_tier_hits_total{{medium="CPU",model_name="m"}} {cpu}\n'
            f'vllm:prefix_cache_tier_hits_total{{medium="Disk",model_name="m"}} {disk}\n'
            "# TYPE vllm:kv_offload_capacity_bytes gauge\n"
            'vllm:kv_offload_capacity_bytes{medium="CPU",model_name="m"} 1e9\n')
    if disk_on:
        text += 'vllm:kv_offload_capacity_bytes{medium="Disk",model_name="m"} 1e10\n'
    return text


def test_the_tiers_hit_rates_are_their_share_of_the_looked_up_tokens():
    before = metrics.parse(BEFORE + _tiers(5, 0, disk_on=True))
    after = metrics.parse(AFTER + _tiers(65, 30, disk_on=True))
    figures = metrics.server_figures(before, after)
    assert figures["host_tier_hit_rate"] == pytest.approx(60 / 200)
    assert figures["disk_tier_hit_rate"] == pytest.approx(30 / 200)
    # summed over media for the plain counter: the tiers' labels do not leak into it
    assert after.value("vllm:prefix_cache_tier_hits") == 40 + 65 + 30
    # a host tier alone: no disk figure (the engine counts Disk hits at 0 all the same)
    alone = metrics.server_figures(metrics.parse(BEFORE + _tiers(5, 0, disk_on=False)),
                                   metrics.parse(AFTER + _tiers(65, 0, disk_on=False)))
    assert "disk_tier_hit_rate" not in alone and alone["host_tier_hit_rate"] == 0.3
    # no tier at all: neither
    assert not {"host_tier_hit_rate", "disk_tier_hit_rate"} & set(
        metrics.server_figures(metrics.parse(BEFORE), metrics.parse(AFTER)))
