"""The protobuf request bodies kubectl 1.35 sends (captured from `kubectl create ...` with
the server answering 500), decoded into the objects `kubectl create ... --dry-run=client
-o json` prints for the same command (creationTimestamp: null left out). No cluster."""
from __future__ import annotations

import pytest

from localcluster.api import protobuf

# kubectl create deployment d0 --image=example.org/x:1 --replicas=0 --port=8080
DEPLOYMENT = bytes.fromhex(
    "6b3873000a150a07617070732f7631120a4465706c6f796d656e7412bb010a1d0a02643012001a0022002a"
    "003200380042005a090a0361707012026430128b010800120b0a090a03617070120264301a720a1b0a0012"
    "001a0022002a003200380042005a090a0361707012026430125312350a0178120f6578616d706c652e6f72"
    "672f783a312a00320b0a00100018903f22002a0042006a007200800100880100900100a201001a00320042"
    "004a0052005800600068008201008a01009a0100c2010022020a00280038001a0c08001000180020002800"
    "38001a002200")
# kubectl create service clusterip web --tcp=80:8080
SERVICE = bytes.fromhex(
    "6b3873000a0d0a02763112075365727669636512690a1f0a0377656212001a0022002a0032003800420"
    "05a0a0a03617070120377656212420a1b0a0738302d38303830120354435018502207080010903f1a00"
    "2800120a0a0361707012037765621a002209436c757374657249503a00420052005a00600068001a020a"
    "001a002200")
# kubectl create secret generic s1 --from-literal=key=v
SECRET = bytes.fromhex(
    "6b3873000a0c0a027631120653656372657412200a120a02733112001a0022002a00320038004200120"
    "80a036b65791201761a001a002200")


def test_a_deployment_keeps_its_zero_replicas_and_drops_go_zero_values():
    assert protobuf.decode(DEPLOYMENT) == {
        "apiVersion": "apps/v1", "kind": "Deployment",
        "metadata": {"name": "d0", "labels": {"app": "d0"}},
        "spec": {"replicas": 0, "selector": {"matchLabels": {"app": "d0"}},
                 "template": {"metadata": {"labels": {"app": "d0"}}, "spec": {"containers": [
                     {"name": "x", "image": "example.org/x:1",
                      "ports": [{"containerPort": 8080}], "resources": {}}]}},
                 "strategy": {}},
        "status": {}}


def test_a_service_port_and_its_int_or_string_target():
    assert protobuf.decode(SERVICE)["spec"] == {
        "ports": [{"name": "80-8080", "protocol": "TCP", "port": 80, "targetPort": 8080}],
        "selector": {"app": "web"}, "type": "ClusterIP"}


def test_a_secrets_bytes_are_base64_as_in_json():
    assert protobuf.decode(SECRET) == {"apiVersion": "v1", "kind": "Secret",
                                       "metadata": {"name": "s1"}, "data": {"key": "dg=="}}


@pytest.mark.parametrize("body, error", [
    (b'{"kind": "Secret"}', "starts with the bytes"),
    (SECRET[:-9], "truncated"),
    (SECRET.replace(b"Secret", b"Widget"), "no protobuf table"),
])
def test_bad_bodies_are_refused_with_the_reason(body, error):
    with pytest.raises(protobuf.ProtobufError, match=error):
        protobuf.decode(body)
