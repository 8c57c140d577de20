"""A trial service the API server refuses (issue 27): a host KV tier on a target with
engine.enablePrefixCaching false breaks the PagedInferenceService CRD's kvCache rule; the
trial is Infeasible with the rule's message, not a harness failure. The fake API server
runs the CRD's own CEL rules (tests/charts/cel_tools.py) on the trial's body."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tuner.incluster.cluster import Cluster
from tuner.incluster.service_runner import ServiceRunner
from tuner.measure.loadgen import LoadSpec
from tuner.measure.runner import Infeasible, TrialRequest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tests" / "charts"))
from cel_tools import violations  # noqa: E402

CRD = yaml.safe_load((ROOT / "charts" / "paged-inference-operator" / "crds" /
                      "pagedinferenceservices.yaml").read_text())
SCHEMA = CRD["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
RULE = "kvCache needs engine.enablePrefixCaching"


class Created(Exception):
    pass


class FakeApi:
    """create_namespaced_custom_object as the API server answers it: 422 with the broken
    rule's message, or 500 when told to fail."""

    def __init__(self, status: int = 422) -> None:
        self.status, self.created = status, []

    def create_namespaced_custom_object(self, group, version, ns, plural, body):
        broken = violations(SCHEMA, body)
        if broken or self.status != 422:
            status = 422 if broken else self.status
            exc = ApiException(status=status, reason="Unprocessable Entity")
            exc.body = json.dumps({"kind": "Status", "reason": "Invalid", "message": (
                f'PagedInferenceService.serving.pagedinference.dev "{body["metadata"]["name"]}"'
                f' is invalid: spec: Invalid value: "object": '
                f'{"; ".join(r.message for r in broken) or "boom"}')})
            raise exc
        self.created.append(body)
        raise Created


def runner_for(api: FakeApi, engine: dict) -> ServiceRunner:
    cluster = Cluster(client.ApiClient(), "ns", "tune")
    cluster.custom = api
    cluster.delete_service = lambda name, wait=False, timeout=120: None
    target = {"metadata": {"name": "svc"},
              "spec": {"model": {"uri": "builtin://default"}, "engine": engine}}
    return ServiceRunner(cluster, "tune", {"uid": "u"}, target,
                         LoadSpec(workload="chat", duration=1, users=1), {}, startup_timeout=1)


def request(tmp_path, **settings) -> TrialRequest:
    return TrialRequest(name="trial-0003", seed=0, workdir=tmp_path, settings=settings)


def test_a_host_tier_without_prefix_caching_is_an_infeasible_trial(tmp_path) -> None:
    runner = runner_for(FakeApi(), {"enablePrefixCaching": False})
    with pytest.raises(Infeasible) as refused:
        runner.run(request(tmp_path, kv_offloading_size=2.0, max_num_seqs=8))
    assert refused.value.reason.startswith("tune-t3 refused by the API server: ")
    assert RULE in refused.value.reason


@pytest.mark.parametrize("engine, settings", [
    ({"enablePrefixCaching": False}, {"kv_offloading_size": 0}),    # no host tier: fine
    ({}, {"kv_offloading_size": 2.0}),                               # prefix caching on
])
def test_a_valid_trial_is_created(tmp_path, engine, settings) -> None:
    api = FakeApi()
    with pytest.raises(Created):
        runner_for(api, engine).run(request(tmp_path, **settings))
    assert [b["metadata"]["name"] for b in api.created] == ["tune-t3"]


def test_another_api_error_stays_a_harness_failure(tmp_path) -> None:
    with pytest.raises(ApiException):
        runner_for(FakeApi(status=500), {}).run(request(tmp_path, max_num_seqs=8))
