"""spec.router.policy: precise: the engines publish KV events on named ports, the router
hashes with the model's tokenizer and finds those ports in the EndpointSlices, and a
NetworkPolicy opens them to the router pods only. Pure functions, plus the engine's and the
router's real parsers for what the operator writes."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from paged_operator import kv_events, manifests, manifests_access
from paged_operator.reconcile import optional_names
from paged_api.service import parse_spec

ENGINE = {"app.kubernetes.io/name": "paged-inference-engine", "app.kubernetes.io/instance": "svc"}
ROUTER = {"app.kubernetes.io/name": "paged-inference-router", "app.kubernetes.io/instance": "svc"}
# Kubernetes' IANA_SVC_NAME: what a container port's name and a NetworkPolicy's named port
# must be (1-15 characters, lower-case letters, digits and inner single hyphens, one letter).
IANA_SVC_NAME = re.compile(r"^(?=.*[a-z])[a-z0-9]([a-z0-9]|-(?!-))*[a-z0-9]$")


def spec_of(policy="precise", uri="Qwen/Qwen2.5-0.5B-Instruct", **fields):
    return parse_spec({"model": {"uri": uri}, "router": {"enabled": True, "policy": policy},
                       **fields}, name="svc", namespace="team")


def engine_container(spec):
    return manifests.deployment(spec)["spec"]["template"]["spec"]["containers"][0]


def test_precise_engines_publish_on_named_ports_the_headless_service_carries():
    spec = spec_of()
    container = engine_container(spec)
    args = container["args"]
    config = json.loads(args[args.index("--kv-events-config") + 1])
    assert config == {"enable_kv_cache_events": True, "publisher": "zmq",
                      "endpoint": "tcp://*:5557", "replay_endpoint": "tcp://*:5558",
                      "topic": "kv-events"}
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"http": 8000, "kv-events": 5557, "kv-replay": 5558}
    assert all(IANA_SVC_NAME.match(name) and len(name) <= 15 for name in ports)
    headless = manifests_access.engine_service(spec)["spec"]["ports"]
    assert headless[0]["name"] == "http"  # the router's backend port stays the first
    # each Service port reaches the container port of the same name and number
    assert {p["name"]: (p["port"], ports[p["targetPort"]]) for p in headless} == {
        "http": (8000, 8000), "kv-events": (5557, 5557), "kv-replay": (5558, 5558)}
    # the user-facing Service (the router's) does not expose the event ports
    assert [p["name"] for p in manifests.service(spec)["spec"]["ports"]] == ["http"]


def test_precise_router_needs_no_model_of_its_own():
    """The router hashes with the tokenizer the engines serve (GET /tokenizer): it gets no
    --tokenizer and, for weights on a claim, no mount of the claim (the engine does)."""
    for uri in ("Qwen/Qwen2.5-0.5B-Instruct", "pvc://weights/qwen"):
        pod = manifests_access.router_deployment(spec_of(uri=uri))["spec"]["template"]["spec"]
        args = pod["containers"][0]["args"]
        assert args[:4] == ["--discover", "svc-engine", "--policy", "precise"]
        assert "--tokenizer" not in args
        assert [v["name"] for v in pod["volumes"]] == ["tmp"]
        assert [m["mountPath"] for m in pod["containers"][0]["volumeMounts"]] == ["/tmp"]
    engine = manifests.deployment(spec_of(uri="pvc://weights/qwen"))["spec"]["template"][
        "spec"]
    assert {"name": "model", "persistentVolumeClaim": {"claimName": "weights",
                                                       "readOnly": True}} in engine["volumes"]


def test_network_policy_opens_the_event_ports_to_this_services_router_pods_only():
    spec = spec_of()
    policy = manifests_access.kv_events_network_policy(spec)
    assert policy["apiVersion"] == "networking.k8s.io/v1"
    assert policy["metadata"]["name"] == "svc-kv-events"
    assert policy["metadata"]["namespace"] == "team"
    assert policy["spec"] == {
        "podSelector": {"matchLabels": ENGINE}, "policyTypes": ["Ingress"],
        "ingress": [{"from": [{"podSelector": {"matchLabels": ROUTER}}],
                     "ports": [{"protocol": "TCP", "port": "kv-events"},
                               {"protocol": "TCP", "port": "kv-replay"}]}]}
    # the selectors select what the operator labels: engine pods and router pods
    engine_labels = manifests.deployment(spec)["spec"]["template"]["metadata"]["labels"]
    router_labels = manifests_access.router_deployment(spec)["spec"]["template"]["metadata"][
        "labels"]
    assert ENGINE.items() <= engine_labels.items() and not ROUTER.items() <= engine_labels.items()
    assert ROUTER.items() <= router_labels.items()
    # the named ports are the engine container's
    named = {p["name"] for p in engine_container(spec)["ports"]}
    assert {p["port"] for p in policy["spec"]["ingress"][0]["ports"]} <= named


@pytest.mark.parametrize("fields", [
    {"policy": "prefix"}, {"policy": "least-load"}, {"policy": "round-robin"},
])
def test_other_policies_have_no_event_ports_and_their_policy_is_deleted(fields):
    spec = spec_of(**fields)
    assert "--kv-events-config" not in engine_container(spec)["args"]
    assert [p["name"] for p in engine_container(spec)["ports"]] == ["http"]
    assert [p["name"] for p in manifests_access.engine_service(spec)["spec"]["ports"]] == ["http"]
    router_args = manifests_access.router_deployment(spec)["spec"]["template"]["spec"][
        "containers"][0]["args"]
    assert "--tokenizer" not in router_args
    # None: the reconciler deletes an earlier precise policy's NetworkPolicy (if ours)
    assert optional_names(spec)[("NetworkPolicy", "svc-kv-events")] is None
    assert optional_names(spec_of())[("NetworkPolicy", "svc-kv-events")] is not None


def test_router_off_or_network_policies_off_make_no_event_policy():
    off = parse_spec({"model": {"uri": "a/b"}, "router": {"policy": "precise"}},
                     name="svc", namespace="team")
    assert "--kv-events-config" not in engine_container(off)["args"]
    assert optional_names(off)[("NetworkPolicy", "svc-kv-events")] is None
    # nothing is restricted without network policies; one selecting the engines would
    # isolate them (port 8000 closed): none, though the engines still publish
    open_spec = spec_of(networkPolicy={"enabled": False})
    assert manifests_access.kv_events_network_policy(open_spec) is None
    assert "--kv-events-config" in engine_container(open_spec)["args"]


def test_engine_and_router_parse_what_the_operator_writes():
    from engine.entrypoints.cli import add_serve_arguments, engine_kwargs
    from paged_router.cli import build_parser as router_parser
    from paged_router.discovery import KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME

    spec = spec_of()
    parser = argparse.ArgumentParser(prog="python -m engine serve")
    add_serve_arguments(parser)
    kwargs = engine_kwargs(parser.parse_args(engine_container(spec)["args"]))
    assert kwargs["kv_events_config"]["endpoint"] == "tcp://*:5557"
    assert kwargs["kv_events_config"]["replay_endpoint"] == "tcp://*:5558"
    router = router_parser().parse_args(manifests_access.router_deployment(spec)["spec"][
        "template"]["spec"]["containers"][0]["args"])
    assert (router.policy, router.tokenizer, router.discover) == \
        ("precise", None, "svc-engine")
    # the router serves the engine Service's port that reaches the engines' HTTP port (its
    # slices also carry the event ports, in no promised order)
    service_ports = manifests_access.engine_service(spec)["spec"]["ports"]
    http = [p["name"] for p in service_ports if p["targetPort"] == "http"]
    assert router.port_name is not None and [router.port_name] == http
    # the router's discovery reads the ports under the names the operator gives them
    assert (KV_EVENTS_PORT_NAME, KV_REPLAY_PORT_NAME) == \
        (kv_events.PUB_PORT_NAME, kv_events.REPLAY_PORT_NAME)
