"""The local API server answers 422 for a resource its CRD refuses (schema or CEL rule),
and a tuning trial it refuses ends infeasible: the in-cluster tuner tells an infeasible
trial from a harness failure by that code alone (tuner/incluster/cluster.py), while
kubectl's message does not depend on it. The real server (localcluster/api) in this
process, over HTTP, with the chart's CRDs; the real kubernetes client and tuner Cluster."""
from __future__ import annotations

import json
import urllib.error
import urllib.request

import pytest
from local_api import api_url, kube_client
from tuner.incluster.cluster import Cluster
from tuner.incluster.service_runner import ServiceRunner
from tuner.measure.loadgen import LoadSpec
from tuner.measure.runner import Infeasible, TrialRequest

SERVICES = "/apis/serving.pagedinference.dev/v1alpha1/namespaces/default/pagedinferenceservices"
RULE = "kvCache needs engine.enablePrefixCaching"
__all__ = ["api_url"]   # the module's API server (a fixture)


def create(api_url: str, spec: dict) -> tuple[int, dict]:
    body = {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": "refused"},
            "spec": {"model": {"uri": "builtin://default"}, **spec}}
    req = urllib.request.Request(api_url + SERVICES, data=json.dumps(body).encode(),
                                 method="POST", headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=10) as reply:
            return reply.status, json.loads(reply.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


@pytest.mark.parametrize("spec, words", [
    ({"replicas": "two"}, "spec.replicas: Invalid value: \"string\""),         # schema type
    ({"replicas": -1}, "spec.replicas: Invalid value: -1"),                      # minimum
    ({"engine": {"enablePrefixCaching": False},
      "kvCache": {"offloadGiB": 2}}, RULE),                         # CEL rule
])
def test_a_resource_the_crd_refuses_is_answered_422_invalid(api_url, spec, words):
    code, status = create(api_url, spec)
    assert code == 422, status  # (a 201 would store it: the next case would then be a 409)
    assert status["kind"] == "Status" and status["code"] == 422
    assert status["reason"] == "Invalid" and words in status["message"], status["message"]
    assert status["details"]["kind"] == "PagedInferenceService"


def test_a_trial_the_crd_refuses_ends_infeasible(api_url, tmp_path):
    cluster = Cluster(kube_client(api_url), "default", "tune")
    target = {"metadata": {"name": "svc"},
              "spec": {"model": {"uri": "builtin://default"},
                       "engine": {"enablePrefixCaching": False}}}
    runner = ServiceRunner(cluster, "tune", {"apiVersion": "serving.pagedinference.dev/"
                                             "v1alpha1", "kind": "PagedInferenceTuning",
                                             "name": "tune", "uid": "u"},
                           target, LoadSpec(workload="chat", duration=1, users=1), {},
                           startup_timeout=1)
    with pytest.raises(Infeasible) as refused:
        runner.run(TrialRequest(name="trial-0001", seed=0, workdir=tmp_path,
                                settings={"kv_offloading_size": 2.0}))
    assert refused.value.reason.startswith("tune-t1 refused by the API server: ")
    assert RULE in refused.value.reason
    assert cluster.trial_names() == []
