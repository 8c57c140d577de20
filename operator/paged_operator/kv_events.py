"""spec.router.policy: precise. The router follows every engine's KV-cache events (vLLM's
`--kv-events-config`: a ZeroMQ PUB socket and a replay socket) instead of guessing where
each prefix is cached.

What that adds to the children:
- the engine container binds both sockets on fixed ports, named so that the engines'
  headless Service (and so its EndpointSlices) carries them: the router reads each engine's
  event endpoints from the slice's `kv-events` and `kv-replay` ports
  (router/paged_router/discovery.py uses the same names);
- the router runs `--policy precise` (it hashes requests as the engines do, with the
  tokenizer the engines serve at GET /tokenizer: no model in the router pod);
- a NetworkPolicy `<name>-kv-events` (manifests_access.kv_events_network_policy) opens exactly those two ports of the engine pods to the
  router pods of this resource and nobody else (policies add up: the resource's main
  NetworkPolicy still admits port 8000 from the namespace). Without spec.networkPolicy
  nothing is restricted, so none is made: a policy that selects the engine pods would
  isolate them and close port 8000.
"""
from __future__ import annotations

import json
from typing import Any

from paged_api.service import ServiceSpec

PUB_PORT_NAME, REPLAY_PORT_NAME = "kv-events", "kv-replay"  # IANA service names: <= 15 chars
PUB_PORT, REPLAY_PORT = 5557, 5558                          # vLLM's defaults
TOPIC = "kv-events"


def enabled(spec: ServiceSpec) -> bool:
    return spec.router.enabled and spec.router.policy == "precise"


def policy_name(spec: ServiceSpec) -> str:
    return f"{spec.name}-kv-events"


def engine_args(spec: ServiceSpec) -> list[str]:
    """`--kv-events-config` for the engine: bind both sockets on every address of the pod
    (`*`: vLLM binds an endpoint with a wildcard host and connects otherwise)."""
    if not enabled(spec):
        return []
    config = {"enable_kv_cache_events": True, "publisher": "zmq",
              "endpoint": f"tcp://*:{PUB_PORT}", "replay_endpoint": f"tcp://*:{REPLAY_PORT}",
              "topic": TOPIC}
    return ["--kv-events-config", json.dumps(config, separators=(",", ":"))]


def container_ports(spec: ServiceSpec) -> list[dict[str, Any]]:
    if not enabled(spec):
        return []
    return [{"name": PUB_PORT_NAME, "containerPort": PUB_PORT, "protocol": "TCP"},
            {"name": REPLAY_PORT_NAME, "containerPort": REPLAY_PORT, "protocol": "TCP"}]


def service_ports(spec: ServiceSpec) -> list[dict[str, Any]]:
    """Ports of the engines' headless Service, so that the EndpointSlices list them."""
    if not enabled(spec):
        return []
    return [{"name": name, "port": port, "targetPort": name, "protocol": "TCP"}
            for name, port in ((PUB_PORT_NAME, PUB_PORT), (REPLAY_PORT_NAME, REPLAY_PORT))]

