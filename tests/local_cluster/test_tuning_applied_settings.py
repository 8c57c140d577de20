"""Settings beyond spec.engine's scalars as tuned settings in the local cluster: a
PagedInferenceTuning searching numSpeculativeTokens (spec.engine.speculative) or offloadGiB
(the host KV tier, spec.kvCache) passes admission, its trial services and status.history
carry the setting, and Auto applies the winner to the live service, whose pods then start
with the engine's flag. The engines are the stand-in of tests/local_cluster/fake_engine_pkg
(its goodput follows maxNumSeqs, tuning_harness.py)."""
from __future__ import annotations

import json

import pytest

from cluster_harness import LocalCluster
from tuning_harness import ENGINE_DEFAULTS, apply, finished, service, target, tuning

pytestmark = pytest.mark.xdist_group("local_cluster_tuning_applied_settings")
__all__ = ["target"]   # the module's target service (a fixture)


def test_auto_applies_a_winner_with_speculation_and_its_pods_get_the_flag(
        target: LocalCluster) -> None:
    apply(target, tuning("spec", "chat", trials=1, mode="Auto", min_gain=1.2,
                         space={"maxNumSeqs": [4], "numSpeculativeTokens": [2]}))
    status = finished(target, "spec")["status"]
    speculative = {"method": "ngram", "numSpeculativeTokens": 2}
    [trial] = status["history"]
    assert "infeasible" not in trial, trial
    # the line is the trial's patch: the suffix method's keys null, so that a merge onto a
    # target running suffix decoding drops them (the CEL rules refuse them beside ngram)
    line = trial["engine"]["speculative"]
    assert {k: v for k, v in line.items() if v is not None} == speculative
    assert {k for k, v in line.items() if v is None} == {
        "suffixDecodingMaxTreeDepth", "suffixDecodingMaxCachedRequests",
        "suffixDecodingMaxSpecFactor", "suffixDecodingMinTokenProb"}
    assert status["applied"] == "Yes", status
    live = target.json("get", "pis", "chat")["spec"]["engine"]
    # the API server stored the CRD's object (no key pruned) as the tuner patched it
    assert live == {**ENGINE_DEFAULTS, "blockSize": 16, "maxNumSeqs": 4,
                    "speculative": speculative}
    args = target.json("get", "deploy", "chat")["spec"]["template"]["spec"]["containers"][0][
        "args"]
    flag = json.loads(args[args.index("--speculative-config") + 1])
    assert flag == {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 5,
                    "prompt_lookup_min": 5}


def test_auto_applies_a_host_kv_offload_to_spec_kv_cache_and_the_pods_get_it(
        target: LocalCluster) -> None:
    # its own live service: the test above changes "chat"'s engine
    apply(target, service("turns"))
    target.kubectl("wait", "pis/turns", "--for=condition=Ready", "--timeout=90s", timeout=100)
    tuned = tuning("tier", "turns", trials=1, mode="Auto", min_gain=1.2,
                   space={"maxNumSeqs": [4], "offloadGiB": [1]})
    apply(target, tuned)
    status = finished(target, "tier")["status"]
    [trial] = status["history"]
    assert "infeasible" not in trial, trial
    # the line names everything the trial ran: the tier is not in spec.engine
    assert trial["kvCache"] == {"offloadGiB": 1.0} and "kvCache" not in trial["engine"]
    assert status["baseline"]["kvCache"] == {"offloadGiB": 0}, status["baseline"]
    assert [arm["kvCache"] for arm in status["confirmation"]] == [
        {"offloadGiB": 0}, {"offloadGiB": 1.0}], status["confirmation"]
    assert status["applied"] == "Yes", status
    live = target.json("get", "pis", "turns")["spec"]
    assert live["kvCache"] == {"offloadGiB": 1.0} and live["engine"]["maxNumSeqs"] == 4
    container = target.json("get", "deploy", "turns")["spec"]["template"]["spec"][
        "containers"][0]
    args = container["args"]
    assert args[args.index("--kv-offloading-size") + 1] in ("1", "1.0")
    # the host tier lives in the engine's memory: spec.resources.memory 1Gi + 1 GiB
    assert container["resources"]["requests"]["memory"] == "2Gi"
    assert container["resources"]["limits"]["memory"] == "2Gi"
