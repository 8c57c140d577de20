"""The host KV tier's size (kv_offloading_size) as a tuner dimension: searched by default
only for workloads that revisit long prefixes (their WorkloadSpec.tune_also), 0 meaning
off; the local runner turns it into --kv-offloading-size, the in-cluster runner into
spec.kvCache.offloadGiB (outside spec.engine), and the result's patch carries it there."""
from __future__ import annotations

import pytest

from paged_api.settings import SETTINGS as TABLE
from loadtests.workloads import WORKLOAD_NAMES, get_workload
from paged_api.contract import search_space
from tuner.incluster.service_runner import ServiceRunner, merge_patch
from tuner.measure.loadgen import LoadSpec
from tuner.measure.local import EngineLaunch
from tuner.measure.runner import Infeasible, TrialRequest
from tuner.search.confirm import engine_defaults
from paged_api.search_space import (DEFAULT_SPACE, SETTINGS, build_space, engine_values,
                                 to_engine_spec, to_spec_patch)

NAME = "kv_offloading_size"


def names(space):
    return {p.name for p in space}


def test_the_host_tier_is_out_of_the_default_space_and_in_for_workloads_that_ask():
    assert NAME not in DEFAULT_SPACE and NAME not in names(build_space())
    asking = {w for w in WORKLOAD_NAMES if NAME in get_workload(w).tune_also}
    assert asking == {"chat", "rag"}              # multi-turn history, shared documents
    for workload in WORKLOAD_NAMES:
        space = {p.name: p for p in build_space(also=get_workload(workload).tune_also)}
        assert (NAME in space) == (workload in asking), workload
        if NAME in space:
            assert space[NAME].choices == (0.0, 0.5, 1.0, 2.0, 4.0)   # 0: off
        assert set(space) >= set(DEFAULT_SPACE)   # the workload adds, never removes
    # every name a workload asks for is a setting the tuner can vary
    assert all(n in SETTINGS for w in WORKLOAD_NAMES for n in get_workload(w).tune_also)
    # the in-cluster default space (spec.searchSpace unset) stays the table's default
    assert NAME not in names(search_space(None))


def test_zero_is_off_and_is_the_baseline():
    assert engine_defaults([NAME]) == {NAME: 0}   # the engine's default: no host tier
    assert engine_values({NAME: 0.0, "max_num_seqs": 8}) == {NAME: None, "max_num_seqs": 8}
    assert engine_values({NAME: 2.0}) == {NAME: 2.0}
    assert TABLE[NAME].tune_off == 0


@pytest.mark.parametrize("size, engine_sees", [(2.0, 2.0), (0.5, 0.5), (0.0, None)])
def test_the_local_runner_starts_the_engine_with_the_flag(tmp_path, size, engine_sees):
    import argparse

    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs
    process = EngineLaunch().process({NAME: size, "max_num_seqs": 8}, tmp_path / "e.log")
    parser = argparse.ArgumentParser()
    add_serve_arguments(parser)
    argv = process.command[process.command.index("--host"):]
    kwargs = engine_kwargs(parser.parse_args(argv))   # what `python -m engine serve` reads
    assert kwargs.get(NAME) == engine_sees and kwargs["max_num_seqs"] == 8
    assert ("--kv-offloading-size" in argv) == (engine_sees is not None)


def test_spec_engine_never_holds_it_and_the_patch_puts_it_in_spec_kv_cache():
    settings = {NAME: 2, "max_num_seqs": 8}
    assert to_engine_spec(settings) == {"maxNumSeqs": 8}
    assert to_spec_patch(settings) == {"engine": {"maxNumSeqs": 8},
                                       "kvCache": {"offloadGiB": 2.0}}
    assert to_spec_patch({NAME: 0}) == {"engine": {}, "kvCache": {"offloadGiB": None}}
    assert to_spec_patch({"max_num_seqs": 8}) == {"engine": {"maxNumSeqs": 8}}


class RecordingCluster:
    """create_trial records the trial's spec; the service never gets ready."""

    def __init__(self) -> None:
        self.created = []
        self.stopping = type("Never", (), {"is_set": staticmethod(lambda: False)})()

    def create_trial(self, name, target, engine, owner):
        self.created.append({**target["spec"], "engine": engine})

    def wait_ready(self, name, timeout):
        raise Infeasible("not started in this test")

    def delete_service(self, name, wait=False):
        pass


DISK = {"sizeGiB": 10, "volume": {"emptyDir": {}}}


@pytest.mark.parametrize("target_kv, size, expected", [
    (None, 2.0, {"offloadGiB": 2.0}),
    ({"offloadGiB": 8, "disk": DISK}, 0.5, {"offloadGiB": 0.5, "disk": DISK}),
    ({"offloadGiB": 8, "disk": DISK}, 0.0, {"disk": DISK}),       # off: the disk tier stays
    (None, 0.0, {}),                                              # off, and none before
])
def test_the_service_runner_writes_spec_kv_cache_offload_gib(tmp_path, target_kv, size,
                                                             expected):
    target = {"spec": {"model": {"uri": "builtin://default"}, "engine": {"maxNumSeqs": 64}}}
    if target_kv is not None:
        target["spec"]["kvCache"] = target_kv
    cluster = RecordingCluster()
    runner = ServiceRunner(cluster, "tune", {"uid": "u"}, target,
                           LoadSpec(workload="chat", duration=1, users=1), {}, startup_timeout=1)
    request = TrialRequest(name="trial-0001", seed=0, workdir=tmp_path,
                           settings={NAME: size, "max_num_seqs": 16})
    with pytest.raises(Infeasible):
        runner.run(request)
    [spec] = cluster.created
    assert spec["kvCache"] == expected
    assert spec["engine"] == {"maxNumSeqs": 16}          # nothing of the tier in spec.engine
    assert target["spec"].get("kvCache") == target_kv    # the target itself is untouched


def test_a_trial_spec_with_the_host_tier_is_one_the_operator_serves():
    from paged_operator import manifests
    from paged_api.service import parse_spec
    spec = {"model": {"uri": "builtin://default"}, "resources": {"memory": "2Gi"}}
    spec = merge_patch(spec, to_spec_patch({NAME: 1.0}))
    container = manifests.deployment(parse_spec(spec, name="t", namespace="d"))[
        "spec"]["template"]["spec"]["containers"][0]
    assert container["args"][container["args"].index("--kv-offloading-size") + 1] == "1.0"
    assert container["resources"]["limits"]["memory"] == "3Gi"


def test_merge_patch_drops_nulls_inside_a_new_object():
    assert merge_patch({}, {"kvCache": {"offloadGiB": None}}) == {"kvCache": {}}
    assert merge_patch({"a": 1}, {"b": {"c": None, "d": 2}}) == {"a": 1, "b": {"d": 2}}


class Captured(Exception):
    pass


@pytest.mark.parametrize("workload, searched", [("chat", True), ("rag", True),
                                                ("summarize", False), ("code", False)])
def test_python_m_tuner_sweep_searches_the_workloads_extra_settings(monkeypatch, tmp_path,
                                                                     workload, searched):
    import tuner.search.sweep
    from tuner.__main__ import main

    def run_sweep(config, **_):
        raise Captured(config)
    monkeypatch.setattr(tuner.search.sweep, "run_sweep", run_sweep)
    with pytest.raises(Captured) as got:
        main(["sweep", "--workload", workload, "--objective", "goodput",
              "--out-dir", str(tmp_path)])
    config = got.value.args[0]
    assert (NAME in names(config.space)) == searched
    assert config.baseline.params.get(NAME, 0) == 0      # the baseline runs without a tier


def test_the_patch_with_a_host_tier_is_validated_against_the_crd():
    from tuner.search.report import validate_patch
    assert validate_patch({"spec": to_spec_patch({NAME: 2, "max_num_seqs": 8})}) is True
    assert validate_patch({"spec": to_spec_patch({NAME: 0})}) is True    # null: removed
    with pytest.raises(ValueError, match="^spec.kvCache.offloadGiB: -1"):
        validate_patch({"spec": {"engine": {}, "kvCache": {"offloadGiB": -1}}})


def test_a_baseline_file_with_spec_kv_cache_keeps_its_host_tier(tmp_path):
    from tuner.search.confirm import load_baseline
    path = tmp_path / "best.yaml"
    path.write_text("spec:\n  engine: {maxNumSeqs: 8}\n  kvCache: {offloadGiB: 2}\n")
    baseline = load_baseline(str(path), fixed={}, searched=[NAME, "max_num_seqs"])
    assert baseline.params == {"max_num_seqs": 8, NAME: 2.0}
    path.write_text("spec:\n  engine: {maxNumSeqs: 8}\n  kvCache: {offloadGiB: -2}\n")
    with pytest.raises(ValueError, match="spec.kvCache.offloadGiB must be a number >= 0"):
        load_baseline(str(path), fixed={}, searched=[NAME])
    path.write_text("engine: {maxNumSeqs: 8}\n")               # no tier: the engine's default
    assert load_baseline(str(path), fixed={}, searched=[NAME]).params == {"max_num_seqs": 8}


def test_a_trial_gets_its_own_disk_tier_instead_of_the_targets_claim(tmp_path):
    claim = {"sizeGiB": 50, "volume": {"persistentVolumeClaim": {"claimName": "kv-blocks"}}}
    target = {"spec": {"model": {"uri": "builtin://default"}, "engine": {},
                       "kvCache": {"offloadGiB": 4, "disk": claim}}}
    cluster = RecordingCluster()
    runner = ServiceRunner(cluster, "tune", {"uid": "u"}, target,
                           LoadSpec(workload="chat", duration=1, users=1), {}, startup_timeout=1)
    for settings in ({NAME: 1.0}, {"max_num_seqs": 8}):   # searched or not
        with pytest.raises(Infeasible):
            runner.run(TrialRequest(name="trial-0001", seed=0, workdir=tmp_path,
                                    settings=settings))
    assert [s["kvCache"]["disk"] for s in cluster.created] == \
        [{"sizeGiB": 50, "volume": {"emptyDir": {}}}] * 2
    assert [s["kvCache"]["offloadGiB"] for s in cluster.created] == [1.0, 4]
    assert target["spec"]["kvCache"]["disk"] is claim and "persistentVolumeClaim" in \
        claim["volume"]                                     # the target is untouched
