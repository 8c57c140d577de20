"""Request bodies in Kubernetes' protobuf encoding (`application/vnd.kubernetes.protobuf`),
decoded into the JSON objects the server stores; what kubectl's generators (`kubectl create
configmap|secret|namespace|deployment`) and Helm (its release Secrets, `--create-namespace`)
send for built-in kinds.

A body is the 4-byte magic `k8s\\x00` and a runtime.Unknown (typeMeta, raw, contentEncoding,
contentType) whose `raw` is the object's message. Messages are decoded with the table in
k8s_proto.json (made by proto_table_gen.py from the Kubernetes sources): field number ->
JSON name and type. A field present on the wire that Go's JSON encoding would leave out (a
zero value of a non-pointer `omitempty` field) is left out here too, so the object reads
as the same manifest sent as JSON would. The special types are mapped as their JSON forms
are: Time and MicroTime to RFC 3339 strings, Quantity to its string, IntOrString to an
integer or a string, RawExtension and apiextensions' JSON to the JSON they carry, bytes to
base64, the JSONSchemaPropsOr* unions to their one set side. An embedded Go struct (a
Volume's VolumeSource, a Probe's handler, LocalObjectReference) has its fields in its
parent's JSON object.
"""
from __future__ import annotations

import base64
import datetime
import functools
import json
import struct
from pathlib import Path
from typing import Any

MAGIC = b"k8s\x00"
CONTENT_TYPE = "application/vnd.kubernetes.protobuf"
_META = "k8s.io.apimachinery.pkg.apis.meta.v1."
_EXT = "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1."
# API group -> the folder of its Go package in k8s.io/api
_GROUP_PACKAGES = {"": "core", "apps": "apps", "batch": "batch", "policy": "policy",
                   "autoscaling": "autoscaling", "rbac.authorization.k8s.io": "rbac",
                   "coordination.k8s.io": "coordination", "discovery.k8s.io": "discovery",
                   "networking.k8s.io": "networking", "events.k8s.io": "events"}


class ProtobufError(ValueError):
    pass


@functools.lru_cache(maxsize=1)
def _table() -> dict[str, list]:
    return json.loads(Path(__file__).with_name("k8s_proto.json").read_text())


def message_of(api_version: str, kind: str) -> str:
    """The protobuf message name of an apiVersion/kind."""
    group, _, version = api_version.rpartition("/")
    if kind == "DeleteOptions" or (kind == "Status" and api_version == "v1"):
        return _META + kind   # DeleteOptions: sent in every group's version
    if group == "apiextensions.k8s.io":
        return f"{_EXT}{kind}"
    if group in _GROUP_PACKAGES:
        return f"k8s.io.api.{_GROUP_PACKAGES[group]}.{version}.{kind}"
    raise ProtobufError(f"{api_version} {kind} has no protobuf encoding here: send JSON")


# ---- the wire format ----

def _varint(data: bytes, pos: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= len(data):
            raise ProtobufError("truncated varint")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(data: bytes) -> dict[int, list[Any]]:
    """Field number -> its raw values in order (ints for varints and fixed, bytes)."""
    out: dict[int, list[Any]] = {}
    pos = 0
    while pos < len(data):
        key, pos = _varint(data, pos)
        number, wire = key >> 3, key & 7
        if wire == 0:
            value, pos = _varint(data, pos)
        elif wire == 1:
            value, pos = data[pos:pos + 8], pos + 8
        elif wire == 2:
            size, pos = _varint(data, pos)
            value, pos = data[pos:pos + size], pos + size
        elif wire == 5:
            value, pos = data[pos:pos + 4], pos + 4
        else:
            raise ProtobufError(f"unsupported wire type {wire} in field {number}")
        if pos > len(data):
            raise ProtobufError("truncated message")
        out.setdefault(number, []).append(value)
    return out


def _scalar(type_: str, raw: Any) -> Any:
    if type_ == "string":
        return raw.decode("utf-8")
    if type_ == "bytes":
        return base64.b64encode(raw).decode()
    if type_ == "bool":
        return bool(raw)
    if type_ in ("int32", "int64"):
        return raw - (1 << 64) if raw >= 1 << 63 else raw
    if type_ in ("uint32", "uint64"):
        return raw
    if type_ == "double":
        return struct.unpack("<d", raw)[0]
    if type_ == "float":
        return struct.unpack("<f", raw)[0]
    raise ProtobufError(f"unsupported scalar type {type_}")


def _time(data: bytes, micro: bool) -> str | None:
    f = _fields(data)
    seconds = _scalar("int64", f.get(1, [0])[-1])
    nanos = _scalar("int32", f.get(2, [0])[-1])
    if not data:
        return None
    t = datetime.datetime.fromtimestamp(seconds, datetime.timezone.utc)
    if micro:
        return t.strftime("%Y-%m-%dT%H:%M:%S") + f".{nanos // 1000:06d}Z"
    return t.strftime("%Y-%m-%dT%H:%M:%SZ")


def _special(name: str, data: bytes) -> tuple[bool, Any]:
    """(handled, value) for the types whose JSON form is not their message's."""
    if name in (_META + "Time", _META + "MicroTime"):
        return True, _time(data, name.endswith("MicroTime"))
    if name == "k8s.io.apimachinery.pkg.api.resource.Quantity":
        return True, _fields(data).get(1, [b""])[-1].decode()
    if name == "k8s.io.apimachinery.pkg.util.intstr.IntOrString":
        f = _fields(data)
        if f.get(1, [0])[-1] == 1:
            return True, f.get(3, [b""])[-1].decode()
        return True, _scalar("int32", f.get(2, [0])[-1])
    if name in ("k8s.io.apimachinery.pkg.runtime.RawExtension", _EXT + "JSON",
                _META + "FieldsV1"):
        raw = _fields(data).get(1, [b""])[-1]
        return True, json.loads(raw) if raw else None
    if name == _META + "Duration":
        nanos = _scalar("int64", _fields(data).get(1, [0])[-1])
        return True, f"{nanos / 1e9:g}s"
    if name == _EXT + "JSONSchemaPropsOrArray":
        f = _fields(data)
        if 1 in f:
            return True, decode_message(_EXT + "JSONSchemaProps", f[1][-1])
        return True, [decode_message(_EXT + "JSONSchemaProps", d) for d in f.get(2, [])]
    if name == _EXT + "JSONSchemaPropsOrBool":
        f = _fields(data)
        if 2 in f:
            return True, decode_message(_EXT + "JSONSchemaProps", f[2][-1])
        return True, bool(f.get(1, [0])[-1])
    if name == _EXT + "JSONSchemaPropsOrStringArray":
        f = _fields(data)
        if 1 in f:
            return True, decode_message(_EXT + "JSONSchemaProps", f[1][-1])
        return True, [d.decode() for d in f.get(2, [])]
    return False, None


def _value(type_: str, raw: Any) -> Any:
    if isinstance(raw, (bytes, bytearray)) and type_ not in (
            "string", "bytes", "double", "float"):
        return decode_message(type_, raw)
    return _scalar(type_, raw)


def _is_zero(value: Any) -> bool:
    return value is None or (not isinstance(value, (dict, list)) and value in ("", 0, False))


def decode_message(name: str, data: bytes) -> Any:
    handled, value = _special(name, data)
    if handled:
        return value
    spec = _table().get(name)
    if spec is None:
        raise ProtobufError(f"no protobuf table for {name}")
    raw = _fields(data)
    out: dict[str, Any] = {}
    for number, json_name, label, type_, flags in spec:
        if number not in raw:
            continue
        values = raw[number]
        if label == "map":
            key_type, value_type = type_
            entries = {}
            for entry in values:
                e = _fields(entry)
                key = _scalar(key_type, e[1][-1]) if 1 in e else _scalar(key_type, b"")
                entries[key] = _value(value_type, e[2][-1]) if 2 in e else (
                    "" if value_type in ("string", "bytes") else
                    _value(value_type, b""))
            out[json_name] = entries
        elif label == "repeated":
            items: list[Any] = []
            for item in values:
                if isinstance(item, (bytes, bytearray)) and type_ in (
                        "int32", "int64", "bool", "uint32", "uint64"):
                    pos = 0   # a packed repeated scalar
                    while pos < len(item):
                        v, pos = _varint(item, pos)
                        items.append(_scalar(type_, v))
                else:
                    items.append(_value(type_, item))
            out[json_name] = items
        elif "i" in flags:   # an embedded struct (a Probe's handler): fields of the parent
            out.update(_value(type_, values[-1]))
        else:
            value = _value(type_, values[-1])
            if value is None or ("p" not in flags and "k" not in flags and (
                    _is_zero(value) or ("z" in flags and value == {}))):
                continue   # Go's JSON would omit this zero value (omitempty)
            out[json_name] = value
    return out


def decode(body: bytes) -> dict[str, Any]:
    """A protobuf request body (with its envelope) as the JSON object it encodes."""
    if not body.startswith(MAGIC):
        raise ProtobufError("a protobuf body starts with the bytes k8s\\x00")
    envelope = _fields(body[len(MAGIC):])   # runtime.Unknown
    type_meta = _fields(envelope.get(1, [b""])[-1])
    api_version = type_meta.get(1, [b""])[-1].decode()
    kind = type_meta.get(2, [b""])[-1].decode()
    if encoding := envelope.get(3, [b""])[-1].decode():
        raise ProtobufError(f"content encoding {encoding} is not supported")
    obj = decode_message(message_of(api_version, kind), envelope.get(2, [b""])[-1])
    return {"apiVersion": api_version, "kind": kind, **obj}
