"""Who may reach the engine, and through what: spec.apiKeySecretRef (the engine's API key,
read from a mounted Secret file), spec.networkPolicy (ingress only from the namespace and
the router by default) and spec.router (a prefix-aware router in front of the replicas).
"""
from __future__ import annotations

import dataclasses
import re
from collections.abc import Mapping
from typing import Any

from paged_api.fields import DNS_SUBDOMAIN, InvalidSpecError, get_field, positive

ROUTER_POLICIES = ("prefix", "least-load", "round-robin", "precise")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SecretKeyRef:
    name: str
    key: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetworkPolicy:
    enabled: bool = True
    allow_from: tuple[Mapping[str, Any], ...] = ()  # extra NetworkPolicyPeers


@dataclasses.dataclass(frozen=True, kw_only=True)
class Router:
    enabled: bool = False
    policy: str = "prefix"
    replicas: int = 1
    hit_load_factor: float | None = None  # the prefix policy's --hit-load-factor; None: its default


def parse_api_key(ref: Mapping[str, Any] | None) -> SecretKeyRef | None:
    if ref is None:
        return None
    name = get_field(ref, "name", "apiKeySecretRef.", str)
    key = get_field(ref, "key", "apiKeySecretRef.", str, "api-key")
    if not name or not DNS_SUBDOMAIN.match(name):
        raise InvalidSpecError(f"spec.apiKeySecretRef.name must name a Secret (a lower-case "
                               f"DNS name), got {name!r}")
    if not re.match(r"^[-._a-zA-Z0-9]+$", key):
        raise InvalidSpecError(f"spec.apiKeySecretRef.key must be a Secret key "
                               f"([-._a-zA-Z0-9]+), got {key!r}")
    return SecretKeyRef(name=name, key=key)


def parse_network_policy(policy: Mapping[str, Any]) -> NetworkPolicy:
    peers = get_field(policy, "allowFrom", "networkPolicy.", list, [])
    if not all(isinstance(p, dict) and p for p in peers):
        raise InvalidSpecError("spec.networkPolicy.allowFrom must hold NetworkPolicyPeer "
                               "objects (podSelector / namespaceSelector / ipBlock)")
    return NetworkPolicy(enabled=get_field(policy, "enabled", "networkPolicy.", bool, True),
                         allow_from=tuple(peers))


def parse_router(router: Mapping[str, Any]) -> Router:
    policy = get_field(router, "policy", "router.", str, "prefix")
    if policy not in ROUTER_POLICIES:
        raise InvalidSpecError(f"spec.router.policy must be one of {list(ROUTER_POLICIES)}, "
                               f"got {policy!r}")
    replicas = positive(get_field(router, "replicas", "router.", int, 1), "router.replicas")
    assert replicas is not None
    hit = get_field(router, "hitLoadFactor", "router.", (int, float))
    if hit is not None and not 0 <= hit <= 16:
        raise InvalidSpecError(f"spec.router.hitLoadFactor must be in 0..16, got {hit!r}")
    return Router(enabled=get_field(router, "enabled", "router.", bool, False), policy=policy,
                  replicas=replicas, hit_load_factor=None if hit is None else float(hit))
