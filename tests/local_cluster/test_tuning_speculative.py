"""Speculative decoding as a tuned setting in the local cluster: a PagedInferenceTuning
searching numSpeculativeTokens passes admission, its trial services carry
spec.engine.speculative, and Auto applies the winner to the live service, whose pods then
start with --speculative-config. The engines are the stand-in of
tests/local_cluster/fake_engine_pkg (its goodput follows maxNumSeqs, tuning_harness.py)."""
from __future__ import annotations

import json

import pytest

from cluster_harness import LocalCluster
from tuning_harness import ENGINE_DEFAULTS, apply, finished, target, tuning

pytestmark = pytest.mark.xdist_group("local_cluster_tuning_speculative")
__all__ = ["target"]   # the module's target service (a fixture)


def test_auto_applies_a_winner_with_speculation_and_its_pods_get_the_flag(
        target: LocalCluster) -> None:
    apply(target, tuning("spec", "chat", trials=1, mode="Auto", min_gain=1.2,
                         space={"maxNumSeqs": [4], "numSpeculativeTokens": [2]}))
    status = finished(target, "spec")["status"]
    speculative = {"method": "ngram", "numSpeculativeTokens": 2}
    [trial] = status["history"]
    assert "infeasible" not in trial and trial["engine"]["speculative"] == speculative
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
