"""parse_spec field by field, without a cluster: every field of a full spec lands where it
belongs, an empty one takes the documented defaults, and each refused value raises an
InvalidSpecError whose whole message names the field to change (found by
scripts/mutation.py; the CRD schema repeats most of these checks at apply time)."""
from __future__ import annotations

import pytest

from paged_api.access import NetworkPolicy, Router, SecretKeyRef
from paged_api.model_source import ModelSource
from paged_api.service import (Autoscaling, EngineSettings, InvalidSpecError, ModelCache,
                                 Rollout, ServiceSpec, SloPlanner, parse_spec)

FULL = {
    "model": {"uri": "pvc://models/qwen/7b", "servedName": "chat"},
    "image": "registry.example/engine:2", "imagePullPolicy": "Always", "replicas": 3,
    "resources": {"gpus": 2, "gpuResourceName": "amd.com/gpu", "cpu": "8", "memory": "64Gi",
                  "sharedMemory": "8Gi"},
    "engine": {"blockSize": 32, "maxNumSeqs": 8, "extraArgs": ["--seed", "3"]},
    "autoscaling": {"minReplicas": 2, "maxReplicas": 6, "metric": "kvCacheUsage",
                    "target": "0.7", "prometheusServerAddress": "https://prom.example:9090"},
    "rollout": {"strategy": "Recreate", "maxSurge": "25%", "maxUnavailable": 2,
                "startupTimeoutSeconds": 600},
    "modelCache": {"size": "100Gi", "storageClassName": "fast", "accessModes": ["ReadWriteMany"]},
    "env": [{"name": "A", "value": "1"}],
    "tolerations": [{"key": "gpu", "operator": "Exists"}],
    "nodeSelector": {"pool": "h100"},
    "runtimeClassName": "nvidia",
    "apiKeySecretRef": {"name": "engine-key", "key": "token"},
    "networkPolicy": {"enabled": False, "allowFrom": [{"podSelector": {}}]},
    "router": {"enabled": True, "policy": "least-load", "replicas": 2, "hitLoadFactor": 2},
}


def parse(name="svc", **fields):
    return parse_spec({"model": {"uri": "a/b"}, **fields}, name=name, namespace="team")


def test_every_field_of_a_full_spec_lands_in_service_spec():
    assert parse_spec(FULL, name="svc", namespace="team") == ServiceSpec(
        name="svc", namespace="team",
        model=ModelSource(uri="pvc://models/qwen/7b", served_name="chat", kind="pvc",
                          claim_name="models", path_in_claim="qwen/7b"),
        image="registry.example/engine:2", image_pull_policy="Always", replicas=3, gpus=2,
        gpu_resource_name="amd.com/gpu", cpu="8", memory="64Gi", shared_memory="8Gi",
        engine=EngineSettings(block_size=32, gpu_memory_utilization=0.9, max_num_seqs=8,
                              max_num_batched_tokens=None, max_model_len=None,
                              enable_prefix_caching=True, extra_args=("--seed", "3")),
        autoscaling=Autoscaling(min_replicas=2, max_replicas=6, metric="kvCacheUsage",
                                target="0.7",
                                prometheus_server_address="https://prom.example:9090"),
        rollout=Rollout(strategy="Recreate", max_surge="25%", max_unavailable=2,
                        startup_timeout_seconds=600),
        model_cache=ModelCache(claim_name=None, size="100Gi", storage_class_name="fast",
                               access_modes=("ReadWriteMany",)),
        env=({"name": "A", "value": "1"},), tolerations=({"key": "gpu", "operator": "Exists"},),
        node_selector={"pool": "h100"}, runtime_class_name="nvidia",
        api_key=SecretKeyRef(name="engine-key", key="token"),
        network_policy=NetworkPolicy(enabled=False, allow_from=({"podSelector": {}},)),
        router=Router(enabled=True, policy="least-load", replicas=2, hit_load_factor=2.0))


def test_an_empty_spec_takes_the_documented_defaults():
    assert parse() == ServiceSpec(
        name="svc", namespace="team",
        model=ModelSource(uri="a/b", served_name="svc", kind="hf"),
        image="pagedinference/engine:0.1.0", image_pull_policy="IfNotPresent", replicas=1,
        gpus=1, gpu_resource_name="nvidia.com/gpu", cpu=None, memory=None, shared_memory="2Gi",
        engine=EngineSettings(block_size=16, gpu_memory_utilization=0.9, max_num_seqs=None,
                              max_num_batched_tokens=None, max_model_len=None,
                              enable_prefix_caching=True, extra_args=()),
        autoscaling=None,
        rollout=Rollout(strategy="RollingUpdate", max_surge=0, max_unavailable=1,
                        startup_timeout_seconds=1800),
        model_cache=None, env=(), tolerations=(), node_selector={}, runtime_class_name=None,
        api_key=None, network_policy=NetworkPolicy(enabled=True, allow_from=()),
        router=Router(enabled=False, policy="prefix", replicas=1, hit_load_factor=None))


def test_null_fields_fall_back_to_their_defaults():
    # `sharedMemory:` or `image:` left empty in YAML arrive as None
    spec = parse(image=None, resources={"sharedMemory": None})
    assert (spec.image, spec.shared_memory) == ("pagedinference/engine:0.1.0", "2Gi")
    assert parse_spec({"model": {"uri": "a/b"}}, name="svc", namespace="team",
                      default_image="mirror/engine:1").image == "mirror/engine:1"


def test_applied_settings_leave_out_unset_ones_and_keep_extra_args():
    engine = parse(engine={"maxNumSeqs": 8, "extraArgs": ["--seed", "3"]}).engine
    assert engine.applied() == {"blockSize": 16, "gpuMemoryUtilization": 0.9, "maxNumSeqs": 8,
                                "enablePrefixCaching": True, "extraArgs": ["--seed", "3"]}


@pytest.mark.parametrize("fields", [
    {"replicas": 0},                                          # scaled to zero
    {"resources": {"gpus": 0}},                               # a CPU engine
    {"autoscaling": {"minReplicas": 3, "maxReplicas": 3}},    # a fixed size under autoscaling
    {"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": 1}},
    {"autoscaling": {"mode": "slo", "minReplicas": 0, "maxReplicas": 1,   # scale to zero
                     "slo": {"e2eSeconds": 0.5}, "targetAttainment": 1,
                     "intervalSeconds": 5, "scaleDownStabilizationSeconds": 0,
                     "idleWindowSeconds": 0, "startupSeconds": 0, "targetUtilization": 1},
     "router": {"enabled": True}},
    {"rollout": {"strategy": "Recreate", "maxSurge": 0, "maxUnavailable": 0}},
    {"rollout": {"startupTimeoutSeconds": 10}},
    {"modelCache": {"claimName": "shared-cache"}},
], ids=lambda f: str(f))
def test_boundary_values_are_accepted(fields):
    parse(**fields)


def test_mode_slo_parses_the_planners_settings_with_their_defaults():
    auto = parse(autoscaling={"mode": "slo", "minReplicas": 0, "maxReplicas": 4,
                              "slo": {"ttftSeconds": 2, "itlSeconds": 0.05}},
                 router={"enabled": True}).autoscaling
    assert (auto.mode, auto.min_replicas, auto.max_replicas) == ("slo", 0, 4)
    assert auto.planner == SloPlanner(slos={"ttft": 2.0, "itl": 0.05})
    assert (auto.planner.interval_seconds, auto.planner.idle_window_seconds,
            auto.planner.scale_down_stabilization_seconds,
            auto.planner.startup_seconds,
            auto.planner.target_utilization) == (30, 600, 300, 0, 0.9)
    given = parse(autoscaling={"mode": "slo", "maxReplicas": 4, "slo": {"ttftSeconds": 2},
                               "startupSeconds": 45}).autoscaling.planner
    assert given.startup_seconds == 45
    assert parse(autoscaling={"maxReplicas": 2}).autoscaling.planner is None


def test_the_longest_accepted_name_is_52_characters():
    assert parse(name="a" * 52).name == "a" * 52
    with pytest.raises(InvalidSpecError) as error:
        parse(name="a" * 53)
    assert str(error.value) == (
        f"metadata.name {'a' * 53!r} must be a DNS label (lower-case letters, digits, '-', "
        "starting with a letter) of at most 52 characters")


def test_a_model_cache_of_a_given_size_gets_the_default_access_mode():
    assert parse(modelCache={"size": "10Gi"}).model_cache == ModelCache(
        size="10Gi", access_modes=("ReadWriteOnce",))
    assert parse(modelCache={"claimName": "shared"}).model_cache == ModelCache(
        claim_name="shared")


QUANTITY = "must be a Kubernetes quantity like '4', '500m' or '16Gi', got"
FLAG_OWNERS = ("the operator sets it from spec.engine, spec.model, spec.kvCache, spec.router or "
               "spec.apiKeySecretRef")
INVALID = [
    # top level
    ({"model": None}, "spec.model is required (spec.model.uri names the model)"),
    ({"model": "a/b"}, "spec.model must be an object, got 'a/b'"),
    ({"resources": []}, "spec.resources must be an object, got []"),
    ({"replicas": "2"}, "spec.replicas must be an integer, got '2'"),
    ({"replicas": -1}, "spec.replicas must be >= 0, got -1"),
    ({"runtimeClassName": 5}, "spec.runtimeClassName must be a string, got 5"),
    ({"nodeSelector": []}, "spec.nodeSelector must be an object, got []"),
    ({"nodeSelector": {"pool": 1}}, "spec.nodeSelector values must be strings"),
    ({"image": 5}, "spec.image must be a string, got 5"),
    ({"imagePullPolicy": 5}, "spec.imagePullPolicy must be a string, got 5"),
    ({"engine": []}, "spec.engine must be an object, got []"),
    ({"autoscaling": []}, "spec.autoscaling must be an object, got []"),
    ({"rollout": []}, "spec.rollout must be an object, got []"),
    ({"modelCache": []}, "spec.modelCache must be an object, got []"),
    ({"env": {}}, "spec.env must be a list, got {}"),
    ({"tolerations": {}}, "spec.tolerations must be a list, got {}"),
    ({"apiKeySecretRef": []}, "spec.apiKeySecretRef must be an object, got []"),
    ({"networkPolicy": []}, "spec.networkPolicy must be an object, got []"),
    ({"router": []}, "spec.router must be an object, got []"),
    ({"router": {"hitLoadFactor": -0.5}}, "spec.router.hitLoadFactor must be in 0..16, got -0.5"),
    ({"router": {"hitLoadFactor": 17}}, "spec.router.hitLoadFactor must be in 0..16, got 17"),
    ({"router": {"hitLoadFactor": "2"}},
     "spec.router.hitLoadFactor must be an integer or a number, got '2'"),
    # resources
    ({"resources": {"gpus": "2"}}, "spec.resources.gpus must be an integer, got '2'"),
    ({"resources": {"gpus": -1}}, "spec.resources.gpus must be >= 0, got -1"),
    ({"resources": {"gpuResourceName": 5}},
     "spec.resources.gpuResourceName must be a string, got 5"),
    ({"resources": {"cpu": "lots"}}, f"spec.resources.cpu {QUANTITY} 'lots'"),
    ({"resources": {"memory": "lots"}}, f"spec.resources.memory {QUANTITY} 'lots'"),
    ({"resources": {"sharedMemory": "lots"}}, f"spec.resources.sharedMemory {QUANTITY} 'lots'"),
    # engine
    ({"engine": {"blockSize": 0}}, "spec.engine.blockSize must be a power of two in 1..256, got 0"),
    ({"engine": {"extraArgs": "--seed 3"}}, "spec.engine.extraArgs must be a list, got '--seed 3'"),
    ({"engine": {"extraArgs": [3]}}, "spec.engine.extraArgs must hold strings, got 3"),
    ({"engine": {"extraArgs": ["--port=9000"]}},
     f"spec.engine.extraArgs must not set --port (--port): {FLAG_OWNERS}"),
    # only the first '=' ends the flag's name
    ({"engine": {"extraArgs": ["--kv-events-config={}"]}},
     f"spec.engine.extraArgs must not set --kv-events-config (--kv-events-config): "
     f"{FLAG_OWNERS}"),
    ({"engine": {"extraArgs": ["--port=1=2"]}},
     f"spec.engine.extraArgs must not set --port (--port): {FLAG_OWNERS}"),
    # autoscaling
    ({"autoscaling": {"minReplicas": "1", "maxReplicas": 2}},
     "spec.autoscaling.minReplicas must be an integer, got '1'"),
    ({"autoscaling": {"minReplicas": 0, "maxReplicas": 2}},
     "spec.autoscaling.minReplicas must be >= 1, got 0"),
    ({"autoscaling": {"minReplicas": 2}},
     "spec.autoscaling.maxReplicas is required when autoscaling is set"),
    ({"autoscaling": {"maxReplicas": "2"}},
     "spec.autoscaling.maxReplicas must be an integer, got '2'"),
    ({"autoscaling": {"minReplicas": 3, "maxReplicas": 2}},
     "spec.autoscaling.maxReplicas (2) must be >= spec.autoscaling.minReplicas (3)"),
    ({"autoscaling": {"maxReplicas": 2, "metric": 5}},
     "spec.autoscaling.metric must be a string, got 5"),
    ({"autoscaling": {"maxReplicas": 2, "metric": "cpu"}},
     "spec.autoscaling.metric must be one of ['kvCacheUsage', 'queueDepth'], got 'cpu'"),
    ({"autoscaling": {"maxReplicas": 2, "target": "lots"}},
     f"spec.autoscaling.target {QUANTITY} 'lots'"),
    ({"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": "1.5"}},
     "spec.autoscaling.target for kvCacheUsage is a fraction in (0, 1], got 1.5"),
    ({"autoscaling": {"maxReplicas": 2, "metric": "kvCacheUsage", "target": 0}},
     "spec.autoscaling.target for kvCacheUsage is a fraction in (0, 1], got 0"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "hpa"}},
     "spec.autoscaling.mode must be one of ['metrics', 'slo'], got 'hpa'"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo"}},
     "spec.autoscaling.mode slo needs spec.autoscaling.slo with at least one of ttftSeconds, "
     "itlSeconds, e2eSeconds"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "minReplicas": 0,
                      "slo": {"ttftSeconds": 1}}},
     "spec.autoscaling.minReplicas 0 needs spec.router.enabled: the router holds requests "
     "while the first replica starts"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "minReplicas": -1,
                      "slo": {"ttftSeconds": 1}}},
     "spec.autoscaling.minReplicas must be >= 0, got -1"),
    ({"autoscaling": {"maxReplicas": 0, "mode": "slo", "minReplicas": 0,
                      "slo": {"ttftSeconds": 1}}, "router": {"enabled": True}},
     "spec.autoscaling.maxReplicas must be >= 1, got 0"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0}}},
     "spec.autoscaling.slo.itlSeconds must be > 0, got 0"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": "fast"}}},
     "spec.autoscaling.slo.itlSeconds must be an integer or a number, got 'fast'"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "targetAttainment": 1.2}},
     "spec.autoscaling.targetAttainment must be in (0, 1], got 1.2"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "intervalSeconds": 1}},
     "spec.autoscaling.intervalSeconds must be >= 5, got 1"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "startupSeconds": -1}},
     "spec.autoscaling.startupSeconds must be >= 0, got -1"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "targetUtilization": 0}},
     "spec.autoscaling.targetUtilization must be in (0, 1], got 0"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "targetUtilization": 1.5}},
     "spec.autoscaling.targetUtilization must be in (0, 1], got 1.5"),
    ({"autoscaling": {"maxReplicas": 2, "mode": "slo", "slo": {"itlSeconds": 0.1},
                      "forecast": "prophet"}},
     "spec.autoscaling.forecast must be one of ['none', 'holt'], got 'prophet'"),
    ({"autoscaling": {"maxReplicas": 2, "prometheusServerAddress": 9090}},
     "spec.autoscaling.prometheusServerAddress must be a string, got 9090"),
    ({"autoscaling": {"maxReplicas": 2, "prometheusServerAddress": "http://user:pw@prom:9090"}},
     "spec.autoscaling.prometheusServerAddress must be an http:// or https:// URL without "
     "credentials, got 'http://user:pw@prom:9090'"),
    # rollout
    ({"rollout": {"strategy": 5}}, "spec.rollout.strategy must be a string, got 5"),
    ({"rollout": {"strategy": "BlueGreen"}},
     "spec.rollout.strategy must be RollingUpdate or Recreate, got 'BlueGreen'"),
    ({"rollout": {"maxSurge": True}},
     "spec.rollout.maxSurge must be an integer or a string, got True"),
    ({"rollout": {"maxUnavailable": True}},
     "spec.rollout.maxUnavailable must be an integer or a string, got True"),
    ({"rollout": {"maxSurge": "1.5"}},
     "spec.rollout.maxSurge must be a count or a percentage like '25%', got '1.5'"),
    ({"rollout": {"maxUnavailable": "all"}},
     "spec.rollout.maxUnavailable must be a count or a percentage like '25%', got 'all'"),
    ({"rollout": {"maxSurge": 0, "maxUnavailable": 0}},
     "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0: the rollout "
     "could never make progress"),
    ({"rollout": {"maxSurge": "0%", "maxUnavailable": "0%"}},
     "spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot both be 0: the rollout "
     "could never make progress"),
    ({"rollout": {"startupTimeoutSeconds": "60"}},
     "spec.rollout.startupTimeoutSeconds must be an integer, got '60'"),
    ({"rollout": {"startupTimeoutSeconds": 9}},
     "spec.rollout.startupTimeoutSeconds must be >= 10, got 9"),
    # modelCache
    ({"modelCache": {"claimName": 5}}, "spec.modelCache.claimName must be a string, got 5"),
    ({"modelCache": {"size": "lots"}}, f"spec.modelCache.size {QUANTITY} 'lots'"),
    ({"modelCache": {"storageClassName": "fast"}},
     "spec.modelCache needs exactly one of claimName (an existing claim) or size (a claim the "
     "operator creates)"),
    ({"modelCache": {"claimName": "c", "size": "1Gi"}},
     "spec.modelCache needs exactly one of claimName (an existing claim) or size (a claim the "
     "operator creates)"),
    ({"modelCache": {"claimName": "Not_A_Claim"}},
     "spec.modelCache.claimName 'Not_A_Claim' is not a valid claim name"),
    ({"modelCache": {"size": "1Gi", "accessModes": "ReadWriteMany"}},
     "spec.modelCache.accessModes must be a list, got 'ReadWriteMany'"),
    ({"modelCache": {"size": "1Gi", "storageClassName": 5}},
     "spec.modelCache.storageClassName must be a string, got 5"),
]


@pytest.mark.parametrize("fields, message", INVALID, ids=[m for _, m in INVALID])
def test_a_refused_value_names_the_field_to_change(fields, message):
    with pytest.raises(InvalidSpecError) as error:
        parse(**fields)
    assert str(error.value) == message


def test_the_planner_pod_gets_every_setting_of_mode_slo():
    """tuner/planner/run.planner_spec: the spec's planner settings, the start-up included,
    are what the planner decides with."""
    from tuner.planner.core import PlannerSpec
    from tuner.planner.run import planner_spec

    spec = parse(autoscaling={"mode": "slo", "minReplicas": 0, "maxReplicas": 6,
                              "slo": {"ttftSeconds": 2}, "targetAttainment": 0.95,
                              "intervalSeconds": 15, "scaleDownStabilizationSeconds": 60,
                              "idleWindowSeconds": 120, "forecast": "holt",
                              "startupSeconds": 45, "targetUtilization": 0.6},
                 router={"enabled": True})
    assert planner_spec(spec) == PlannerSpec(
        min_replicas=0, max_replicas=6, target_attainment=0.95, interval=15,
        scale_down_stabilization=60, idle_window=120, forecast="holt", startup=45,
        utilisation=0.6)
