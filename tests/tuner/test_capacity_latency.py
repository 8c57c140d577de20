"""tuner/search/capacity_latency.py: the confirmed arms' real latency distributions against
the simulator's at the same rate (latency.png)."""
from __future__ import annotations

import json

from loadtests.workloads import get_workload
from tuner.search.capacity_latency import (QUANTILES, SIM_REQUESTS, distributions,
                                          latency_comparison, twin)
from tuner.sim.context import SimContext

from test_sim_settle import PROFILE   # 2 ms a token


def _real_probe(path, records):
    path.mkdir(parents=True)
    lines = [{"event": "start", "t": 0.0}, *records, {"event": "stop", "t": 3.0}]
    (path / "samples.jsonl").write_text("\n".join(json.dumps(r) for r in lines) + "\n")


def test_a_low_rate_knee_is_still_compared_over_enough_simulated_requests(tmp_path):
    """A one-sequence baseline's highest passing probe can sit at 0.2 req/s: the sweep's
    8 s simulated window there holds one or two arrivals, often none (CI's end-to-end
    sweep then had no simulated TTFT at all). The twin runs long enough for SIM_REQUESTS
    arrivals, and an arm whose real probes all failed has no comparison."""
    ctx = SimContext(PROFILE, {"rag": {"ttft": 1.5, "e2e": 6.0}}, workload=get_workload("rag"),
                     users=3, length_scale=0.25, duration=8.0, warmup_requests=0)
    assert len(ctx.run({}, 0.2).samples.records) < 5      # what the sweep's window holds
    rate = 0.2
    _real_probe(tmp_path / "base" / "probe-01", [   # the highest passing probe
        {"start": 0.1 * i, "ttft": 0.05 + 0.01 * i, "itl": [0.01, 0.02]} for i in range(3)])
    _real_probe(tmp_path / "C1" / "probe-00", [{"start": 0.1, "ttft": 9.0, "itl": []}])
    calls = []

    def run(settings, r, duration):
        calls.append((settings, r, duration))
        return ctx.run(settings, r, duration=max(ctx.duration, duration))

    arms = [{"label": "base", "settings": {"max_num_seqs": 1},
             "probes": [[{"rate": 0.8, "passed": False}, {"rate": rate, "passed": True},
                         {"rate": 0.1, "passed": True}]]},
            {"label": "C1", "settings": {"max_num_seqs": 4},
             "probes": [[{"rate": 0.5, "passed": False}]]}]
    compared = latency_comparison(run, tmp_path, arms, 0)
    assert compared["C1"] is None
    assert calls == [({"max_num_seqs": 1}, rate, SIM_REQUESTS / rate)]
    base = compared["base"]
    assert base["rate"] == rate and base["quantiles"] == list(QUANTILES)
    assert base["real"]["ttft"][0] == 0.05 and base["real"]["ttft"][-1] == 0.07
    assert base["real"]["itl"][0] == 0.01 and base["real"]["itl"][-1] == 0.02
    for name in ("ttft", "itl"):
        sim = base["sim"][name]
        assert len(sim) == len(QUANTILES) and sim == sorted(sim) and sim[0] > 0
    # the simulated window held the arrivals it was asked for (Poisson: within 4 sigma)
    simulated = ctx.run({"max_num_seqs": 1}, rate, duration=SIM_REQUESTS / rate)
    assert len(simulated.samples.records) >= SIM_REQUESTS - 4 * SIM_REQUESTS ** 0.5


def test_the_twin_starts_from_an_empty_queue_as_the_real_probe_does(tmp_path):
    """A real probe waits until the previous load drained; the simulated twin serves its
    warm-up, drops what it left running, then opens the window. Run straight on from the
    warm-up at 3x the simulated capacity (2 req/s for one sequence on this profile), its
    window inherits the warm-up's backlog and finishes no request: no simulated TTFT at
    all (CI's end-to-end sweep, 2026-12-06). The sweep's twin finishes some."""
    ctx = SimContext(PROFILE, {"rag": {"ttft": 1.5, "e2e": 6.0}}, workload=get_workload("rag"),
                     users=3, length_scale=0.25, duration=8.0, warmup_requests=50)
    rate, seqs = 6.0, {"max_num_seqs": 1}
    straight = ctx.run(seqs, rate, duration=SIM_REQUESTS / rate).samples.records
    assert straight and not [r for r in straight if r.get("ttft") is not None]
    _real_probe(tmp_path / "base" / "probe-00", [{"start": 0.1, "ttft": 0.2, "itl": [0.01]}])
    arms = [{"label": "base", "settings": seqs, "probes": [[{"rate": rate, "passed": True}]]}]
    compared = latency_comparison(twin(ctx, {"max_num_seqs": 8}), tmp_path, arms, 0)["base"]
    fresh = ctx.run(seqs, rate, duration=SIM_REQUESTS / rate, fresh=True).samples.records
    ttfts = [r["ttft"] for r in fresh if r.get("ttft") is not None]
    assert len(ttfts) >= 10   # the arm's one sequence over the base's 8, from an empty queue
    assert compared["sim"]["ttft"] == distributions(fresh)["ttft"]
    assert len(compared["sim"]["ttft"]) == len(QUANTILES)
