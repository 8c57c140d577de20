"""The router's reading of a backend's /metrics: prometheus_client's parser, so whatever
the text format allows (timestamps, escaped label values, comments) reads right."""
from __future__ import annotations

from paged_router.pool import parse_metrics


def test_the_scraped_gauges_are_summed_over_label_sets():
    text = ("# HELP vllm:kv_cache_usage_perc KV usage\n"
            "# TYPE vllm:kv_cache_usage_perc gauge\n"
            'vllm:kv_cache_usage_perc{model_name="a"} 0.25\n'
            'vllm:kv_cache_usage_perc{model_name="b"} 0.5\n'
            "# TYPE vllm:num_requests_waiting gauge\n"
            'vllm:num_requests_waiting{model_name="a"} 3\n'
            "# TYPE vllm:num_requests_running gauge\n"
            'vllm:num_requests_running{model_name="a"} 7\n')
    assert parse_metrics(text) == {"kv_cache_usage": 0.75, "waiting": 3.0}


def test_a_sample_with_a_timestamp_reads_its_value_not_the_timestamp():
    # a hand parser that takes the last field of the line reads 1.7e12 here
    text = ('vllm:kv_cache_usage_perc{model_name="a"} 0.5 1700000000000\n'
            "vllm:num_requests_waiting 2 1700000000000\n")
    assert parse_metrics(text) == {"kv_cache_usage": 0.5, "waiting": 2.0}


def test_escaped_quotes_and_spaces_in_label_values_do_not_split_the_sample():
    text = 'vllm:num_requests_waiting{model_name="a \\"b\\" c",x="} 9"} 4\n'
    assert parse_metrics(text) == {"waiting": 4.0}


def test_text_that_is_not_the_exposition_format_reads_as_nothing():
    assert parse_metrics("<html>not metrics</html>\n") == {}
