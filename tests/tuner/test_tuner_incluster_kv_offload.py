"""The host KV tier in the in-cluster tuning (issue 27): spec.searchSpace.offloadGiB, the
workload's opt-in dimensions in the Job's default space (the operator's parse_tuning gives
the table's defaults: its image has no workload definitions), the baseline, the capacity
service."""
from __future__ import annotations

import pytest

from paged_api.contract import parse_tuning, spec_error
from paged_api.search_space import Param

BASE = {"targetRef": {"name": "svc"}}


def job_space(spec: dict) -> tuple[Param, ...]:
    """The space the Job searches for `spec`."""
    from tuner.incluster.load import with_opt_in

    spec = {**BASE, **spec}
    return with_opt_in(parse_tuning(spec), spec).space


def names(spec: dict) -> list[str]:
    return [p.name for p in job_space(spec)]


def test_search_space_offload_gib_is_the_host_tier_as_a_list_or_a_range() -> None:
    space = parse_tuning({**BASE, "searchSpace": {"offloadGiB": [0, 2, 4]}}).space
    assert space == (Param("kv_offloading_size", choices=(0.0, 2.0, 4.0)),)
    space = parse_tuning({**BASE, "searchSpace": {"offloadGiB": {"min": 0.5, "max": 8},
                                                  "maxNumSeqs": [8, 16]}}).space
    assert space == (Param("kv_offloading_size", low=0.5, high=8.0),
                     Param("max_num_seqs", choices=(8, 16)))


@pytest.mark.parametrize("value, words", [
    ([-1], "kv_offloading_size"),
    ({"min": 1}, "a range is"),
    ("2", "expected a list"),
])
def test_a_bad_offload_gib_names_the_field(value, words) -> None:
    error = spec_error({**BASE, "searchSpace": {"offloadGiB": value}})
    assert error is not None and "spec.searchSpace.offloadGiB" in error and words in error


@pytest.mark.parametrize("workload, host_tier", [
    ("chat", True), ("rag", True), ("summarize", False), ("code", False), ("mixed", False)])
def test_an_unset_search_space_adds_the_workloads_opt_in_dimensions(workload, host_tier):
    from loadtests.workloads import get_workload

    found = names({"workload": workload})
    assert ("kv_offloading_size" in found) == host_tier
    # the operator's own parse (and SpecValid) is the table's defaults, for any workload
    assert "kv_offloading_size" not in [p.name for p in parse_tuning(
        {**BASE, "workload": workload}).space]
    assert set(get_workload(workload).tune_also) <= set(found)
    assert found[:4] == ["block_size", "gpu_memory_utilization", "max_num_seqs",
                         "max_num_batched_tokens"]


def test_the_default_workload_is_chat_and_a_trace_adds_nothing() -> None:
    assert "kv_offloading_size" in names({})
    trace = {"workloadFrom": {"trace": {"url": "https://x/t.jsonl"}}}
    assert "kv_offloading_size" not in names(trace)
    # a given searchSpace is the whole space, whatever the workload asks for
    assert names({"workload": "chat", "searchSpace": {"maxNumSeqs": [8]}}) == ["max_num_seqs"]


def test_the_baseline_is_the_targets_host_tier_or_none() -> None:
    from paged_api.search_space import sections_baseline as outside_baseline

    space = job_space({"workload": "chat"})
    assert outside_baseline({"kvCache": {"offloadGiB": 2}}, space) == {"kv_offloading_size": 2.0}
    assert outside_baseline({"engine": {}}, space) == {"kv_offloading_size": 0}
    # a space without the dimension leaves the baseline's host tier out of its params
    assert outside_baseline({"kvCache": {"offloadGiB": 2}},
                            job_space({"workload": "code"})) == {}


class Stop(Exception):
    pass


@pytest.mark.parametrize("kv_cache, want", [
    ({"offloadGiB": 2.0}, {"offloadGiB": 2.0, "disk": {"sizeGiB": 4,
                                                       "volume": {"emptyDir": {}}}}),
    ({"offloadGiB": None}, {"disk": {"sizeGiB": 4, "volume": {"emptyDir": {}}}}),
    (None, {"offloadGiB": 1, "disk": {"sizeGiB": 4, "volume": {"emptyDir": {}}}}),
])
def test_the_capacity_service_has_the_winners_host_tier_and_its_own_disk(kv_cache, want):
    from types import SimpleNamespace

    from tuner.incluster import load as cluster_load

    created = []

    def wait_ready(name, timeout):
        raise Stop
    cluster = SimpleNamespace(
        create_trial=lambda name, target, engine, owner: created.append((target, engine)),
        wait_ready=wait_ready, delete_service=lambda name, wait: None)
    disk = {"sizeGiB": 4, "volume": {"persistentVolumeClaim": {"claimName": "kv"}}}
    target = {"metadata": {"name": "svc"},
              "spec": {"engine": {"maxNumSeqs": 8}, "kvCache": {"offloadGiB": 1, "disk": disk}}}
    run = SimpleNamespace(spec=SimpleNamespace(capacity=None, startup_timeout=1), name="t",
                          cluster=cluster, owner={}, target=target,
                          target_engine={"maxNumSeqs": 8})
    with pytest.raises(Stop):
        cluster_load.measure_capacity(run, {"maxNumSeqs": 4}, start=1.0,
                                      sections=kv_cache and {"kvCache": kv_cache})
    assert created[0][0]["spec"]["kvCache"] == want and created[0][1] == {"maxNumSeqs": 4}
    assert target["spec"]["kvCache"]["disk"] is disk   # the target itself unchanged


@pytest.mark.parametrize("workload, host_tier", [("rag", True), ("code", False)])
def test_the_job_searches_the_workloads_opt_in_space(tmp_path, monkeypatch, workload,
                                                     host_tier) -> None:
    """python -m tuner tune --cluster: the space the Tuning gets, with a fake cluster."""
    from types import SimpleNamespace

    from tuner.incluster import job

    body = {"metadata": {"name": "tune"}, "spec": {**BASE, "workload": workload}}
    fake = SimpleNamespace(ns="ns", get_tuning=lambda: body, stopping=SimpleNamespace(
        is_set=lambda: False), get_service=lambda name: {"spec": {"engine": {}}},
        write_status=lambda fields: None)
    monkeypatch.setattr(job, "load_client", lambda: None)
    monkeypatch.setattr(job, "Cluster", lambda api, ns, name: fake)
    monkeypatch.setattr(job.cluster_load, "workload_source", lambda spec, **kw: None)
    monkeypatch.setattr(job.signal, "signal", lambda *a: None)
    seen = []

    class Tuning:
        def __init__(self, cluster, body, spec, *rest) -> None:
            seen.append(spec)

        def run(self, storage, *, index) -> None:
            pass
    monkeypatch.setattr(job, "Tuning", Tuning)
    assert job.main(["--cluster", "--name", "tune", "--out-dir", str(tmp_path)]) == 0
    assert ("kv_offloading_size" in [p.name for p in seen[0].space]) == host_tier
