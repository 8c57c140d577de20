"""What a request constrains its output to, under vLLM's names (no torch, no xgrammar here)."""
from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, kw_only=True)
class StructuredOutputsParams:
    """Exactly one of: `json` (a JSON schema, as a dict or its text), `json_object` (any
    JSON object), `regex`, `choice` (one of these strings), `grammar` (EBNF, xgrammar's
    dialect of GBNF). JSON is generated compact (no free whitespace), so a small model
    cannot loop on blanks."""
    json: dict[str, Any] | str | None = None
    json_object: bool = False
    regex: str | None = None
    choice: tuple[str, ...] | list[str] | None = None
    grammar: str | None = None

    def __post_init__(self) -> None:
        given = [name for name in ("json", "regex", "choice", "grammar")
                 if getattr(self, name) is not None] + (["json_object"] if self.json_object else [])
        if len(given) != 1:
            raise ValueError("structured_outputs needs exactly one of json, json_object, regex, "
                             f"choice, grammar; got {given or 'none'}")
        if self.choice is not None:
            if not self.choice or not all(isinstance(c, str) and c for c in self.choice):
                raise ValueError("structured_outputs.choice must be a non-empty list of "
                                 "non-empty strings")
            object.__setattr__(self, "choice", tuple(self.choice))
        if self.json is not None and not isinstance(self.json, (dict, str)):
            raise ValueError("structured_outputs.json must be a JSON schema (object or text)")

    @property
    def kind(self) -> str:
        if self.json_object:
            return "json_object"
        return next(n for n in ("json", "regex", "choice", "grammar")
                    if getattr(self, n) is not None)

    def key(self) -> tuple[str, str]:
        """Hashable identity for the compiled-grammar cache."""
        value = getattr(self, self.kind)
        if self.kind == "json":
            value = self.json if isinstance(self.json, str) else _dumps(self.json)
        elif self.kind == "choice":
            value = _dumps(list(self.choice or ()))
        return self.kind, str(value)


def _dumps(value: Any) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))
