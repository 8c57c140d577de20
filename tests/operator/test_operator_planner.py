"""spec.autoscaling.mode slo: the SLO planner's children replace the HPA and KEDA's
ScaledObject, the engine Deployment leaves its replicas to the planner, and turning the mode
back to metrics deletes the planner's children (operator/paged_operator/manifests_planner.py)."""
from __future__ import annotations

import asyncio
from typing import Any

import pytest

from paged_operator.reconcile import desired_children
from paged_api.service import parse_spec

SLO = {"mode": "slo", "minReplicas": 0, "maxReplicas": 4, "slo": {"ttftSeconds": 2}}
PLANNER = [("ServiceAccount", "svc-planner"), ("Role", "svc-planner"),
           ("RoleBinding", "svc-planner"), ("Deployment", "svc-planner")]


class Discovery:
    def __init__(self, keda: bool, monitors: bool = False) -> None:
        self.keda, self.monitors = keda, monitors

    async def has(self, api: Any, kind_name: str) -> bool:
        return (self.keda and kind_name == "ScaledObject") or \
            (self.monitors and kind_name == "PodMonitor")


def children(autoscaling: dict | None, *, keda: bool, router: bool = True,
             monitors: bool = False):
    spec = parse_spec({"model": {"uri": "hf://org/model"}, "router": {"enabled": router},
                       **({"autoscaling": autoscaling} if autoscaling else {})},
                      name="svc", namespace="team")
    wanted, unwanted = asyncio.run(desired_children(
        None, Discovery(keda, monitors), spec))  # type: ignore[arg-type]
    return {(c["kind"], c["metadata"]["name"]): c for c in wanted}, set(unwanted)


@pytest.mark.parametrize("keda", [False, True])
def test_mode_slo_makes_the_planner_and_no_autoscaler(keda):
    wanted, unwanted = children(SLO, keda=keda)
    assert all(key in wanted for key in PLANNER)
    assert ("HorizontalPodAutoscaler", "svc") in unwanted
    assert (("ScaledObject", "svc") in unwanted) == keda   # without KEDA: no such API
    assert "replicas" not in wanted[("Deployment", "svc")]["spec"]   # the planner's to set
    planner = wanted[("Deployment", "svc-planner")]["spec"]
    assert planner["replicas"] == 1 and planner["strategy"] == {"type": "Recreate"}
    pod = planner["template"]["spec"]
    assert pod["serviceAccountName"] == "svc-planner"
    assert pod["containers"][0]["command"] == ["python", "-m", "tuner", "plan", "--name", "svc",
                                               "--metrics-port", "9090"]
    assert pod["containers"][0]["ports"] == [{"name": "metrics", "containerPort": 9090,
                                              "protocol": "TCP"}]
    # the planner's pods are not the engine's: the Service and the HPA never select them
    engine_selector = wanted[("Deployment", "svc")]["spec"]["selector"]["matchLabels"]
    assert not engine_selector.items() <= planner["template"]["metadata"]["labels"].items()
    rules = wanted[("Role", "svc-planner")]["rules"]
    scale = next(r for r in rules if r["resources"] == ["deployments/scale"])
    assert scale["resourceNames"] == ["svc"]   # this service's Deployment only
    binding = wanted[("RoleBinding", "svc-planner")]
    assert binding["subjects"] == [{"kind": "ServiceAccount", "name": "svc-planner",
                                    "namespace": "team"}]


def test_a_service_the_planner_may_scale_to_zero_has_a_router_that_holds_requests():
    args = children(SLO, keda=False)[0][("Deployment", "svc-router")]["spec"]["template"][
        "spec"]["containers"][0]["args"]
    assert args[args.index("--cold-start-hold") + 1] == "600"   # min(600, startup timeout)
    for floor in ({**SLO, "minReplicas": 1}, {"maxReplicas": 3}):
        args = children(floor, keda=False)[0][("Deployment", "svc-router")]["spec"][
            "template"]["spec"]["containers"][0]["args"]
        assert "--cold-start-hold" not in args


@pytest.mark.parametrize("autoscaling", [{"maxReplicas": 3}, None])
def test_mode_metrics_or_none_deletes_the_planners_children(autoscaling):
    wanted, unwanted = children(autoscaling, keda=False)
    assert set(PLANNER) <= unwanted and not any(key in wanted for key in PLANNER)
    assert (("HorizontalPodAutoscaler", "svc") in wanted) == (autoscaling is not None)


def test_with_the_prometheus_operator_the_planners_metrics_get_a_pod_monitor():
    """A PodMonitor `<name>-planner` selects the planner pod by its labels and scrapes the
    container port the planner serves on; without the PodMonitor API nothing is asked of
    it; with mode metrics it goes."""
    wanted, _ = children(SLO, keda=False, monitors=True)
    monitor = wanted[("PodMonitor", "svc-planner")]
    pod = wanted[("Deployment", "svc-planner")]["spec"]["template"]
    assert monitor["spec"]["selector"]["matchLabels"].items() <= \
        pod["metadata"]["labels"].items()
    engine = wanted[("Deployment", "svc")]["spec"]["template"]["metadata"]["labels"]
    assert not monitor["spec"]["selector"]["matchLabels"].items() <= engine.items()
    (endpoint,) = monitor["spec"]["podMetricsEndpoints"]
    assert endpoint["port"] in [p["name"] for p in pod["spec"]["containers"][0]["ports"]]
    assert ("PodMonitor", "svc") in wanted   # the engines' own, beside it
    wanted, unwanted = children(SLO, keda=False)
    assert ("PodMonitor", "svc-planner") not in set(wanted) | unwanted
    wanted, unwanted = children({"maxReplicas": 3}, keda=False, monitors=True)
    assert ("PodMonitor", "svc-planner") in unwanted
