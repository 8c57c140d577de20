"""Both metric paths on one load: a real Prometheus (Debian's binary, 1 s scrapes, file_sd)
scraping the fake engine's vLLM histograms, read with PromQL, against the default path
(two /metrics scrapes, differenced). Quantiles must agree within a bucket."""
import bisect
import threading
import time

import pytest

from fake_openai_server import E2E_BUCKETS, ITL_BUCKETS, TTFT_BUCKETS, FakeOpenAIServer
from localcluster.prometheus import start_prometheus
from tuner.measure.loadgen import LoadSpec
from tuner.measure.promql import PrometheusError, PrometheusReader, write_target
from tuner.measure.trial import measure

pytestmark = pytest.mark.timeout(180)
BUCKETS = {"ttft": TTFT_BUCKETS, "itl": ITL_BUCKETS, "e2e": E2E_BUCKETS}


def _bucket(edges, value):
    """The histogram bucket (lower, upper] holding `value`."""
    i = bisect.bisect_left(edges, value)
    return (edges[i - 1] if i else 0.0, edges[i] if i < len(edges) else float("inf"))


@pytest.fixture(scope="module")
def prometheus(tmp_path_factory):
    workdir = tmp_path_factory.mktemp("prometheus")
    proc = start_prometheus(workdir, scrape_interval="1s")
    yield proc, workdir / "targets"
    proc.stop()


def test_promql_and_scrape_quantiles_agree_within_a_bucket(prometheus, tmp_path):
    proc, targets = prometheus
    reader = PrometheusReader(proc.url, timeout=30)
    load = LoadSpec(workload="chat", duration=5, users=3, length_scale=0.1)
    with FakeOpenAIServer(ttft=0.03, itl=0.02) as server:
        write_target(targets, "fake-engine", server.url, {"job": "tuner-test"})
        figures = measure(server.url, load, {"chat": {"ttft": 1.0}}, workdir=tmp_path,
                          warmup_requests=2, prometheus=reader)
        write_target(targets, "fake-engine", None)
        served = len(server.requests)
    compared = 0
    for name, edges in BUCKETS.items():
        for q in ("p50", "p90", "p99"):
            promql, scraped = figures[f"server_{name}_{q}"], figures[f"scrape_server_{name}_{q}"]
            lo, hi = _bucket(edges, scraped)
            assert lo <= promql <= hi, (name, q, promql, scraped)
            compared += 1
    assert compared == 9
    assert figures["server_e2e_p99"] > figures["server_e2e_p50"] > 0
    # counters come from increase(): the window sits on scrapes, so barely extrapolated;
    # the 2 warm-up requests came before the window
    assert figures["server_requests"] == pytest.approx(served - 2, abs=1.5)
    assert figures["num_requests_running_max"] >= 1  # gauges over the window


def test_an_engine_prometheus_does_not_scrape_is_a_clear_error(prometheus):
    proc, _ = prometheus
    reader = PrometheusReader(proc.url, timeout=2)
    with pytest.raises(PrometheusError, match="has not scraped .*is the engine among its targets"):
        reader.wait_for_scrape(reader.selector_for("http://127.0.0.1:9"), after=time.time())
    with pytest.raises(PrometheusError, match="failed"):
        reader.query("sum(", at=time.time())


def test_a_failed_scrape_is_not_a_scrape(prometheus):
    """A scrape that failed (up 0: the target erred or timed out) holds none of the
    engine's series: wait_for_scrape waits for one that succeeded."""
    from step_feeder import text_endpoint

    proc, targets = prometheus
    healthy = threading.Event()
    httpd = text_endpoint(lambda: (200, b"flaky_metric 1\n") if healthy.is_set()
                          else (500, b"down\n"))
    reader, sel = PrometheusReader(proc.url, timeout=30), '{job="flaky"}'
    write_target(targets, "flaky", f"http://127.0.0.1:{httpd.server_port}", {"job": "flaky"})
    try:
        deadline = time.monotonic() + 30
        while reader.scalar(f"max(timestamp(up{sel}))", at=time.time()) is None:
            assert time.monotonic() < deadline, "Prometheus never scraped the target"
            time.sleep(0.2)
        assert reader.scalar(f"max(up{sel})", at=time.time()) == 0
        with pytest.raises(PrometheusError, match="has not scraped"):
            PrometheusReader(proc.url, timeout=2.5).wait_for_scrape(sel, after=0)
        healthy.set()
        at = reader.wait_for_scrape(sel, after=0)
        assert reader.scalar(f"flaky_metric{sel}", at=at) == 1
    finally:
        write_target(targets, "flaky", None)
        httpd.shutdown()
        httpd.server_close()


def test_a_live_profile_is_fitted_from_prometheus(prometheus):
    """tuner/sim/live_profile.prometheus_series: the step counters as Prometheus scraped
    them (1 s), read back at 1 s windows, recover the law they grew by; the host KV
    tier's copy counters beside them, the rates they grew at; the loop's gaps after each
    step, in each step's price."""
    from step_feeder import COPY_RATES, GAP, assert_recovers_the_law, feeding_metrics
    from tuner.sim.live_profile import copy_rates, fit_live, prometheus_series

    proc, targets = prometheus
    reader, sel = PrometheusReader(proc.url, timeout=30), '{job="live-profile"}'
    with feeding_metrics(copies=True, gaps=True) as url:
        write_target(targets, "live-profile", url, {"job": "live-profile"})
        try:
            first = reader.wait_for_scrape(sel, after=0)
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:   # until 12 scrapes of the counters
                last = reader.wait_for_scrape(sel, after=time.time() - 0.5)
                if last - first >= 12:
                    break
        finally:
            write_target(targets, "live-profile", None)
    series = prometheus_series(reader, sel, start=first, end=last, interval=1.0)
    fit, steps = fit_live(series)
    assert len(series) >= 12 and steps > 500
    assert_recovers_the_law(fit.coefficients, gap=GAP)
    assert copy_rates(series) == pytest.approx(COPY_RATES, rel=0.01)
    with pytest.raises(ValueError, match='no paged:engine_step_duration_seconds for {job="none"}'):
        prometheus_series(reader, '{job="none"}', start=first, end=last, interval=1.0)


def test_the_planners_live_steps_accumulate_and_refit_the_profile(prometheus):
    """tuner/planner/predict.LiveSteps: readings since the last one join a rolling series
    (older than `history` dropped); once it holds enough busy windows the profile's fit
    is the service's law, its memory kept; the KV pool is the engine's own."""
    from step_feeder import assert_recovers_the_law, feeding_metrics
    from tuner.planner.predict import LiveSteps
    from tuner.sim.profile import Fit, Identity, Memory, Profile

    base = Profile(Identity("m", "f", "cpu", "2", 1),
                   Fit("intercept", {"intercept": 1.0}, 0.5), Memory(0, 1, 2, 3, 4, 512, 100), 9)
    proc, targets = prometheus
    reader, sel = PrometheusReader(proc.url, timeout=30), 'job="live-steps"'
    live = LiveSteps(reader, sel, every=1.0, history=13.0)
    with feeding_metrics(num_gpu_blocks=321) as url:
        write_target(targets, "live-steps", url, {"job": "live-steps"})
        try:
            first = reader.wait_for_scrape("{" + sel + "}", after=0)
            early, blocks = live.update(first + 1.5, base)
            assert early is None and blocks == 321   # two readings: too few windows
            assert "busy window(s)" in live.why and len(live.readings) == 2
            last = first
            while last - first < 15:
                last = reader.wait_for_scrape("{" + sel + "}", after=time.time() - 0.5)
        finally:
            write_target(targets, "live-steps", None)
    profile, blocks = live.update(last, base)
    assert blocks == 321 and profile is not None, live.why
    assert profile.memory == base.memory
    assert profile.fit.form != "intercept" and profile.num_steps > 300
    assert_recovers_the_law(profile.fit.coefficients)
    assert all(last - 13.0 <= r.t <= last for r in live.readings)   # the first ones dropped
    assert min(r.t for r in live.readings) > first + 1.5
    assert len({r.t for r in live.readings}) == len(live.readings)   # none read twice
    assert live.update(last, base) == (None, 321)   # nothing new: no refit


def test_the_planners_live_drafts_are_the_services_own(prometheus):
    """LiveSteps.drafts: the service's speculation as Prometheus scraped it (its
    vllm:spec_decode_* counters and decode rows over the window) is a DraftModel at the
    rates the engine drafted and accepted; no decode steps, no model."""
    from step_feeder import ACCEPT, DRAFT_SHARE, feeding_metrics
    from tuner.planner.predict import LiveSteps

    proc, targets = prometheus
    reader, sel = PrometheusReader(proc.url, timeout=30), 'job="live-drafts"'
    spec = {"method": "suffix", "num_speculative_tokens": 2}
    live = LiveSteps(reader, sel, every=1.0, history=10.0)
    with feeding_metrics(spec=True) as url:
        write_target(targets, "live-drafts", url, {"job": "live-drafts"})
        try:
            first = reader.wait_for_scrape("{" + sel + "}", after=0)
            last = first
            while last - first < 4:
                last = reader.wait_for_scrape("{" + sel + "}", after=time.time() - 0.5)
        finally:
            write_target(targets, "live-drafts", None)
    model = live.drafts(last, spec)
    assert model is not None and model.method == "suffix", live.why
    assert model.steps > 1000   # drafts of 2 (increase() extrapolates: not exactly 2)
    mean = sum((i + 1) * c for i, c in enumerate(model.length_counts)) / model.drafting
    assert mean == pytest.approx(2.0, rel=0.01)
    assert model.draft_share == pytest.approx(DRAFT_SHARE, rel=0.02)
    assert model.accept == pytest.approx(ACCEPT, rel=0.02)
    assert LiveSteps(reader, 'job="none"').drafts(last, spec) is None


def test_a_capacity_tuning_times_its_simulator_by_the_targets_own_steps(prometheus,
                                                                          monkeypatch):
    """tuner/incluster/capacity_job.service_profile: with spec.prometheus.url the target's
    own pods' step series (not a trial's) give the profile the feeder's law; without
    Prometheus, or without the target's series, the profile stays as it was."""
    from types import SimpleNamespace

    from step_feeder import assert_recovers_the_law, feeding_metrics
    from tuner.incluster import capacity_job
    from tuner.sim.profile import Fit, Identity, Memory, Profile

    monkeypatch.setattr(capacity_job, "SERVICE_WINDOW", 20.0)
    monkeypatch.setattr(capacity_job, "SERVICE_EVERY", 1.0)
    base = Profile(Identity("m", "f", "cpu", "2", 1), Fit("unfitted", {}, float("inf")),
                   Memory(0, 1, 2, 3, 4, 512, 100), 0)
    proc, targets = prometheus
    reader, logs = PrometheusReader(proc.url, timeout=30), []

    def run(target: str, prometheus=reader):
        return SimpleNamespace(prometheus=prometheus, cluster=SimpleNamespace(ns="team"),
                               spec=SimpleNamespace(target=target))
    labels = {"namespace": "team", "pod": "svc-5d8f9-x7k2q", "job": "own-steps"}
    with feeding_metrics() as url:
        write_target(targets, "own-steps", url, labels)
        try:
            first = reader.wait_for_scrape('{job="own-steps"}', after=0)
            last = first
            while last - first < 15:
                last = reader.wait_for_scrape('{job="own-steps"}', after=time.time() - 0.5)
        finally:
            write_target(targets, "own-steps", None)
    fitted = capacity_job.service_profile(run("svc"), base, logs.append, at=last)
    assert fitted.memory == base.memory and fitted.num_steps > 300
    assert_recovers_the_law(fitted.fit.coefficients)
    assert "svc's own" in logs[-1]
    # another service's pods are not this target's; no Prometheus reads nothing
    assert capacity_job.service_profile(run("svc-t1"), base, logs.append, at=last) is base
    assert "the pilot's time it" in logs[-1]
    assert capacity_job.service_profile(run("svc", None), base, logs.append, at=last) is base


def test_the_planner_observes_the_service_through_prometheus(prometheus, tmp_path):
    """tuner/planner/observe.py: the window's rate, mix and latency as Prometheus scraped
    them from a served load; a planning step from them; no Prometheus: replicas held."""
    from tuner.measure.loadgen import run_load
    from tuner.planner.core import UTILISATION, Planner, PlannerSpec, Prediction
    from tuner.planner.observe import Step, observe

    proc, targets = prometheus
    reader, sel = PrometheusReader(proc.url, timeout=30), 'job="planner-test"'
    with FakeOpenAIServer(ttft=0.02, itl=0.01) as server:
        write_target(targets, "planner-test", server.url, {"job": "planner-test"})
        start = reader.wait_for_scrape("{" + sel + "}", after=time.time())
        run_load(LoadSpec(workload="chat", duration=3, users=3, length_scale=0.1),
                 url=server.url, workdir=tmp_path)
        end = reader.wait_for_scrape("{" + sel + "}", after=time.time())
        write_target(targets, "planner-test", None)
        served = len(server.requests)
    obs = observe(reader, sel, window=end - start, at=end, replicas=2)
    assert obs.rate * (end - start) == pytest.approx(served, abs=1.5)
    assert obs.prompt_tokens == pytest.approx(5, rel=0.1) and obs.output_tokens >= 1
    assert _bucket(BUCKETS["itl"], obs.itl_p50)[0] <= 0.01 <= _bucket(BUCKETS["itl"], obs.itl_p50)[1]
    seen = []

    def predictor(fitted, per_replica_rate):
        seen.append((fitted.requests, per_replica_rate))
        return Prediction(capacity=obs.rate / 3 / UTILISATION,    # 3 replicas planned
                          itl_p50=obs.itl_p50)                 # no correction
    step = Step(Planner(PlannerSpec(max_replicas=10)), reader, sel, predictor,
                window=end - start)
    decision, _ = step(at=end, replicas=2)
    assert seen, decision.reason
    assert seen[0][1] == pytest.approx(obs.rate / 2)
    # a window a millisecond off whole seconds (a late scrape) is a window Prometheus takes
    late, _ = Step(Planner(PlannerSpec(max_replicas=10)), reader, sel, predictor,
                   window=end - start + 0.0004)(at=end, replicas=2)
    assert len(seen) == 2, late.reason
    assert decision.replicas == 3 and decision.wanted == 3
    gone = Step(Planner(PlannerSpec()), PrometheusReader("http://127.0.0.1:9", timeout=1),
                sel, predictor, window=30)
    held, _ = gone(at=end, replicas=2)
    assert held.replicas == 2 and held.reason.startswith("unchanged: Prometheus at")
