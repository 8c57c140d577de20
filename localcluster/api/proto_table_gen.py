"""Writes localcluster/api/k8s_proto.json, the table `protobuf.py` decodes with: for each
Kubernetes API message the emulator accepts as protobuf, its fields' numbers, JSON names,
types, and whether Go's JSON encoding would keep a zero value (a pointer field, or one
without `omitempty`).

The facts come from the Kubernetes sources: each package's generated.proto (field numbers
and types) and its Go types (JSON names and tags, joined on the protobuf tag's name=).
A developer tool, run against checkouts of k8s.io/api, k8s.io/apimachinery and
k8s.io/apiextensions-apiserver:

    python -m localcluster.api.proto_table_gen API_DIR APIMACHINERY_DIR APIEXTENSIONS_DIR
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

OUT = Path(__file__).with_name("k8s_proto.json")
# The objects kubectl and Helm send as protobuf (and what they reach), and their lists.
ROOTS = [
    "core.v1." + k for k in ("Namespace", "ConfigMap", "Secret", "Service", "ServiceAccount",
                             "Pod", "PersistentVolumeClaim", "Endpoints", "Event")
] + ["apps.v1.Deployment", "apps.v1.ReplicaSet", "apps.v1.StatefulSet", "apps.v1.DaemonSet",
     "batch.v1.Job", "batch.v1.CronJob", "rbac.v1.Role", "rbac.v1.RoleBinding",
     "rbac.v1.ClusterRole", "rbac.v1.ClusterRoleBinding", "policy.v1.PodDisruptionBudget",
     "autoscaling.v1.Scale", "autoscaling.v2.HorizontalPodAutoscaler", "coordination.v1.Lease",
     "discovery.v1.EndpointSlice", "networking.v1.NetworkPolicy", "networking.v1.Ingress",
     "events.v1.Event"]
ROOTS = ["k8s.io.api." + r for r in ROOTS] + [
    "k8s.io.apiextensions_apiserver.pkg.apis.apiextensions.v1.CustomResourceDefinition",
    "k8s.io.apimachinery.pkg.apis.meta.v1.DeleteOptions",
    # what the server answers: errors as Status, watch events (protobuf_encode.py)
    "k8s.io.apimachinery.pkg.apis.meta.v1.Status",
    "k8s.io.apimachinery.pkg.apis.meta.v1.WatchEvent",
]

_MESSAGE = re.compile(r"^message (\w+) \{$")
_FIELD = re.compile(r"^\s*(optional|repeated)?\s*(map<\s*([\w.]+)\s*,\s*([\w.]+)\s*>|[\w.]+)"
                    r"\s+(\w+)\s*=\s*(\d+);")
_STRUCT = re.compile(r"^type (\w+) struct \{")
_GOFIELD = re.compile(r'^\s+\w+\s+(\S+)\s+`[^`]*json:"([^"]*)"[^`]*protobuf:"[^"]*name=(\w+)')
# an embedded struct (`VolumeSource `json:""``): its fields are the parent's in JSON
_EMBEDDED = re.compile(r'^\s+\*?([\w.]+)\s+`json:"(?:,inline)?"[^`]*protobuf:"([^"]*)"')


def _proto_messages(text: str, package: str) -> dict[str, list]:
    messages, current = {}, None
    for line in text.splitlines():
        if m := _MESSAGE.match(line):
            current = messages.setdefault(f"{package}.{m.group(1)}", [])
        elif line.startswith("}"):
            current = None
        elif current is not None and (m := _FIELD.match(line)):
            label, type_, key, value, name, number = m.groups()
            if key:
                current.append([int(number), name, "map", [key, _qualify(value, package)]])
            else:
                current.append([int(number), name, "repeated" if label == "repeated"
                                else "optional", _qualify(type_, package)])
    return messages


_SCALARS = {"string", "bytes", "bool", "int32", "int64", "uint32", "uint64", "double", "float",
            "sint32", "sint64", "fixed32", "fixed64"}


def _qualify(type_: str, package: str) -> str:
    if type_ in _SCALARS:
        return type_
    return type_[1:] if type_.startswith(".") else f"{package}.{type_}"


def _go_tags(folder: Path, package: str) -> dict[tuple[str, str], tuple[str, str]]:
    """(message, proto name) -> (JSON name, flags): p = pointer, k = zero kept by Go's JSON,
    i = embedded (JSON name ""): the message's fields are written into its parent's."""
    tags = {}
    for path in sorted(folder.glob("*.go")):
        if path.name.endswith("_test.go") or path.name.startswith("zz_"):
            continue
        struct = None
        for line in path.read_text().splitlines():
            if m := _STRUCT.match(line):
                struct = f"{package}.{m.group(1)}"
            elif line.startswith("}"):
                struct = None
            elif struct and (m := _EMBEDDED.match(line)):
                type_name, tag = m.group(1).rsplit(".", 1)[-1], m.group(2)
                name = re.search(r"name=(\w+)", tag)
                proto_name = name.group(1) if name else type_name[0].lower() + type_name[1:]
                tags[(struct, proto_name)] = ("", "i")
            elif struct and (m := _GOFIELD.match(line)):
                go_type, json_tag, proto_name = m.groups()
                name, *opts = json_tag.split(",")
                flags = ("p" if go_type.startswith("*") else "") + \
                    ("" if {"omitempty", "omitzero"} & set(opts) else "k") + \
                    ("z" if "omitzero" in opts else "")
                tags[(struct, proto_name)] = (name, flags)
    return tags


def build(repos: list[Path]) -> dict[str, list]:
    messages: dict[str, list] = {}
    tags: dict[tuple[str, str], tuple[str, str]] = {}
    for repo in repos:
        for proto in sorted(repo.rglob("generated.proto")):
            text = proto.read_text()
            package = re.search(r"^package ([\w.]+);", text, re.M).group(1)
            messages.update(_proto_messages(text, package))
            tags.update(_go_tags(proto.parent, package))
    table: dict[str, list] = {}
    todo = ROOTS + [r + "List" for r in ROOTS if r + "List" in messages]   # LIST answers
    while todo:
        name = todo.pop()
        if name in table:
            continue
        fields = []
        for number, proto_name, label, type_ in messages[name]:
            json_name, flags = tags.get((name, proto_name), (proto_name, ""))
            fields.append([number, json_name, label, type_, flags])
            for t in (type_ if label == "map" else [type_]):
                if t not in _SCALARS:
                    todo.append(t)
        table[name] = sorted(fields)
    return dict(sorted(table.items()))


def main() -> None:
    repos = [Path(p) for p in sys.argv[1:4]]
    OUT.write_text(json.dumps(build(repos), separators=(",", ":")) + "\n")
    print(f"wrote {OUT}")


if __name__ == "__main__":
    main()
