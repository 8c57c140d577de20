"""Workload from Prometheus histograms: a known synthetic length distribution, observed into
vLLM's token buckets, comes back within the bucket resolution (every bucket's share exact
up to sampling noise, quantiles in the right bucket); one run through a real Prometheus."""
import bisect
import random
import time

import pytest

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest

from engine.entrypoints.metrics import token_buckets
from localcluster.prometheus import start_prometheus, write_targets
from tuner.sources.histogram import BucketDistribution, fit_from_prometheus, parse_window
from tuner.measure.promql import PrometheusReader

EDGES = token_buckets(4096)  # 1, 2, 5, 10, ..., 2000


def _serve_metrics(registry):
    """/metrics in the text format, as the engine serves it (vLLM's names keep their ':')."""
    from step_feeder import text_endpoint
    return text_endpoint(lambda: (200, generate_latest(registry)))


def _true_prompts(n, seed=0):
    rng = random.Random(seed)  # a log-normal around ~150 tokens: spans several buckets
    return [min(4000, max(1, round(rng.lognormvariate(5.0, 0.8)))) for _ in range(n)]


def _true_outputs(n, seed=1):
    rng = random.Random(seed)
    return [rng.randint(8, 300) for _ in range(n)]


def _cumulative(values):
    pairs = [(float(e), float(sum(v <= e for v in values))) for e in EDGES]
    return pairs + [(float("inf"), float(len(values)))]


def _bucket(value):
    return bisect.bisect_left(EDGES, value)


def _check_reproduces(dist, truth, samples=4000):
    rng = random.Random(7)
    drawn = sorted(dist.sample(rng) for _ in range(samples))
    ordered = sorted(truth)
    for q in (0.1, 0.25, 0.5, 0.75, 0.9):
        fitted, true = drawn[int(q * samples)], ordered[int(q * len(ordered))]
        # same bucket, or on a neighbouring edge when the true quantile sits near one
        assert abs(_bucket(fitted) - _bucket(true)) <= (0 if
            abs(dist.cdf(EDGES[_bucket(true)]) - q) > 0.03 else 1), (q, fitted, true)
    for edge in EDGES:  # every bucket's share reproduced (sampling noise only)
        share = sum(v <= edge for v in drawn) / samples
        assert abs(share - dist.cdf(edge)) < 0.03, edge
        assert abs(share - sum(v <= edge for v in truth) / len(truth)) < 0.03, edge


def test_bucket_fit_reproduces_a_known_distribution_within_the_buckets():
    truth = _true_prompts(3000)
    dist = BucketDistribution.from_cumulative(_cumulative(truth), name="prompt")
    _check_reproduces(dist, truth)
    assert all(1 <= dist.sample(random.Random(i)) for i in range(200))


def test_bad_buckets_and_windows_are_refused_with_a_clear_message():
    with pytest.raises(ValueError, match="le=\"\\+Inf\""):
        BucketDistribution.from_cumulative([(1.0, 3.0)], name="vllm:request_prompt_tokens")
    with pytest.raises(ValueError, match="no requests observed"):
        BucketDistribution.from_cumulative([(1.0, 0.0), (float("inf"), 0.0)], name="x")
    assert parse_window("24h") == 86400 and parse_window("90s") == 90
    assert parse_window("4001ms") == pytest.approx(4.001)   # the planner's windows (observe.py)
    with pytest.raises(ValueError, match="--window"):
        parse_window("yesterday")


@pytest.mark.timeout(120)
def test_fit_through_a_real_prometheus(tmp_path):
    registry = CollectorRegistry()
    prompt = Histogram("vllm:request_prompt_tokens", "p", ["model_name"], buckets=EDGES,
                       registry=registry).labels("m")
    output = Histogram("vllm:request_generation_tokens", "g", ["model_name"], buckets=EDGES,
                       registry=registry).labels("m")
    success = Counter("vllm:request_success", "s", ["model_name"], registry=registry).labels("m")
    server = _serve_metrics(registry)
    proc = start_prometheus(tmp_path / "prom", scrape_interval="1s")
    try:
        write_targets(tmp_path / "prom" / "targets", "fake", [f"127.0.0.1:{server.server_port}"],
                      {"job": "my-model"})
        reader = PrometheusReader(proc.url, timeout=30)
        first = reader.wait_for_scrape('{job="my-model"}', after=time.time())
        prompts, outputs = _true_prompts(2000), _true_outputs(2000)
        for p, o in zip(prompts, outputs):
            prompt.observe(p)
            output.observe(o)
            success.inc()
        last = reader.wait_for_scrape('{job="my-model"}', after=time.time())
        window = f"{round(last - first) + 1}s"
        fitted = fit_from_prometheus(reader, selector='job="my-model"', window=window, at=last)
    finally:
        proc.stop()
        server.shutdown()
    _check_reproduces(fitted.prompt, prompts)
    _check_reproduces(fitted.output, outputs)
    # the counter over the window: 2000 requests (increase() may extrapolate a little)
    assert 1800 <= fitted.requests <= 2600
    assert fitted.rate == pytest.approx(fitted.requests / parse_window(window))
    trace = fitted.synthesize(60, seed=3)
    assert trace and all(t.timestamp < 60 for t in trace)
    doc = fitted.document()
    assert any("Poisson" in a for a in doc["assumed"]) and "my-model" in doc["source"]
