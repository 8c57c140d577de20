"""Objects written in Kubernetes' protobuf encoding, for clients that ask for it (`Accept:
application/vnd.kubernetes.protobuf`): the inverse of protobuf.py, from the same table.

Fields are written as Go's generated marshallers write them, so that a message reads back
the same in any client and the bytes match kubectl's own: in field-number order; a field
that is not a pointer always, with its zero value when the JSON object leaves it out (an
empty nested message, `""`, 0, false); an embedded struct from its parent's JSON fields; a
pointer field, a bytes field and a RawExtension's bytes only when set; map entries sorted
by key, each with its key and its value; repeated scalars unpacked. The special types take their JSON forms back: RFC 3339 strings to
Timestamps, Quantity strings, IntOrString, Go durations, RawExtension and apiextensions'
JSON as compact JSON bytes, the JSONSchemaPropsOr* unions.

A watch in protobuf (`;stream=watch`) is a sequence of frames: a 4-byte big-endian length,
then a WatchEvent message (no envelope) whose object holds the enveloped object's bytes.
"""
from __future__ import annotations

import base64
import datetime
import json
import re
import struct
from typing import Any

from .protobuf import _EXT, _META, MAGIC, ProtobufError, _table, message_of

_TIME, _MICRO = _META + "Time", _META + "MicroTime"
_QUANTITY = "k8s.io.apimachinery.pkg.api.resource.Quantity"
_INTSTR = "k8s.io.apimachinery.pkg.util.intstr.IntOrString"
_RAW = ("k8s.io.apimachinery.pkg.runtime.RawExtension", _EXT + "JSON", _META + "FieldsV1")
_PROPS = _EXT + "JSONSchemaProps"
_VARINT = {"int32", "int64", "uint32", "uint64", "bool"}
_DURATION_UNITS = {"ns": 1, "us": 10**3, "µs": 10**3, "ms": 10**6, "s": 10**9,
                   "m": 60 * 10**9, "h": 3600 * 10**9}


def _varint(value: int) -> bytes:
    value &= (1 << 64) - 1   # negative numbers: two's complement, ten bytes as in Go
    out = bytearray()
    while value > 0x7F:
        out.append(value & 0x7F | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _key(number: int, wire: int) -> bytes:
    return _varint(number << 3 | wire)


def _bytes_field(number: int, data: bytes) -> bytes:
    return _key(number, 2) + _varint(len(data)) + data


def _scalar_field(number: int, type_: str, value: Any, where: str) -> bytes:
    try:
        if type_ == "string":
            return _bytes_field(number, str(value or "").encode())
        if type_ == "bytes":
            return _bytes_field(number, base64.b64decode(value or "", validate=True))
        if type_ in _VARINT:
            return _key(number, 0) + _varint(int(value or 0))
        if type_ == "double":
            return _key(number, 1) + struct.pack("<d", float(value or 0))
        if type_ == "float":
            return _key(number, 5) + struct.pack("<f", float(value or 0))
    except (TypeError, ValueError) as e:
        raise ProtobufError(f"{where}: {value!r} is not a {type_}: {e}") from None
    raise ProtobufError(f"{where}: unsupported scalar type {type_}")


def _timestamp(value: str | None, where: str) -> bytes:
    if not value:
        return b""   # Go's zero time: an empty message
    try:
        t = datetime.datetime.fromisoformat(value.replace("Z", "+00:00"))
    except ValueError:
        raise ProtobufError(f"{where}: {value!r} is not an RFC 3339 time") from None
    seconds = int(t.timestamp() // 1)
    return _key(1, 0) + _varint(seconds) + _key(2, 0) + _varint(t.microsecond * 1000)


def _duration(value: Any, where: str) -> int:
    if isinstance(value, (int, float)):
        return int(value)
    text, total, sign = str(value or "0"), 0, 1
    if text[:1] in "+-":
        sign, text = (-1 if text[0] == "-" else 1), text[1:]
    parts = re.findall(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)", text)
    if text != "0" and "".join(a + b for a, b in parts) != text:
        raise ProtobufError(f"{where}: {value!r} is not a Go duration such as 1m30s")
    for number, unit in parts:
        total += round(float(number) * _DURATION_UNITS[unit])
    return sign * total


def _special(name: str, value: Any, where: str) -> bytes | None:
    """The message bytes of a type whose JSON form is not its message's; None otherwise."""
    if name in (_TIME, _MICRO):
        return _timestamp(value, where)
    if name == _QUANTITY:
        return _bytes_field(1, ("0" if value is None else str(value)).encode())
    if name == _INTSTR:
        if isinstance(value, str):
            return _key(1, 0) + _varint(1) + _key(2, 0) + _varint(0) + _bytes_field(3, value.encode())
        return _key(1, 0) + _varint(0) + _key(2, 0) + _varint(int(value or 0)) + \
            _bytes_field(3, b"")
    if name in _RAW:
        if value is None:
            return b""
        return _bytes_field(1, json.dumps(value, separators=(",", ":")).encode())
    if name == _META + "Duration":
        return _key(1, 0) + _varint(_duration(value, where))
    if name == _EXT + "JSONSchemaPropsOrArray":
        if isinstance(value, list):
            return b"".join(_bytes_field(2, encode_message(_PROPS, v, where)) for v in value)
        return _bytes_field(1, encode_message(_PROPS, value, where)) if value is not None else b""
    if name == _EXT + "JSONSchemaPropsOrBool":
        if isinstance(value, dict):
            return _key(1, 0) + _varint(1) + _bytes_field(2, encode_message(_PROPS, value, where))
        return _key(1, 0) + _varint(bool(value))
    if name == _EXT + "JSONSchemaPropsOrStringArray":
        if isinstance(value, list):
            return b"".join(_bytes_field(2, str(v).encode()) for v in value)
        return _bytes_field(1, encode_message(_PROPS, value, where)) if value is not None else b""
    return None


def _field(number: int, type_: str, value: Any, where: str) -> bytes:
    if type_ in _VARINT or type_ in ("string", "bytes", "double", "float"):
        return _scalar_field(number, type_, value, where)
    return _bytes_field(number, encode_message(type_, value, where))


def encode_message(name: str, obj: Any, where: str = "") -> bytes:
    """The message `name` (a table entry or a special type) holding the JSON value `obj`."""
    special = _special(name, obj, where)
    if special is not None:
        return special
    spec = _table().get(name)
    if spec is None:
        raise ProtobufError(f"no protobuf table for {name}")
    if obj is None:
        obj = {}
    if not isinstance(obj, dict):
        raise ProtobufError(f"{where or name}: {obj!r} is not an object")
    out = bytearray()
    for number, json_name, label, type_, flags in spec:
        at = f"{where}.{json_name}" if where else json_name
        value = obj if "i" in flags else obj.get(json_name)   # embedded: the parent's fields
        if label == "map":
            key_type, value_type = type_
            for k in sorted(value or {}):
                entry = _scalar_field(1, key_type, k, at) + _field(2, value_type, value[k],
                                                                   f"{at}[{k}]")
                out += _bytes_field(number, entry)
        elif label == "repeated":
            if value is not None and not isinstance(value, list):
                raise ProtobufError(f"{at}: {value!r} is not a list")
            for i, item in enumerate(value or []):
                out += _field(number, type_, item, f"{at}[{i}]")
        elif value is None and ("p" in flags or type_ == "bytes"):
            continue   # a nil pointer, a nil byte slice: not written
        else:
            out += _field(number, type_, value, at)
    return bytes(out)


def message_for(obj: dict[str, Any]) -> str | None:
    """The table's message for an object (by apiVersion and kind), None if it has none."""
    try:
        name = message_of(obj.get("apiVersion") or "", obj.get("kind") or "")
    except ProtobufError:
        return None
    return name if name in _table() else None


def encode(obj: dict[str, Any]) -> bytes:
    """An object with its envelope (magic, runtime.Unknown) as a server answers it."""
    name = message_for(obj)
    if name is None:
        raise ProtobufError(f"{obj.get('apiVersion')} {obj.get('kind')} has no protobuf "
                            "encoding here")
    type_meta = _bytes_field(1, obj["apiVersion"].encode()) + _bytes_field(2, obj["kind"].encode())
    raw = encode_message(name, obj)
    return MAGIC + _bytes_field(1, type_meta) + _bytes_field(2, raw) + \
        _bytes_field(3, b"") + _bytes_field(4, b"")


def watch_frame(type_: str, obj: dict[str, Any]) -> bytes:
    """One event of a protobuf watch stream: length prefix, WatchEvent{type, object}."""
    event = _bytes_field(1, type_.encode()) + _bytes_field(2, _bytes_field(1, encode(obj)))
    return struct.pack(">I", len(event)) + event
