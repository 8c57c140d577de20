"""Parse and validate a PagedInferenceService spec into frozen settings.

The CRD's OpenAPI schema rejects most bad input at `kubectl apply` time; this module
repeats the checks so that a spec that slipped past the schema (an older CRD, a
schema-less dry run, a field the schema cannot express) ends as a Degraded condition
with a message naming the field, before any child object is made.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from paged_api import settings as engine_settings
from paged_api import settings_k8s

from paged_api.fields import (DNS_LABEL, DNS_SUBDOMAIN, PERCENT_OR_INT, InvalidSpecError,
                     get_field, positive, quantity, quantity_value)
from paged_api.access import (NetworkPolicy, Router, SecretKeyRef, parse_api_key, parse_network_policy,
                     parse_router)
from paged_api.autoscaling import AUTOSCALING_METRICS, Autoscaling, SloPlanner, parse_autoscaling
from paged_api.kv_cache import KvCache, parse_kv_cache
from paged_api.model_source import ModelSource, parse_model

DEFAULT_IMAGE = "pagedinference/engine:0.1.0"
ENGINE_PORT = 8000
# Longest name whose children (e.g. "<name>-engine-config", pod names with hashes) stay
# within the 63-character DNS label limit that Services and labels impose.
MAX_NAME_LENGTH = 52

# Flags the operator sets itself; passing them through extraArgs would contradict spec
# (or, for --api-key/--api-key-file, put a key in argv: use spec.apiKeySecretRef).
# From the settings table (api/paged_api/settings.py), as is the CRD's extraArgs rule.
MANAGED_FLAGS = settings_k8s.managed_flags()


def _applied(self) -> dict[str, Any]:
    """The settings in spec.engine's camelCase form, unset ones left out."""
    values = {s.name: getattr(self, s.name) for s in engine_settings.SPEC_SETTINGS}
    return settings_k8s.to_spec(values) | {"extraArgs": list(self.extra_args)}


def _flags(self) -> list[str]:
    """vLLM-named CLI flags for `python -m engine serve`."""
    values = {s.name: getattr(self, s.name) for s in engine_settings.SPEC_SETTINGS}
    return engine_settings.flags_for(values) + list(self.extra_args)


# One field per spec.engine setting of the table (default: the CRD's, else None for the
# engine's own), plus extra_args; methods applied() and flags().
EngineSettings = dataclasses.make_dataclass(
    "EngineSettings",
    [(s.name, s.type if s.crd_default else s.type | None,  # type: ignore[operator]
      dataclasses.field(default=s.default if s.crd_default else None))
     for s in engine_settings.SPEC_SETTINGS]
    + [("extra_args", tuple[str, ...], dataclasses.field(default=()))],
    namespace={"applied": _applied, "flags": _flags, "__module__": __name__}, frozen=True,
    kw_only=True)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Rollout:
    strategy: str = "RollingUpdate"
    max_surge: int | str = 0        # no surge: a full GPU node has no room for an extra pod
    max_unavailable: int | str = 1
    startup_timeout_seconds: int = 1800


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelCache:
    claim_name: str | None = None      # an existing claim, or
    size: str | None = None            # a claim the operator creates: "<name>-model-cache"
    storage_class_name: str | None = None
    access_modes: tuple[str, ...] = ("ReadWriteOnce",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ServiceSpec:
    name: str
    namespace: str
    model: ModelSource
    image: str = DEFAULT_IMAGE
    image_pull_policy: str = "IfNotPresent"
    replicas: int = 1
    gpus: int = 1
    gpu_resource_name: str = "nvidia.com/gpu"
    cpu: str | None = None
    memory: str | None = None
    shared_memory: str = "2Gi"
    engine: EngineSettings = EngineSettings()
    autoscaling: Autoscaling | None = None
    rollout: Rollout = Rollout()
    model_cache: ModelCache | None = None
    env: tuple[Mapping[str, Any], ...] = ()
    tolerations: tuple[Mapping[str, Any], ...] = ()
    node_selector: Mapping[str, str] = dataclasses.field(default_factory=dict)
    runtime_class_name: str | None = None
    api_key: SecretKeyRef | None = None
    network_policy: NetworkPolicy = NetworkPolicy()
    router: Router = Router()
    kv_cache: KvCache | None = None


def managed_flag(arg: str) -> str | None:
    """The managed flag `arg` would set, if any: by its canonical name, and also when it is
    a prefix of one (`--hos`, `--por=1`, `--block`), which argparse with allow_abbrev (its
    default) would expand. Compared by name, before any `=value`."""
    if not arg.startswith("--"):
        return None
    name = arg.split("=", 1)[0]
    return next((flag for flag in MANAGED_FLAGS if flag.startswith(name)), None)


def parse_engine(engine: Mapping[str, Any]) -> EngineSettings:
    try:  # each setting against the table, then max_num_batched_tokens >= max_num_seqs
        values = settings_k8s.from_spec(engine)
    except ValueError as exc:
        raise InvalidSpecError(str(exc)) from None
    extra = get_field(engine, "extraArgs", "engine.", list, [])
    for arg in extra:
        if not isinstance(arg, str):
            raise InvalidSpecError(f"spec.engine.extraArgs must hold strings, got {arg!r}")
        if (managed := managed_flag(arg)) is not None:
            raise InvalidSpecError(f"spec.engine.extraArgs must not set {arg.split('=')[0]} "
                                   f"({managed}): the operator sets it from spec.engine, "
                                   "spec.model, spec.kvCache, spec.router or spec.apiKeySecretRef")
    return EngineSettings(**values, extra_args=tuple(extra))


def parse_rollout(rollout: Mapping[str, Any]) -> Rollout:
    strategy = get_field(rollout, "strategy", "rollout.", str, "RollingUpdate")
    if strategy not in ("RollingUpdate", "Recreate"):
        raise InvalidSpecError(f"spec.rollout.strategy must be RollingUpdate or Recreate, "
                               f"got {strategy!r}")
    surge = get_field(rollout, "maxSurge", "rollout.", (int, str), 0)
    unavailable = get_field(rollout, "maxUnavailable", "rollout.", (int, str), 1)
    for field, value in (("maxSurge", surge), ("maxUnavailable", unavailable)):
        if not PERCENT_OR_INT.match(str(value)):
            raise InvalidSpecError(f"spec.rollout.{field} must be a count or a percentage "
                                   f"like '25%', got {value!r}")
    if strategy == "RollingUpdate" and str(surge).rstrip("%") == "0" \
            and str(unavailable).rstrip("%") == "0":
        raise InvalidSpecError("spec.rollout.maxSurge and spec.rollout.maxUnavailable cannot "
                               "both be 0: the rollout could never make progress")
    timeout = positive(get_field(rollout, "startupTimeoutSeconds", "rollout.", int, 1800),
                        "rollout.startupTimeoutSeconds", minimum=10)
    assert timeout is not None
    return Rollout(strategy=strategy, max_surge=surge, max_unavailable=unavailable,
                   startup_timeout_seconds=timeout)


def parse_model_cache(cache: Mapping[str, Any] | None) -> ModelCache | None:
    if not cache:
        return None
    claim = get_field(cache, "claimName", "modelCache.", str)
    size = quantity(cache.get("size"), "modelCache.size")
    if (claim is None) == (size is None):
        raise InvalidSpecError("spec.modelCache needs exactly one of claimName (an existing "
                               "claim) or size (a claim the operator creates)")
    if claim is not None and not DNS_SUBDOMAIN.match(claim):
        raise InvalidSpecError(f"spec.modelCache.claimName {claim!r} is not a valid claim name")
    modes = get_field(cache, "accessModes", "modelCache.", list, ["ReadWriteOnce"])
    return ModelCache(claim_name=claim, size=size,
                      storage_class_name=get_field(cache, "storageClassName", "modelCache.", str),
                      access_modes=tuple(modes))


def parse_spec(spec: Mapping[str, Any], *, name: str, namespace: str,
               default_image: str = DEFAULT_IMAGE) -> ServiceSpec:
    """Turn a custom resource's spec into ServiceSpec; InvalidSpecError names the bad field."""
    if len(name) > MAX_NAME_LENGTH or not DNS_LABEL.match(name):
        raise InvalidSpecError(f"metadata.name {name!r} must be a DNS label (lower-case "
                               f"letters, digits, '-', starting with a letter) of at most "
                               f"{MAX_NAME_LENGTH} characters")
    model = get_field(spec, "model", "", dict)
    if model is None:
        raise InvalidSpecError("spec.model is required (spec.model.uri names the model)")
    res = get_field(spec, "resources", "", dict, {})
    gpus = get_field(res, "gpus", "resources.", int, 1)
    if gpus < 0:
        raise InvalidSpecError(f"spec.resources.gpus must be >= 0, got {gpus}")
    replicas = get_field(spec, "replicas", "", int, 1)
    if replicas < 0:
        raise InvalidSpecError(f"spec.replicas must be >= 0, got {replicas}")
    runtime_class = get_field(spec, "runtimeClassName", "", str)
    node_selector = get_field(spec, "nodeSelector", "", dict, {})
    if not all(isinstance(v, str) for v in node_selector.values()):
        raise InvalidSpecError("spec.nodeSelector values must be strings")
    engine = parse_engine(get_field(spec, "engine", "", dict, {}))
    autoscaling = parse_autoscaling(get_field(spec, "autoscaling", "", dict))
    router = parse_router(get_field(spec, "router", "", dict, {}))
    if autoscaling is not None and autoscaling.min_replicas == 0 and not router.enabled:
        raise InvalidSpecError("spec.autoscaling.minReplicas 0 needs spec.router.enabled: the "
                               "router holds requests while the first replica starts")
    return ServiceSpec(
        name=name, namespace=namespace,
        model=parse_model(model, default_name=name),
        image=get_field(spec, "image", "", str, default_image) or default_image,
        image_pull_policy=get_field(spec, "imagePullPolicy", "", str, "IfNotPresent"),
        replicas=replicas, gpus=gpus,
        gpu_resource_name=get_field(res, "gpuResourceName", "resources.", str, "nvidia.com/gpu"),
        cpu=quantity(res.get("cpu"), "resources.cpu"),
        memory=quantity(res.get("memory"), "resources.memory"),
        shared_memory=quantity(res.get("sharedMemory", "2Gi"), "resources.sharedMemory")
        or "2Gi",
        engine=engine,
        autoscaling=autoscaling,
        rollout=parse_rollout(get_field(spec, "rollout", "", dict, {})),
        model_cache=parse_model_cache(get_field(spec, "modelCache", "", dict)),
        env=tuple(get_field(spec, "env", "", list, [])),
        tolerations=tuple(get_field(spec, "tolerations", "", list, [])),
        node_selector=dict(node_selector),
        runtime_class_name=runtime_class,
        api_key=parse_api_key(get_field(spec, "apiKeySecretRef", "", dict)),
        network_policy=parse_network_policy(get_field(spec, "networkPolicy", "", dict, {})),
        router=router,
        kv_cache=parse_kv_cache(get_field(spec, "kvCache", "", dict),
                                prefix_caching=engine.enable_prefix_caching),
    )
