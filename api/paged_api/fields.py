"""Field-level checks shared by the spec parser: types, quantities, DNS names.

Every error is an InvalidSpecError whose message names the field (spec.<path>) to change.
"""
from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
# The CRD's quantity pattern (Kubernetes' resource.Quantity, without negative values).
_QUANTITY = re.compile(r"^\+?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))"
                       r"(([KMGTPE]i)|[numkMGTPE]|([eE][+-]?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
PERCENT_OR_INT = re.compile(r"^[0-9]+%?$")
_SUFFIXES = {"": 1.0, "n": 1e-9, "u": 1e-6, "m": 1e-3, "k": 1e3, "M": 1e6, "G": 1e9,
             "T": 1e12, "P": 1e15, "E": 1e18, "Ki": 2.0**10, "Mi": 2.0**20, "Gi": 2.0**30,
             "Ti": 2.0**40, "Pi": 2.0**50, "Ei": 2.0**60}


def quantity_value(value: Any) -> float | None:
    """A Kubernetes quantity ("500m", "16Gi", "1e3", 4) as a float; None if it is not one."""
    text = str(value)
    if isinstance(value, bool) or not _QUANTITY.match(text):
        return None
    number = re.match(r"^\+?[0-9.]*", text)
    assert number is not None
    suffix = text[number.end():]
    if suffix[:1] in ("e", "E"):
        return float(number[0].lstrip("+") + suffix)
    return float(number[0].lstrip("+")) * _SUFFIXES[suffix]


class InvalidSpecError(ValueError):
    """The spec cannot be served; the message names the field to change."""


def get_field(obj: Mapping[str, Any], key: str, path: str, kind: type | tuple[type, ...],
              default: Any = None) -> Any:
    """obj[key] checked against `kind`; `path` is the parent's path ("engine.")."""
    value = obj.get(key, default)
    if value is None:
        return default
    # bool is an int subclass in Python; a YAML `true` must not pass as a number.
    wrong_bool = isinstance(value, bool) and bool not in (
        kind if isinstance(kind, tuple) else (kind,))
    if wrong_bool or not isinstance(value, kind):
        raise InvalidSpecError(f"spec.{path}{key} must be {_kind_name(kind)}, got {value!r}")
    return value


def _kind_name(kind: type | tuple[type, ...]) -> str:
    kinds = kind if isinstance(kind, tuple) else (kind,)
    names = {int: "an integer", float: "a number", str: "a string", bool: "a boolean",
             dict: "an object", list: "a list"}
    return " or ".join(names.get(k, k.__name__) for k in kinds)


def positive(value: int | None, field: str, *, minimum: int = 1) -> int | None:
    if value is not None and value < minimum:
        raise InvalidSpecError(f"spec.{field} must be >= {minimum}, got {value}")
    return value


def quantity(value: Any, field: str) -> str | None:
    if value is None:
        return None
    text = str(value)
    if quantity_value(value) is None:
        raise InvalidSpecError(f"spec.{field} must be a Kubernetes quantity like '4', "
                               f"'500m' or '16Gi', got {value!r}")
    return text
