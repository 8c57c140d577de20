"""The server's protobuf answers (protobuf_encode.py) and its content negotiation
(negotiate.py), without a cluster: kubectl's own request bodies re-encoded byte for byte,
every message of the table round-tripped through the decoder, hand-computed wire bytes,
watch frames, and the Accept headers clients send."""
from __future__ import annotations

import base64
import struct
from pathlib import Path

import pytest

from localcluster.api import negotiate, protobuf, protobuf_encode
from localcluster.api.proto_table_gen import ROOTS
from localcluster.api.protobuf import _EXT, _GROUP_PACKAGES, _META, _table
from localcluster.api.writes import ApiError
from test_protobuf_bodies import DEPLOYMENT, SECRET, SERVICE

PB, JSON = negotiate.PROTOBUF, negotiate.JSON


CAPTURED = dict(line.split() for line in (Path(__file__).parent / "kubectl_protobuf_bodies.txt")
                .read_text().splitlines() if not line.startswith("#"))
BODIES = {"deployment": DEPLOYMENT, "service": SERVICE, "secret": SECRET,
          **{command.replace("_", " "): bytes.fromhex(h) for command, h in CAPTURED.items()}}


@pytest.mark.parametrize("body", BODIES.values(), ids=BODIES.keys())
def test_kubectl_bodies_are_written_back_byte_for_byte(body):
    """kubectl (Go's marshallers) is the oracle: zero fields written, map keys sorted,
    empty Time, IntOrString's three fields, embedded structs (an Ingress rule's paths),
    the envelope's empty encoding and type."""
    assert protobuf_encode.encode(protobuf.decode(body)) == body


def test_captured_bodies_read_as_their_manifests():
    def body(command: str) -> dict:
        return protobuf.decode(next(b for name, b in BODIES.items() if command in name))
    pdb, ingress = body("create poddisruptionbudget"), body("create ingress")
    assert pdb["spec"] == {"minAvailable": "50%", "selector": {"matchLabels": {"app": "x"}}}
    [rule] = ingress["spec"]["rules"]
    assert rule["host"] == "foo.com" and rule["http"]["paths"][0]["backend"]["service"] == {
        "name": "svc1", "port": {"number": 8080}}


def test_hand_computed_wire_bytes():
    cause = protobuf_encode.encode_message(_META + "StatusCause", {"reason": "FieldValueInvalid"})
    assert cause == b"\x0a\x11FieldValueInvalid" + b"\x12\x00" + b"\x1a\x00"
    # name, group, kind (""), no causes, retryAfterSeconds (field 5, varint), uid ("");
    # 300 is 0xac 0x02, -1 a ten-byte two's complement varint
    empty = b"\x0a\x00\x12\x00\x1a\x00"
    details = _META + "StatusDetails"
    assert protobuf_encode.encode_message(details, {"retryAfterSeconds": 300}) == \
        empty + b"\x28\xac\x02" + b"\x32\x00"
    assert protobuf_encode.encode_message(details, {"retryAfterSeconds": -1}) == \
        empty + b"\x28" + b"\xff" * 9 + b"\x01" + b"\x32\x00"
    # a pointer left out is not written; a Time is seconds (1) and nanos (2)
    meta = protobuf_encode.encode_message(_META + "ObjectMeta", {
        "name": "a", "creationTimestamp": "1970-01-01T00:02:10Z"})
    assert b"\x42\x05\x08\x82\x01\x10\x00" in meta and b"\x4a" not in meta   # 130 s; no field 9
    # map entries (field 11) sorted by key, each a key (1) and a value (2)
    labels = protobuf_encode.encode_message(_META + "ObjectMeta", {"labels": {"b": "2", "a": ""}})
    assert labels.endswith(b"\x5a\x05\x0a\x01a\x12\x00" + b"\x5a\x06\x0a\x01b\x12\x012")


_SCALARS = {"string": lambda n: f"v{n}", "bytes": lambda n: base64.b64encode(bytes([0, n])).decode(),
            "bool": lambda n: True, "int32": lambda n: -n, "int64": lambda n: -n * 10**10,
            "uint32": lambda n: n, "uint64": lambda n: n, "double": lambda n: 1.5,
            "float": lambda n: 0.25}
_SPECIAL = {_META + "Time": "2026-01-02T03:04:05Z", _META + "MicroTime": "2026-01-02T03:04:05.123456Z",
            "k8s.io.apimachinery.pkg.api.resource.Quantity": "1500m",
            "k8s.io.apimachinery.pkg.runtime.RawExtension": {"a": [1, "b", None]},
            _EXT + "JSON": [1, {"x": True}], _META + "FieldsV1": {"f:data": {}},
            _META + "Duration": "1.5s", _EXT + "JSONSchemaPropsOrBool": True,
            _EXT + "JSONSchemaPropsOrStringArray": ["a", "b"]}


def sample(name: str, depth: int = 0, number: int = 1):
    """A value of the message with every field set (non-zero), nested three levels deep."""
    if name in _SCALARS:
        return _SCALARS[name](number)
    if name in _SPECIAL:
        return _SPECIAL[name]
    if name == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        return "http" if number % 2 else 8080
    if name == _EXT + "JSONSchemaPropsOrArray":
        return sample(_EXT + "JSONSchemaProps", depth + 1)
    out = {}
    for num, json_name, label, type_, flags in _table()[name]:
        deep = depth >= 3
        if "i" in flags:   # an embedded struct: its fields in this object
            out.update(sample(type_, depth + 1, num))
        elif label == "map":
            if not deep:
                out[json_name] = {k: sample(type_[1], depth + 1, num + i)
                                  for i, k in enumerate(["b", "a"])}
        elif label == "repeated":
            if not deep:
                out[json_name] = [sample(type_, depth + 1, num + i) for i in range(2)]
        elif "p" not in flags or not deep:
            out[json_name] = sample(type_, depth + 1, num)
    return out


@pytest.mark.parametrize("name", sorted(_table()))
def test_every_message_round_trips(name):
    obj = sample(name)
    assert protobuf.decode_message(name, protobuf_encode.encode_message(name, obj)) == obj


def _api_version(message: str) -> str:
    if message.startswith(_EXT):
        return "apiextensions.k8s.io/v1"
    _, _, _, package, version, _ = message.split(".", 5)
    group = {v: k for k, v in _GROUP_PACKAGES.items()}[package]
    return f"{group}/{version}" if group else version


KINDS = [r for r in ROOTS if r.startswith(("k8s.io.api.", _EXT))]


@pytest.mark.parametrize("message", KINDS + [k + "List" for k in KINDS if k + "List" in _table()])
def test_every_kind_and_list_round_trips_with_its_envelope(message):
    obj = {"apiVersion": _api_version(message), "kind": message.rsplit(".", 1)[1],
           **sample(message)}
    assert protobuf_encode.message_for(obj) == message
    body = protobuf_encode.encode(obj)
    assert body.startswith(b"k8s\x00\x0a") and protobuf.decode(body) == obj


def test_a_status_error_round_trips():
    status = {"apiVersion": "v1", "kind": "Status", "metadata": {}, "status": "Failure",
              "message": 'configmaps "c" already exists', "reason": "AlreadyExists",
              "details": {"name": "c", "kind": "configmaps"}, "code": 409}
    assert protobuf.decode(protobuf_encode.encode(status)) == status


def test_a_watch_frame_is_a_length_and_a_watch_event_holding_the_enveloped_object():
    cm = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c", "resourceVersion": "7"},
          "data": {"a": "1"}}
    frame = protobuf_encode.watch_frame("MODIFIED", cm)
    (size,) = struct.unpack(">I", frame[:4])
    assert size == len(frame) - 4 and frame[4:15] == b"\x0a\x08MODIFIED\x12"
    event = protobuf._fields(frame[4:])   # WatchEvent: type (1), object (2)
    assert sorted(event) == [1, 2] and event[1] == [b"MODIFIED"]
    raw_extension = event[2][0]
    inner = protobuf._fields(raw_extension)[1][0]   # RawExtension.raw: the object's own body
    assert protobuf.decode(inner) == cm


@pytest.mark.parametrize("value, error", [
    ({"metadata": {"creationTimestamp": "yesterday"}}, "metadata.creationTimestamp: 'yesterday'"
                                                       " is not an RFC 3339 time"),
    ({"spec": {"replicas": "three"}}, "spec.replicas: 'three' is not a int32"),
    ({"spec": {"template": {"spec": {"containers": {"name": "x"}}}}},
     "spec.template.spec.containers: .* is not a list"),
    ({"spec": {"progressDeadlineSeconds": 1, "minReadySeconds": [1]}}, "spec.minReadySeconds"),
])
def test_values_that_do_not_fit_their_field_are_named(value, error):
    with pytest.raises(protobuf.ProtobufError, match=error):
        protobuf_encode.encode({"apiVersion": "apps/v1", "kind": "Deployment", **value})


@pytest.mark.parametrize("accept, chosen", [
    ("application/vnd.kubernetes.protobuf,application/json", PB),      # client-go, Helm
    ("application/vnd.kubernetes.protobuf, */*", PB),
    ("application/json, application/vnd.kubernetes.protobuf", JSON),
    ("application/json;q=0.5, application/vnd.kubernetes.protobuf;q=0.9", PB),
    ("application/vnd.kubernetes.protobuf;q=0.4,application/json", JSON),
    ("*/*, application/vnd.kubernetes.protobuf", PB),       # the specific range ranks first
    ("application/vnd.kubernetes.protobuf;q=0, application/json", JSON),
    ("application/vnd.kubernetes.protobuf;stream=watch", PB),
    ("application/json;as=Table;v=v1;g=meta.k8s.io,application/json", JSON),   # kubectl get
    ("application/vnd.kubernetes.protobuf;as=Table;v=v1;g=meta.k8s.io,application/json", JSON),
    ("application/yaml", JSON), ("", JSON), (None, JSON), ("*/*", JSON),
])
def test_accept_headers_rank_by_q_value_then_specificity_then_order(accept, chosen):
    assert negotiate.choice(accept) == chosen


def test_custom_resources_stay_json_and_refuse_protobuf_only():
    cr = {"apiVersion": "serving.pagedinference.dev/v1alpha1", "kind": "PagedInferenceService"}
    assert not negotiate.wants_protobuf(f"{PB},{JSON}", cr)
    with pytest.raises(ApiError) as raised:
        negotiate.wants_protobuf(PB, cr)
    assert raised.value.code == 406 and "application/json" in raised.value.message
    assert negotiate.wants_protobuf(PB, {"apiVersion": "v1", "kind": "Secret"})
    assert not negotiate.wants_protobuf(JSON, {"apiVersion": "v1", "kind": "Secret"})


def test_an_object_protobuf_cannot_hold_is_answered_in_json_if_the_client_takes_it():
    responder = negotiate.Responder()
    odd = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"creationTimestamp": "soon"}}
    answer = responder.answer(f"{PB},{JSON}", odd)
    assert answer.content_type == JSON and responder.counts == {"fallback": 1, JSON: 1}
    with pytest.raises(ApiError, match="cannot be written in protobuf .*soon"):
        responder.answer(PB, odd)
    assert responder.answer(PB, {**odd, "metadata": {}}).content_type == PB
    assert responder.counts[PB] == 1
