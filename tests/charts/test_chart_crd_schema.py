"""The CRD's schema, the example resource, and the operator's own validation agree."""
from __future__ import annotations

import pytest
import yaml
from chart_tools import EXAMPLE, ROOT, crd, crd_validator, validate_k8s, with_spec

from paged_operator import manifests, manifests_access
from paged_api.service import InvalidSpecError, parse_spec

EXAMPLE_BODY = yaml.safe_load(EXAMPLE.read_text())
def test_crd_names_subresources_and_printer_columns():
    spec = crd()["spec"]
    assert spec["group"] == "serving.pagedinference.dev"
    assert spec["names"]["kind"] == "PagedInferenceService"
    assert spec["names"]["plural"] == "pagedinferenceservices"
    assert spec["names"]["shortNames"] == ["pis"]
    version = spec["versions"][0]
    assert version["name"] == "v1alpha1" and version["served"] and version["storage"]
    assert version["subresources"]["status"] == {}
    assert version["subresources"]["scale"]["specReplicasPath"] == ".spec.replicas"
    columns = [c["name"] for c in version["additionalPrinterColumns"]]
    assert columns == ["Model", "Ready-Replicas", "Desired", "Block", "Ready", "Age"]


def test_crd_schema_is_structural():
    """Every field has a type (Kubernetes rejects non-structural CRD schemas)."""
    def walk(node, path):
        if node.get("x-kubernetes-int-or-string"):
            return
        assert "type" in node, f"{path} has no type"
        for name, child in (node.get("properties") or {}).items():
            walk(child, f"{path}.{name}")
        if isinstance(node.get("items"), dict):
            walk(node["items"], f"{path}[]")
    walk(crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"], "")


def test_example_validates_against_the_crd_and_the_operator_serves_it():
    errors = list(crd_validator().iter_errors(EXAMPLE_BODY))
    assert not errors, [e.message for e in errors]
    spec = parse_spec(EXAMPLE_BODY["spec"], name=EXAMPLE_BODY["metadata"]["name"],
                      namespace="default")
    assert spec.engine.block_size == 16 and spec.model.served_name == "qwen"


@pytest.mark.parametrize("example, model", [
    ("service-cpu.yaml", "builtin://default"),
    ("service-smollm2.yaml", "builtin://smollm2-135m-instruct"),
])
def test_builtin_model_examples_validate_and_run_on_cpu(example, model):
    body = yaml.safe_load((ROOT / "examples" / example).read_text())
    errors = list(crd_validator().iter_errors(body))
    assert not errors, [e.message for e in errors]
    spec = parse_spec(body["spec"], name=body["metadata"]["name"], namespace="default")
    assert spec.model.kind == "builtin" and spec.gpus == 0 and spec.replicas == 1
    container = manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]
    assert container["args"][0] == model  # the engine resolves builtin:// itself
    assert "nvidia.com/gpu" not in str(container["resources"])
    assert container["resources"]["limits"]["memory"] == spec.memory
    assert int(dict((e["name"], e["value"]) for e in container["env"])[
        "PAGED_CPU_THREADS"]) >= 1


@pytest.mark.parametrize("extra, optional", [
    ({}, 1),
    ({"modelCache__size": "50Gi", "autoscaling": {"maxReplicas": 3, "target": 4}}, 3),
    ({"model__uri": "pvc://weights/llama/8b", "rollout__strategy": "Recreate",
      "networkPolicy": {"enabled": False}}, 0),
    ({"model__uri": "builtin://default", "apiKeySecretRef": {"name": "keys"},
      "router": {"enabled": True},
      "networkPolicy": {"allowFrom": [{"ipBlock": {"cidr": "10.0.0.0/8"}}]}}, 6),
    # the router's precise policy adds a NetworkPolicy for the engines' event ports
    ({"model__uri": "pvc://weights/qwen", "router": {"enabled": True, "policy": "precise"}}, 7),
    # the KV tiers add a volume (emptyDir or the user's claim), no child: 1 is the NetworkPolicy
    ({"kvCache": {"offloadGiB": 2, "disk": {"sizeGiB": 5, "volume": {"emptyDir": {}}}},
      "resources__memory": "8Gi"}, 1),
    ({"kvCache": {"disk": {"sizeGiB": 5, "volume": {"persistentVolumeClaim": {
        "claimName": "kv"}}}}}, 1),
])
def test_operator_children_validate_against_kubernetes_schemas(extra, optional):
    body = with_spec(**extra)
    spec = parse_spec(body["spec"], name="svc", namespace="default")
    children = [manifests.deployment(spec), manifests.service(spec), manifests.config_map(spec),
                manifests.pod_disruption_budget(spec)]
    children += [c for c in (manifests.model_cache_claim(spec),
                             manifests.horizontal_pod_autoscaler(spec),
                             manifests_access.network_policy(spec),
                             manifests_access.kv_events_network_policy(spec)) if c]
    children += manifests_access.router_children(spec)
    assert len(children) == 4 + optional
    for child in children:
        validate_k8s(child)


VALID = [
    {"model__uri": "hf://Qwen/Qwen2.5-0.5B"},
    {"model__uri": "/models/llama"},
    {"model__uri": "pvc://models"},
    {"engine__blockSize": 256, "engine__gpuMemoryUtilization": 1},
    {"resources__memory": 17179869184, "resources__cpu": "500m"},
    {"rollout__maxSurge": "25%", "rollout__maxUnavailable": 0},
    {"autoscaling": {"minReplicas": 2, "maxReplicas": 2, "metric": "kvCacheUsage",
                     "target": "0.8"}},
    {"model__uri": "builtin://default"},
    {"autoscaling": {"maxReplicas": 2,
                     "prometheusServerAddress": "https://prom.monitoring.svc:9090/prefix"}},
    {"apiKeySecretRef": {"name": "engine-keys", "key": "client.key"}},
    {"networkPolicy": {"enabled": False}},
    {"networkPolicy": {"allowFrom": [{"namespaceSelector": {"matchLabels": {
        "kubernetes.io/metadata.name": "monitoring"}}}]}},
    {"router": {"enabled": True, "policy": "least-load", "replicas": 2}},
    {"router": {"enabled": True, "policy": "precise"}},
    {"autoscaling": {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "forecast": "holt", "startupSeconds": 45}},
    {"autoscaling": {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "targetUtilization": 1}},
    {"autoscaling": {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "targetUtilization": 0.05}},
    {"kvCache": {"offloadGiB": 0}}, {"kvCache": {"offloadGiB": 0.25}},
    {"kvCache": {"disk": {"sizeGiB": 0.1, "volume": {"emptyDir": {}}}}},
]
INVALID = [  # rejected by the OpenAPI schema, and by the operator should it slip past
    ("engine__blockSize", 48), ("engine__blockSize", 0), ("engine__blockSize", 512),
    ("engine__gpuMemoryUtilization", 0), ("engine__gpuMemoryUtilization", 1.5),
    ("engine__maxNumSeqs", 0), ("engine__enablePrefixCaching", "yes"),
    ("engine__extraArgs", ["--seed", 7]), ("model__uri", "has space"),
    ("model__uri", "pvc://Bad_Claim/x"), ("replicas", -1), ("resources__memory", "lots"),
    ("autoscaling", {"maxReplicas": 2, "metric": "cpu"}), ("autoscaling", {"minReplicas": 1}),
    ("rollout__strategy", "BlueGreen"), ("rollout__maxSurge", "lots"),
    ("model__uri", "builtin://Tiny_Model"), ("model__uri", "builtin://"),
    ("autoscaling", {"maxReplicas": 2, "prometheusServerAddress": "file:///etc/passwd"}),
    ("autoscaling", {"maxReplicas": 2, "prometheusServerAddress": "http://u:p@prom:9090"}),
    ("autoscaling", {"maxReplicas": 2, "prometheusServerAddress": "gopher://prom"}),
    ("apiKeySecretRef", {"key": "k"}), ("apiKeySecretRef", {"name": "Bad_Name"}),
    ("apiKeySecretRef", {"name": "s", "key": "a/b"}),
    ("networkPolicy", {"allowFrom": [{}]}), ("networkPolicy", {"enabled": "yes"}),
    ("router", {"enabled": True, "policy": "random"}), ("router", {"replicas": 0}),
    ("engine__speculative", {"numSpeculativeTokens": 0}),
    ("engine__speculative", {"numSpeculativeTokens": 17}),
    ("engine__speculative", {"method": "eagle", "numSpeculativeTokens": 2}),
    ("engine__speculative", {"numSpeculativeTokens": 2, "promptLookupMax": 65}),
    ("engine__speculative", {"numSpeculativeTokens": 2, "promptLookupMin": 0}),
    ("engine__speculative", {"numSpeculativeTokens": "2"}),
    ("engine__speculative", {"promptLookupMax": 3}),       # numSpeculativeTokens is required
    ("engine__speculative", "ngram"),
    ("kvCache", {"offloadGiB": -1}), ("kvCache", {"offloadGiB": "4Gi"}),
    ("kvCache", {"disk": {"volume": {"emptyDir": {}}}}),            # sizeGiB is required
    ("kvCache", {"disk": {"sizeGiB": 2}}),                          # volume is required
    ("kvCache", {"disk": {"sizeGiB": 0, "volume": {"emptyDir": {}}}}),
    ("kvCache", {"disk": {"sizeGiB": -1, "volume": {"emptyDir": {}}}}),
    ("kvCache", {"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {}}}}),
    ("kvCache", {"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {
        "claimName": "Bad_Name"}}}}),
    ("kvCache", {"disk": {"sizeGiB": 2, "volume": {"emptyDir": "yes"}}}),
    ("kvCache", {"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": "c"}}}),
    ("kvCache", {"disk": {"sizeGiB": 2, "volume": {"persistentVolumeClaim": {
        "claimName": "a" * 254}}}}),
    ("kvCache", "on"),
    ("autoscaling", {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "startupSeconds": -5}),
    ("autoscaling", {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "startupSeconds": "20s"}),
    ("autoscaling", {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "targetUtilization": 0}),
    ("autoscaling", {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "targetUtilization": 1.2}),
    ("autoscaling", {"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                     "targetUtilization": "60%"}),
]
@pytest.mark.parametrize("changes", VALID)
def test_valid_specs_pass_schema_and_operator(changes):
    body = with_spec(**changes)
    assert not list(crd_validator().iter_errors(body))
    parse_spec(body["spec"], name="svc", namespace="default")


@pytest.mark.parametrize("field, value", INVALID)
def test_invalid_specs_fail_schema_and_operator(field, value):
    body = with_spec(**{field: value})
    assert list(crd_validator().iter_errors(body)), f"schema accepted {field}={value!r}"
    with pytest.raises(InvalidSpecError) as err:
        parse_spec(body["spec"], name="svc", namespace="default")
    assert "spec." + field.split("__")[0] in str(err.value)
