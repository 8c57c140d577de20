"""The CRD's schema, the example resource, and the operator's own validation agree."""
from __future__ import annotations

import copy

import pytest
import yaml
from chart_tools import EXAMPLE, crd, crd_validator, validate_k8s

from paged_operator import manifests
from paged_operator.spec import InvalidSpecError, parse_spec

EXAMPLE_BODY = yaml.safe_load(EXAMPLE.read_text())
BASE = {"model": {"uri": "Qwen/Qwen2.5-0.5B-Instruct"}}


def with_spec(**changes):
    body = {"apiVersion": "serving.pagedinference.dev/v1alpha1",
            "kind": "PagedInferenceService", "metadata": {"name": "svc"},
            "spec": copy.deepcopy(BASE)}
    for path, value in changes.items():
        node = body["spec"]
        *parents, leaf = path.split("__")
        for key in parents:
            node = node.setdefault(key, {})
        node[leaf] = value
    return body


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


@pytest.mark.parametrize("extra", [
    {},
    {"modelCache__size": "50Gi", "autoscaling": {"maxReplicas": 3, "target": 4}},
    {"model__uri": "pvc://weights/llama/8b", "rollout__strategy": "Recreate"},
])
def test_operator_children_validate_against_kubernetes_schemas(extra):
    body = with_spec(**extra)
    spec = parse_spec(body["spec"], name="svc", namespace="default")
    children = [manifests.deployment(spec), manifests.service(spec), manifests.config_map(spec),
                manifests.pod_disruption_budget(spec)]
    children += [c for c in (manifests.model_cache_claim(spec),
                             manifests.horizontal_pod_autoscaler(spec)) if c]
    assert len(children) == 4 + (2 if extra.get("autoscaling") else 0)
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
]
INVALID = [  # rejected by the OpenAPI schema, and by the operator should it slip past
    ("engine__blockSize", 48), ("engine__blockSize", 0), ("engine__blockSize", 512),
    ("engine__gpuMemoryUtilization", 0), ("engine__gpuMemoryUtilization", 1.5),
    ("engine__maxNumSeqs", 0), ("engine__enablePrefixCaching", "yes"),
    ("engine__extraArgs", ["--seed", 7]), ("model__uri", "has space"),
    ("model__uri", "pvc://Bad_Claim/x"), ("replicas", -1), ("resources__memory", "lots"),
    ("autoscaling", {"maxReplicas": 2, "metric": "cpu"}), ("autoscaling", {"minReplicas": 1}),
    ("rollout__strategy", "BlueGreen"), ("rollout__maxSurge", "lots"),
]
CEL_ONLY = [  # relations between fields: CEL rules in the CRD, checked again by the operator
    ({"engine__maxNumSeqs": 64, "engine__maxNumBatchedTokens": 32}, "maxNumBatchedTokens"),
    ({"engine__extraArgs": ["--block-size=8"]}, "extraArgs"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}}, "maxReplicas"),
    ({"modelCache": {"claimName": "c", "size": "1Gi"}}, "modelCache"),
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


@pytest.mark.parametrize("changes, field", CEL_ONLY)
def test_field_relations_have_a_cel_rule_and_an_operator_check(changes, field):
    body = with_spec(**changes)
    with pytest.raises(InvalidSpecError, match=field):
        parse_spec(body["spec"], name="svc", namespace="default")
    rules = yaml.safe_dump(crd())
    assert "x-kubernetes-validations" in rules
    parent = next(iter(changes)).split("__")[0]
    node = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["spec"]
    node = node["properties"][parent]
    cel = node.get("x-kubernetes-validations") or \
        node.get("properties", {}).get("extraArgs", {}).get("x-kubernetes-validations")
    assert cel, f"no CEL rule on spec.{parent}"


def test_long_names_are_rejected_by_the_operator_and_a_cel_rule():
    with pytest.raises(InvalidSpecError, match="metadata.name"):
        parse_spec(BASE, name="x" * 53, namespace="default")
    root = crd()["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
    assert any("metadata.name.size() <= 52" in r["rule"]
               for r in root["x-kubernetes-validations"])
