"""tuner/search/sim_pool.py: the sweep's simulated settings over forked worker processes,
each setting's capacity what the sweep's own process finds for it."""
from __future__ import annotations

import os

import pytest

import tuner.search.capacity_sweep as cs
from loadtests.workloads import get_workload
from paged_api.search_space import build_space
from tuner.search.capacity_search import simulate_point, simulated_search
from tuner.search.sim_pool import SimPool, default_workers, usable_cpus
from tuner.sim.context import SimContext

from test_sim_settle import PROFILE   # 2 ms a token


def _where(plan, settings, *, start):
    return (os.getpid(), plan.tag, settings["n"], start)


def test_the_pool_runs_each_job_in_a_forked_worker_in_order():
    """Every job in a worker (not the sweep's process), the answers in the jobs' order, and
    the workers see the plan as it stood when the pool opened (forked, not pickled: a
    lambda and a tokenizer need not pickle)."""
    plan = type("Plan", (), {})()
    plan.tag = "before"
    pool = SimPool(plan, 2, _where)
    plan.tag = "forked"
    with pool:
        done = pool.map([({"n": n}, 1.5 * n) for n in range(6)])
    assert [(tag, n, start) for _, tag, n, start in done] == [
        ("forked", n, 1.5 * n) for n in range(6)]
    pids = {pid for pid, *_ in done}
    assert os.getpid() not in pids and 1 <= len(pids) <= 2
    with SimPool(plan, 1, _where) as alone:   # one worker: the sweep's own process
        assert {pid for pid, *_ in alone.map([({"n": 0}, 1.0)])} == {os.getpid()}
    with pytest.raises(ValueError, match="--sim-workers must be >= 1"):
        SimPool(plan, 0, _where)
    assert 1 <= default_workers() <= min(8, usable_cpus())


def test_a_search_over_two_workers_finds_what_one_process_finds_for_each_setting():
    """simulated_search with two workers: as many points as trials, each setting's capacity
    the one simulate_point finds in this process from the same start (the first probe's
    rate), repeats simulated once, and the best of a batch starts the next."""
    sim = SimContext(PROFILE, {"rag": {"ttft": 1.5, "e2e": 6.0}}, workload=get_workload("rag"),
                     users=3, length_scale=0.25, duration=8.0, warmup_requests=0)
    space = build_space(params=["max_num_seqs=1..4", "block_size=16",
                                "gpu_memory_utilization=0.9", "num_speculative_tokens=none",
                                "max_num_batched_tokens=none", "kv_offloading_size=none"])
    logs: list[str] = []
    plan = cs.CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": 0.5}, trials=6, workers=2,
                           log=logs.append)
    base, points = simulated_search(plan, space, fixed={}, baseline={"max_num_seqs": 1},
                                    seed=0)
    assert len(points) == 6 and all(p.capacity is not None for p in points)
    assert len([line for line in logs if line.startswith("sim ")]) == 6
    alone = cs.CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": 0.5}, trials=6)
    distinct = {}
    for point in points:
        distinct.setdefault(point.params["max_num_seqs"], point)
    assert len(distinct) >= 2 < len(points)   # a space of 4 values: some repeat
    for seqs, point in distinct.items():
        start = point.result.probes[0]["rate"]
        again = simulate_point(alone, {"max_num_seqs": seqs}, start=start)
        assert again.capacity == point.capacity and again.result.probes == point.result.probes
    # each batch of two starts from the best capacity told before it (the baseline's first)
    best, seen = base.capacity, set()
    for batch in (points[i:i + 2] for i in range(0, len(points), 2)):
        for point in batch:
            if id(point) not in seen:   # a repeat keeps the start it was simulated from
                assert point.result.probes[0]["rate"] == max(best, 0.5)
                seen.add(id(point))
        best = max([best] + [p.capacity for p in batch])


def test_the_model_replies_run_once_before_the_fork_not_in_each_worker(monkeypatch, tmp_path):
    """A space that speculates over two workers: the model's replies (which a speculative
    setting's drafts replay, tuner/sim/drafts.py) run once, in the sweep's own process
    before the fork, and the workers use those; a space without speculation runs none."""
    from tuner.sim.drafts import Reply

    calls = tmp_path / "calls"

    def replies(model, requests, *, seed=0, **_):
        with calls.open("a") as f:
            f.write(f"{os.getpid()}\n")
        # each reply repeats its prompt's tail: n-gram drafts find it
        return [Reply(list(r.prompt_ids), (list(r.prompt_ids[-8:]) * 8)[:r.max_tokens],
                      r.max_tokens) for r in requests]

    monkeypatch.setattr("tuner.sim.drafts.model_replies", replies)

    def search(spec: str, sim: SimContext):
        space = build_space(params=["max_num_seqs=1..4", "block_size=16",
                                    "gpu_memory_utilization=0.9", spec,
                                    "max_num_batched_tokens=none", "kv_offloading_size=none"])
        plan = cs.CapacityPlan(sim=sim, sim_base={"cpu_memory_gib": 0.5}, trials=4,
                               workers=2, log=lambda _: None)
        return simulated_search(plan, space, fixed={}, baseline={"max_num_seqs": 1}, seed=1)

    reported = tmp_path / "reported"

    def log(line):   # who reported which replay
        with reported.open("a") as f:
            f.write(f"{os.getpid()} {line}\n")

    def sim() -> SimContext:
        return SimContext(PROFILE, {"rag": {"ttft": 1.5, "e2e": 6.0}},
                          workload=get_workload("rag"), users=3, length_scale=0.25,
                          duration=8.0, warmup_requests=0, log=log)

    plain = sim()
    search("num_speculative_tokens=none", plain)
    assert not calls.exists() and plain.replies is None
    drafting = sim()
    _, points = search("num_speculative_tokens=4", drafting)
    assert all(p.params["num_speculative_tokens"] == 4 and p.capacity for p in points)
    assert calls.read_text().split() == [str(os.getpid())]
    assert drafting.replies is not None
    # each method's replay reported once, by the sweep's process (not once per worker)
    replays = [line for line in reported.read_text().splitlines() if "decode steps" in line]
    assert [line.split(" ", 2)[:2] for line in replays] == [[str(os.getpid()), "simulator:"]]
    reported.unlink()
    several = sim()
    _, points = search("num_speculative_tokens=2,4,suffix:8", several)
    replays = [line for line in reported.read_text().splitlines() if "decode steps" in line]
    assert sorted(line.split()[2:4] for line in replays) == [
        ["ngram", "k=2"], ["ngram", "k=4"], ["suffix", "k=8"]]
    assert {line.split()[0] for line in replays} == {str(os.getpid())}
