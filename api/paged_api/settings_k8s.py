"""The engine's settings table (api/paged_api/settings.py) as PagedInferenceService sees it:
spec.engine's checks and flag mapping, the flags the operator reserves, the CRD's schema.

Torch-free like the table: the operator image ships engine/__init__.py, settings.py and this.
Errors name spec.engine.<field> in the table's one format (`... must be <rule>, got <value>`).
"""
from __future__ import annotations

import dataclasses
import json
from collections.abc import Mapping
from typing import Any

from paged_api.settings import (IN_SPEC, RULES, SETTINGS, SPEC_SETTINGS, TABLE, Setting,
                             check, check_rules, flags_for)
from paged_api.settings_types import OnlyWhen

# Server flags the operator sets itself that are not engine settings: the model is passed
# as MODEL, --host/--port are the pod's, and the API key comes from a mounted Secret.
OPERATOR_SERVER_FLAGS = ("--model", "--host", "--port", "--api-key-file")


def managed_flags() -> tuple[str, ...]:
    """Flags extraArgs may not set: the operator sets them from spec.engine / spec.model."""
    flags = list(OPERATOR_SERVER_FLAGS[:3])
    for s in TABLE:
        if s.managed and s.flag and s.flag not in flags:
            flags.append(s.flag)
            if s.type is bool:
                flags.append(s.flag.replace("--", "--no-", 1))
    return (*flags, *OPERATOR_SERVER_FLAGS[3:])


def spec_label(s: Setting) -> str:
    return f"spec.{s.section}.{s.field}"


def from_spec(engine: Mapping[str, Any]) -> dict[str, Any]:
    """spec.engine's settings (camelCase) -> checked values by name; absent ones get the
    CRD's default when it declares one, else None (the engine's default). ValueError names
    spec.engine.<field>; the cross-setting rules apply with the engine's defaults."""
    values: dict[str, Any] = {}
    for s in SPEC_SETTINGS:
        raw = engine.get(s.field)
        if raw is None:
            values[s.name] = s.default if s.crd_default else None
        else:
            values[s.name] = check(s, raw, spec_label(s), by_field=True)
    check_rules(values, spec_label)
    return values


def to_spec(values: Mapping[str, Any]) -> dict[str, Any]:
    """Settings by name -> spec.engine's camelCase form (a dict setting's keys too); None
    (unset) left out."""
    out: dict[str, Any] = {}
    for name, value in values.items():
        s = SETTINGS[name]
        if value is None:
            continue
        if s.type is dict:
            value = {k.field: value[k.name] for k in s.keys if value.get(k.name) is not None}
        out[s.field] = value
    return out


def spec_to_flags(engine: Mapping[str, Any]) -> list[str]:
    """spec.engine (camelCase) -> the engine's flags, checked."""
    return flags_for(from_spec(engine))


def _value_schema(s: Setting, description: str) -> dict[str, Any]:
    """One setting's (or a dict setting's key's) OpenAPI v3 schema."""
    node: dict[str, Any] = {"type": {int: "integer", float: "number", bool: "boolean",
                                     str: "string", dict: "object"}[s.type],
                            "description": description}
    if s.type is dict:
        node["properties"] = {k.field: _value_schema(k, f"{k.help}; {k.rule}.")
                              for k in s.keys}
        required = [k.field for k in s.keys if k.default is None and not k.optional]
        if required:
            node["required"] = required
        field = {k.name: k.field for k in s.keys}
        rules = []
        for rule in s.key_rules:
            if isinstance(rule, OnlyWhen):  # the variant's keys only with its value
                key = next(k for k in s.keys if k.name == rule.key)
                keys = [field[k] for k in rule.keys]
                rules.append({"rule": f"(has(self.{key.field}) ? self.{key.field} : "
                                      f"{json.dumps(key.default)}) == {json.dumps(rule.value)}"
                                      f" || !({' || '.join(f'has(self.{k})' for k in keys)})",
                              "message": f"{', '.join(keys)} apply to {key.field} "
                                         f"{rule.value} only"})
                continue
            # an unset key is filled from the other: only both can break it
            lo, hi = field[rule.name], field[rule.other]
            rules.append({"rule": f"!has(self.{lo}) || !has(self.{hi}) || self.{lo} <= self.{hi}",
                          "message": f"{lo} must be <= {hi}"})
        if rules:
            node["x-kubernetes-validations"] = rules
    elif s.power_of_two:
        lo, hi = int(s.minimum or 1), int(s.maximum or 2**30)
        node["enum"] = [2**k for k in range(31) if lo <= 2**k <= hi]
    elif s.choices is not None:
        node["enum"] = list(s.choices)
    else:
        if s.minimum is not None:
            node["minimum"] = s.minimum
            if s.exclusive_minimum:
                node["exclusiveMinimum"] = True
        if s.maximum is not None:
            node["maximum"] = s.maximum
    if s.crd_default:
        node["default"] = s.default
    return node


def crd_engine_schema() -> dict[str, Any]:
    """The CRD's spec.engine OpenAPI v3 schema (scripts/gen_crd_engine.py writes it)."""
    props: dict[str, Any] = {}
    for s in SPEC_SETTINGS:
        rule = "an object of the keys below" if s.type is dict else s.rule
        props[s.field] = _value_schema(s, f"{s.help}. Flag {s.flag}; {rule}.")
    flags = ", ".join(f"'{f}'" for f in managed_flags())
    props["extraArgs"] = {
        "type": "array", "maxItems": 64,
        "description": "More engine flags, verbatim; not those spec.engine or spec.model set.",
        "items": {"type": "string", "maxLength": 256},
        # By canonical name, before any '=value', and any prefix of one (argparse would
        # expand '--hos' to '--host'); find() is Kubernetes' regex library.
        "x-kubernetes-validations": [{
            "rule": f"self.all(a, !a.startsWith('--') || ![{flags}].exists(f, "
                    "f.startsWith(a.find('^[^=]*'))))",
            "message": "extraArgs must not set (or abbreviate) flags the operator sets from "
                       "spec.engine, spec.model, spec.kvCache, spec.router or "
                       "spec.apiKeySecretRef"}]}
    rules = []
    for rule in RULES:
        a, b = SETTINGS[rule.name], SETTINGS[rule.other]
        side = [f"(has(self.{s.field}) ? self.{s.field} : {s.default})" for s in (a, b)]
        rules.append({"rule": f"{side[0]} >= {side[1]}",
                      "message": f"{a.field} must be >= {b.field} (unset: the engine's "
                                 f"defaults, {a.default} and {b.default}): {rule.why}"})
    return {"type": "object",
            "description": "Engine settings under vLLM's flag names in camelCase (generated "
                           "from api/paged_api/settings.py).",
            "x-kubernetes-validations": rules, "properties": props}


# spec.kvCache: the KV tiers under the device pool (engine/kv_offload/). The host tier is the
# table's rows of section kvCache; the disk tier is an object of its own: its directory is
# the volume the operator mounts (kv_disk_dir), and a disk tier of 0 GiB would store
# nothing, so spec.kvCache.disk.sizeGiB asks more than the engine.
KV_CACHE_SETTINGS: tuple[Setting, ...] = tuple(s for s in IN_SPEC if s.section == "kvCache")
KV_DISK_SIZE = dataclasses.replace(SETTINGS["kv_disk_size"], optional=False,
                                   exclusive_minimum=True)
# The claim name's pattern: a DNS subdomain, as Kubernetes names objects.
DNS_SUBDOMAIN = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$"


def crd_kv_cache_schema() -> dict[str, Any]:
    """The CRD's spec.kvCache OpenAPI v3 schema (scripts/gen_crd_engine.py writes it)."""
    rows = {s.field: _value_schema(s, f"{s.help}. Flag {s.flag}; {s.rule}; 0: off. Added "
                                      "to the engine container's memory request and limit.")
            for s in KV_CACHE_SETTINGS}
    size = _value_schema(KV_DISK_SIZE, f"{KV_DISK_SIZE.help}. Flag {KV_DISK_SIZE.flag} (and "
                         f"{SETTINGS['kv_disk_dir'].flag} at the volume's mount); "
                         f"{KV_DISK_SIZE.rule}.")
    claim = {"type": "object", "required": ["claimName"],
             "description": "An existing claim, shared by the replicas on a node (or by all "
                            "of them with ReadWriteMany): engines of one model find each "
                            "other's blocks.",
             "properties": {"claimName": {"type": "string", "minLength": 1, "maxLength": 253,
                                          "pattern": DNS_SUBDOMAIN}}}
    volume = {"type": "object",
              "description": "Where the disk tier lives: exactly one of emptyDir (the pod's "
                             "own, kept across its container's restarts; sizeLimit from "
                             "sizeGiB) or persistentVolumeClaim.",
              "x-kubernetes-validations": [{
                  "rule": "has(self.emptyDir) != has(self.persistentVolumeClaim)",
                  "message": "volume must set exactly one of emptyDir or "
                             "persistentVolumeClaim"}],
              "properties": {"emptyDir": {"type": "object"}, "persistentVolumeClaim": claim}}
    disk = {"type": "object", "required": ["sizeGiB", "volume"],
            "description": "A disk KV tier under the host tier (blocks as files keyed by "
                           "content hash and model).",
            "properties": {"sizeGiB": size, "volume": volume}}
    return {"type": "object",
            "description": "KV cache tiers under the device pool: blocks the pool evicts go "
                           "to host memory, then disk, and are loaded back instead of "
                           "recomputed; they need engine.enablePrefixCaching (generated from "
                           "api/paged_api/settings.py).",
            "properties": {**rows, "disk": disk}}
