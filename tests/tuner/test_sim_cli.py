"""`python -m tuner profile` and `python -m tuner simulate`: a profile calibrated on the
embedded model (short, --scale 0.1), a what-if answered with capacity and replicas, and
bad input refused by name."""
from __future__ import annotations

import json
import math
import re
import subprocess
import sys

import pytest

from tuner.__main__ import main
from tuner.search.capacity_sweep import HEADROOM

pytestmark = pytest.mark.timeout(300)


def _run(*argv, env=None):
    return subprocess.run([sys.executable, "-m", "tuner", *argv], capture_output=True,
                          text=True, timeout=240, env=env)


@pytest.fixture(scope="module")
def profile_file(tmp_path_factory):
    out = tmp_path_factory.mktemp("profile") / "p.json"
    done = _run("profile", "--scale", "0.1", "--block-sizes", "16", "--threads", "1",
                "--out", str(out))
    assert done.returncode == 0, done.stderr[-2000:]
    assert re.search(r"held-out median error \d+\.\d%; host KV tier copies: stores "
                     r"\d+\.\d\d GB/s, loads \d+\.\d\d GB/s", done.stdout)
    return out


def _simulate(capsys, profile_file, workload: str, *flags: str) -> tuple[str, dict]:
    """`tuner simulate` of one load at 2 req/s: its output and the load's figures."""
    code = main(["simulate", "--workload", workload, "--profile", str(profile_file),
                 "--duration", "8", "--rate", "2", *flags])
    out = capsys.readouterr().out
    assert code == 0
    return out, dict(re.findall(r"^  (\w+)\s+([\d.e+-]+)$", out, re.M))


def test_simulate_reports_one_load_and_the_capacity_with_replicas(profile_file, capsys):
    out, one = _simulate(capsys, profile_file, "chat", "--target-rate", "40")
    assert float(one["requests"]) > 0 and 0 <= float(one["slo_attainment"]) <= 1
    capacity = float(re.search(r"capacity: ([\d.]+) req/s per replica", out).group(1))
    replicas = int(re.search(r"replicas for 40 req/s: (\d+)", out).group(1))
    assert capacity > 0 and replicas == math.ceil(40 / capacity)
    assert "host_tier_hit_rate" not in one   # no host tier, no such figure


def test_simulate_runs_the_host_tier_and_reports_its_hits(profile_file, capsys):
    _, one = _simulate(capsys, profile_file, "rag", "--set", "kv_offloading_size=1")
    assert 0 <= float(one["host_tier_hit_rate"]) <= float(one["prefix_cache_hit_rate"]) <= 1


def test_simulate_takes_a_fixed_pool_and_a_disk_tier_the_tuner_does_not_search(
        profile_file, capsys):
    """A what-if may fix engine settings outside the search space: a pool of so many
    blocks, and a disk KV tier under the host tier (simulated, no directory), whose hits
    it reports; without the disk tier, no such figure."""
    tiers = ("--set", "kv_offloading_size=0.005", "--set", "num_gpu_blocks_override=160")
    _, disk = _simulate(capsys, profile_file, "rag", *tiers, "--set", "kv_disk_size=0.05")
    assert int(disk["num_blocks"]) == 160 and float(disk["disk_tier_hit_rate"]) > 0
    _, host = _simulate(capsys, profile_file, "rag", *tiers)
    assert int(host["num_blocks"]) == 160 and "disk_tier_hit_rate" not in host


def test_a_setting_changes_the_simulated_capacity(profile_file, tmp_path, capsys):
    # A known law in place of the calibration's fit (which, measured on a loaded 2-core
    # machine, may make a batch of 16 hardly cheaper per token than one sequence): a step
    # costs 20 ms plus 0.5 ms per decoding sequence, so batching pays, as on a GPU.
    from tuner.sim.profile import Fit, Profile
    calibrated = Profile.load(profile_file)
    law = Fit("law", {"intercept": 0.02, "prefill_tokens": 2e-5, "decode_seqs": 5e-4}, 0.0)
    path = tmp_path / "law.json"
    Profile(calibrated.identity, law, calibrated.memory, calibrated.num_steps).save(path)
    rates = []
    for seqs in ("1", "16"):
        assert main(["simulate", "--workload", "chat", "--profile", str(path),
                     "--duration", "8", "--set", f"max_num_seqs={seqs}"]) == 0
        rates.append(float(re.search(r"capacity: ([\d.]+)", capsys.readouterr().out)[1]))
    assert 2 * rates[0] < rates[1]   # one sequence at a time serves far less than sixteen


@pytest.mark.parametrize("argv, message", [
    (["--rate", "0"], "--rate must be > 0"),
    (["--duration", "0"], "--duration must be positive"),
    (["--attainment", "1.5"], "--attainment must be in (0, 1]"),
    (["--sustain", "-5"], "sustain (--sustain, spec.capacity.sustainSeconds)"),
    (["--acceptance", "-0.1"], "--acceptance must be in [0, 1]"),
    (["--set", "page_size=16"], "page_size"),
    (["--set", "max_num_seqs=4,8"], "one value"),
    (["--set", "kv_disk_size=-1"], "--set kv_disk_size must be"),
    (["--set", "num_gpu_blocks_override=many"], "--set num_gpu_blocks_override must be"),
    (["--warmup-requests", "-1"], "--warmup-requests -1: the simulator's warm-up is a number"),
])
def test_bad_input_is_refused_by_name(profile_file, capsys, argv, message):
    with pytest.raises(SystemExit) as exit_:
        main(["simulate", "--workload", "chat", "--profile", str(profile_file), *argv])
    assert exit_.value.code == 2 and message in capsys.readouterr().err


def test_a_profile_of_another_model_or_thread_count_is_refused(profile_file, tmp_path, capsys):
    doc = json.loads(profile_file.read_text())
    # the model is known by its weights' fingerprint, not by the name it was given
    for key, value in (("fingerprint", "0" * 64), ("threads", 7)):
        other = tmp_path / f"{key}.json"
        changed = json.loads(json.dumps(doc))
        changed["identity"][key] = value
        other.write_text(json.dumps(changed))
        with pytest.raises(SystemExit):
            main(["simulate", "--workload", "chat", "--profile", str(other)])
        err = capsys.readouterr().err
        assert str(other) in err and str(value) in err


def test_an_empty_or_unreadable_trace_is_refused(profile_file, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("")
    for path, message in ((empty, "holds no requests"), (tmp_path / "none", "cannot read")):
        with pytest.raises(SystemExit):
            main(["simulate", "--trace", str(path), "--profile", str(profile_file)])
        err = capsys.readouterr().err
        assert message in err and str(path) in err


def test_the_capacity_sweep_end_to_end_on_the_embedded_model(profile_file, tmp_path):
    """Two simulated settings, then a pilot of the baseline and the baseline and the best
    one on real engines over two rounds: five engines in all, and the result names
    capacity, gain and replicas. The baseline serves one sequence at a time, so that the
    candidates (8-32) simulate with headroom and the rounds run (against the engine
    defaults two settings may simulate within 3 % of them: no rounds, CI 2026-12-05).
    On a loaded machine the pilot's refit can still rate them level (CI 2026-12-06, twice):
    then the sweep must end on its pilot alone, saying so, and that path is checked."""
    import os
    out = tmp_path / "out"
    baseline = tmp_path / "baseline.yaml"
    baseline.write_text("engine: {maxNumSeqs: 1}\n")
    done = subprocess.run(
        [sys.executable, "-m", "tuner", "sweep", "--workload", "chat", "--trials", "2",
         "--confirm-rounds", "2", "--real-probes", "2", "--duration", "3",
         "--sim-duration", "8", "--profile", str(profile_file), "--out-dir", str(out),
         "--baseline", str(baseline),
         "--target-rate", "40", "--param", "block_size=16", "--param", "max_num_seqs=8..32",
         "--param", "gpu_memory_utilization=0.9", "--param", "num_speculative_tokens=none",
         "--param", "max_num_batched_tokens=none", "--param", "kv_offloading_size=none"],
        capture_output=True, text=True, timeout=280, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((out / "capacity.json").read_text())
    assert len(record["simulated"]) == 2
    assert record["sim_duration_s"] == 8.0    # given; else the real loads' 3 s
    flat = record["reason"].startswith("no headroom in simulation")
    assert ("real, the pilot" if flat else "the baseline's pilot") in done.stdout
    engines = ["pilot"] if flat else ["baseline", "C1"] * 2 + ["pilot"]
    assert record["real_engines"] == len(engines)
    assert sorted(p.parent.name for p in out.rglob("engine.log")) == sorted(engines)
    if flat:    # the best candidate within HEADROOM of the baseline, as the record says
        assert max(p["capacity"] for p in record["simulated"]) <= (
            HEADROOM * record["sim_baseline"])
        assert record["winner"] is None and len(record["arms"]) == 1
    # the pilot's served steps (read from its /metrics meanwhile) gave the calibration its
    # serving term, and the search ran on it; the refit of the same steps was simulated
    assert "refitted from the pilot's" in done.stderr
    check = record["profile"]["check"]
    assert check["serving_term"] and record["profile"]["serving"]["windows"] >= 2
    assert record["profile"]["source"] == "calibration"
    assert check["live"] and check["calibration"]
    # the pilot's own KV pool (its /metrics) sized the simulated engines' pools
    pool = record["profile"]["pool"]
    assert pool["pilot_blocks"] > 0 and pool["block_size"] == 16
    assert f"the pilot's pool, {pool['pilot_blocks']} blocks of 16 tokens" in done.stderr
    base = record["arms"][0]
    assert len(base["capacity"]) == (1 if flat else 2) and all(c >= 0 for c in base["capacity"])
    assert re.search(r"baseline: [\d.]+ req/s per replica \(real", done.stdout)
    assert re.search(r"replicas for 40 req/s: (\d+|none meets the SLOs) with the baseline",
                     done.stdout)
    assert (out / "capacity.png").stat().st_size > 0
    # real against simulated latency distributions where the last round's probe passed
    for arm in [] if flat else record["arms"]:
        compared = record["latency"][arm["label"]]
        if any(p["passed"] for p in arm["probes"][-1]):
            for kind in ("real", "sim"):
                ttft = compared[kind]["ttft"]
                assert len(ttft) == 19 and ttft == sorted(ttft) and ttft[0] > 0
            assert (out / "latency.png").stat().st_size > 0
        else:
            assert compared is None
    if record["winner"]:
        assert "capacity gain" in done.stdout and (out / "best.yaml").exists()
    else:
        assert "keep the baseline" in done.stdout and not (out / "best.yaml").exists()


def test_profile_refits_the_step_times_from_a_live_metrics_endpoint(profile_file, tmp_path,
                                                                    capsys):
    """--from-metrics: a real HTTP /metrics whose step counters grow by a known law while
    it is read; the profile written keeps the base's identity and memory."""
    from step_feeder import assert_recovers_the_law, feeding_metrics

    out = tmp_path / "live.json"
    with feeding_metrics() as url:
        code = main(["profile", "--from-metrics", url, "--base", str(profile_file),
                     "--threads", "1", "--duration", "4", "--interval", "0.3",
                     "--out", str(out)])
    assert code == 0
    live, base = json.loads(out.read_text()), json.loads(profile_file.read_text())
    assert live["identity"] == base["identity"] and live["memory"] == base["memory"]
    assert_recovers_the_law(live["fit"]["coefficients"])
    assert live["created"].startswith("live:") and "written to" in capsys.readouterr().out


def test_profile_from_metrics_without_step_counters_is_refused(profile_file, capsys):
    from fake_openai_server import FakeOpenAIServer

    with FakeOpenAIServer() as server, pytest.raises(SystemExit) as exit_:
        main(["profile", "--from-metrics", server.url, "--base", str(profile_file),
              "--threads", "1", "--duration", "0.4", "--interval", "0.2"])
    assert exit_.value.code == 2
    assert "no paged:engine_step_duration_seconds" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["profile", "--from-metrics", "http://127.0.0.1:9", "--duration", "1",
              "--interval", "1"])
    assert "--duration (--since) at least two" in capsys.readouterr().err


def test_the_planner_predicts_fewer_replicas_per_request_for_a_mix_of_longer_prompts(
        profile_file):
    """tuner/planner/predict.SimPredictor: the same arrival rate with longer prompts
    through the simulator gives a lower capacity, so the planner asks for more replicas."""
    from tuner.planner.core import Observation, Planner, PlannerSpec
    from tuner.planner.predict import SimPredictor
    from tuner.sim.context import SimContext
    from tuner.sim.profile import Profile
    from tuner.sources.histogram import BucketDistribution, FittedWorkload

    edges = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000)

    def mix(prompt_bucket):
        counts = [0.0] * len(edges)
        counts[prompt_bucket] = 100.0
        out = [0.0] * len(edges)
        out[4] = 100.0                                   # outputs of 11-20 tokens
        return FittedWorkload(prompt=BucketDistribution(edges, tuple(counts)),
                              output=BucketDistribution(edges, tuple(out)), rate=20.0,
                              requests=1200, window_s=60, source="test")

    ctx = SimContext(Profile.load(profile_file), {"trace": {"ttft": 3.0, "tpot": 0.3}},
                     duration=15.0)
    predict = SimPredictor(ctx, {"cpu_memory_gib": 0.5})
    short, long = predict(mix(5), 20.0), predict(mix(8), 20.0)   # 21-50 vs 201-500 tokens
    assert long.capacity < 0.8 * short.capacity
    assert short.itl_p50 and long.itl_p50
    assert predict(mix(5), 20.0).capacity == short.capacity and len(predict._capacity) == 2
    rate = 2.5 * short.capacity
    replicas = [Planner(PlannerSpec(max_replicas=50)).decide(
        Observation(at=0, rate=rate, replicas=1), p).replicas for p in (short, long)]
    assert replicas[1] > replicas[0] >= 3

    class Live:   # the engines report a KV pool of 130 blocks (LiveSteps' answer)
        def update(self, at, base):
            return None, 130
    # a known law in place of the calibration's fit (which on a 2-core machine may price
    # a decoding sequence at next to nothing): 10 ms a step plus 3 ms per decoding sequence
    from tuner.sim.profile import Fit
    calibrated = ctx.profile
    law = Profile(calibrated.identity, Fit("law", {"intercept": 0.01, "prefill_tokens": 2e-5,
                                                   "decode_seqs": 3e-3}, 0.0),
                  calibrated.memory, calibrated.num_steps)
    ctx = SimContext(law, {"trace": {"ttft": 3.0, "tpot": 0.3}}, duration=15.0)
    following = SimPredictor(ctx, {"cpu_memory_gib": 0.5}, live=Live())
    following.refresh(0.0)
    assert following.settings["num_gpu_blocks_override"] == 130
    # 201-500-token prompts: a few fit in 2080 tokens, so the running batch is bounded by
    # the pool and, offered 20 req/s, its steps stay short where the calibrated pool
    # (0.5 GiB) admits everything and every step grows
    small = following(mix(8), 20.0)
    long = SimPredictor(ctx, {"cpu_memory_gib": 0.5})(mix(8), 20.0)
    assert small.itl_p50 < 0.5 * long.itl_p50


def test_without_a_cached_profile_the_planner_calibrates_nothing_and_waits_for_a_live_fit(
        tmp_path, monkeypatch):
    """tuner/planner/run.sim_predictor: no calibration cached for the service's model: the
    profile comes from its config alone (no step timed here), predictions are refused by
    name until the service's own steps give a fit, then they are made, speculation
    included, without running the model."""
    import dataclasses
    import json

    from engine.kv_capacity import KVShape
    from engine.model_loader import resolve_model_path
    from paged_api.service import parse_spec
    from tuner.planner import run
    from tuner.sim import calibrate
    from tuner.sim.profile import UNFITTED, Fit
    from tuner.sources.histogram import BucketDistribution, FittedWorkload

    monkeypatch.setenv("PAGED_PROFILE_DIR", str(tmp_path))   # nothing cached

    def refuse(*args, **kwargs):
        raise AssertionError("the planner must not calibrate")
    monkeypatch.setattr(calibrate, "run_calibration", refuse)
    # nor run the model for replies to replay its speculative method on (tuner/sim/drafts.py)
    monkeypatch.setattr("tuner.sim.drafts.model_replies", refuse)
    spec = parse_spec({"model": {"uri": "builtin://default"}, "router": {"enabled": True},
                       "engine": {"speculative": {"method": "ngram",
                                                  "numSpeculativeTokens": 2}},
                       "autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 4,
                                       "slo": {"ttftSeconds": 3.0, "itlSeconds": 0.3}}},
                      name="svc", namespace="team")
    predictor = run.sim_predictor(spec)
    profile = predictor.ctx.profile
    assert predictor.ctx.duration == run.PLANNER_SIM_DURATION == 60.0   # sustained traffic
    predictor.ctx = dataclasses.replace(predictor.ctx, duration=8.0)   # short loads: faster
    config = json.loads((resolve_model_path(None) / "config.json").read_text())
    assert profile.fit.form == UNFITTED and profile.num_steps == 0
    assert profile.memory.vocab_size == config["vocab_size"]
    assert profile.memory.kv_bytes_per_token == KVShape.of(config).bytes_per_token(2)
    assert profile.identity == calibrate.identity("builtin://default", profile.identity.threads)
    edges = (1, 2, 5, 10, 20, 50, 100)
    # short prompts, long replies: decode steps decide the capacity
    fitted = FittedWorkload(prompt=BucketDistribution(edges, (0, 0, 0, 100.0, 0, 0, 0)),
                            output=BucketDistribution(edges, (0, 0, 0, 0, 0, 0, 100.0)),
                            rate=4.0, requests=240, window_s=60, source="test")
    with pytest.raises(ValueError, match="no step-time profile yet"):
        predictor(fitted, 2.0)
    # the service's fit, fixed (a quick calibration under a loaded machine priced a prompt
    # token, and so a draft token, as high as a decode row: speculation then cannot pay):
    # a CPU step dominated by its fixed cost, as this engine's are
    live_fit = Fit("rows", {"intercept": 0.02, "prefill_tokens": 1e-4, "decode_seqs": 1e-3,
                            "draft_tokens": 1e-4}, 0.05)

    from tuner.sim.drafts import DraftModel

    class Live:   # LiveSteps once the service's step series holds enough busy windows
        why = "fitted"
        model = None   # and once its speculation counters do (LiveSteps.drafts)

        def update(self, at, base):
            return dataclasses.replace(base, fit=live_fit), None

        def drafts(self, at, spec):
            assert spec == predictor.settings["speculative_config"]
            return self.model
    predictor.live = Live()
    predictor.refresh(0.0)
    assert predictor.ctx.profile.fit == live_fit
    rejected = predictor(fitted, 2.0).capacity
    assert rejected > 0 and predictor.ctx.acceptance == 0.0
    # the service's own drafts, every one of both tokens accepted: three tokens a step
    Live.model = DraftModel("ngram", 1000, 1000, (0, 1000), (1000, 1000), (1000, 1000))
    predictor.refresh(1.0)
    assert predictor.ctx.drafts_given is Live.model and predictor.ctx.acceptance is None
    # three tokens a step for little more than one step's cost
    assert predictor(fitted, 2.0).capacity > 1.5 * rejected


def test_a_benchmarks_own_namespace_gets_the_default_warmup(profile_file):
    """benchmarks/bench_planner.py and bench_sim_cost.py build their contexts from their
    own namespaces, without the CLIs' warm-up options (they raised AttributeError)."""
    from types import SimpleNamespace

    from tuner.sim.cli import context_for
    from tuner.sim.context import SIM_WARMUP_REQUESTS

    bare = dict(model=None, trace=None, workload="chat", slo=[], users=None,
                length_scale=None, seed=0, duration=8.0, profile=str(profile_file))
    assert context_for(SimpleNamespace(**bare), fixed={}).warmup_requests == SIM_WARMUP_REQUESTS
    # the CLIs' own options still decide, and a negative one is refused by name
    assert context_for(SimpleNamespace(**bare, warmup_requests=7), fixed={}
                       ).warmup_requests == 7
    assert context_for(SimpleNamespace(**bare, sim_warmup_requests=0), fixed={}
                       ).warmup_requests == 0
    with pytest.raises(ValueError, match="--sim-warmup-requests -1"):
        context_for(SimpleNamespace(**bare, sim_warmup_requests=-1), fixed={})
