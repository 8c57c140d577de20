"""Two writers of one conditions list (paged_api/conditions.py): the operator writes Ready,
Progressing and Degraded and keeps the SLO planner's Planning as found, in both of its
status paths; recomputing an unchanged state keeps every lastTransitionTime."""
from __future__ import annotations

from paged_api.service import parse_spec
from paged_operator import status

PLANNING = {"type": "Planning", "status": "False", "reason": "PlannerHeld",
            "message": "unchanged: Prometheus at http://prom:9090 did not answer",
            "lastTransitionTime": "2026-12-04T07:00:00Z", "observedGeneration": 3}
SPEC = parse_spec({"model": {"uri": "hf://m"}}, name="s", namespace="n")
DEPLOYMENT = {"metadata": {"generation": 2},
              "spec": {"replicas": 2},
              "status": {"observedGeneration": 2, "replicas": 2, "readyReplicas": 2,
                         "updatedReplicas": 2}}


def test_the_operator_keeps_the_planners_condition_when_it_writes_its_own():
    first = status.from_deployment(SPEC, DEPLOYMENT, generation=3,
                                   previous={"conditions": [PLANNING]})
    assert [c["type"] for c in first["conditions"]] == ["Ready", "Progressing", "Degraded",
                                                         "Planning"]
    assert first["conditions"][3] == PLANNING
    assert first["conditions"][0]["status"] == "True"
    # again from its own output: nothing duplicated, nothing moved
    again = status.from_deployment(SPEC, DEPLOYMENT, generation=3, previous=first)
    assert again["conditions"] == first["conditions"]


def test_a_degraded_status_keeps_it_too():
    previous = status.from_deployment(SPEC, DEPLOYMENT, generation=3,
                                      previous={"conditions": [PLANNING]})
    bad = status.degraded("spec.engine.blockSize: must be 1..256", reason="InvalidSpec",
                          generation=4, previous=previous)
    types = [c["type"] for c in bad["conditions"]]
    assert types == ["Ready", "Progressing", "Degraded", "Planning"]
    assert bad["conditions"][2]["status"] == "True" and bad["conditions"][3] == PLANNING
    # a degraded status without an earlier valid one keeps it as well
    fresh = status.degraded("bad", reason="InvalidSpec", generation=1,
                            previous={"conditions": [PLANNING]})
    assert [c["type"] for c in fresh["conditions"]] == types
