"""Error causes in kube-apiserver's words (field.Error.ErrorBody): what a 422 Status of
the local API server lists in details.causes, and the type names and field paths in them."""
from __future__ import annotations

import json
from typing import Any


def show(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))


_REASONS = {"Required value": "FieldValueRequired", "Invalid value": "FieldValueInvalid",
            "Unsupported value": "FieldValueNotSupported", "Too long": "FieldValueTooLong",
            "Too many": "FieldValueTooMany", "Forbidden": "FieldValueForbidden",
            "Duplicate value": "FieldValueDuplicate"}


def cause(path: str, kind: str, value: Any = None, detail: str = "",
          show_value: bool = True) -> dict[str, str]:
    body = kind if value is None or not show_value else f"{kind}: {show(value)}"
    if detail:
        body += f": {detail}"
    return {"reason": _REASONS.get(kind, "FieldValueInvalid"), "message": body,
            "field": path or "<nil>"}


def type_of(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    return {str: "string", dict: "object", list: "array"}.get(type(value), "object")


def join_path(path: str, name: str) -> str:
    return f"{path}.{name}" if path else name
