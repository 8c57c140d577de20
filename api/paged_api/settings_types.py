"""The settings table's row types (api/paged_api/settings.py holds the table): a setting, and the
rules between settings or between a dict setting's keys. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Setting:
    name: str                        # EngineConfig field and LLM(...) keyword
    type: type                       # int, float, bool, str, or dict (a JSON object of `keys`)
    default: Any
    help: str
    flag: str | None = None          # `python -m engine serve` flag (vLLM's); None: Python only
    field: str | None = None         # camelCase key in its section of the spec (of its
                                     # object, for a dict setting's keys)
    section: str = "engine"          # where a PagedInferenceService spec holds it:
                                     # spec.<section>.<field> (engine, kvCache)
    optional: bool = False           # None is allowed (and means "decided at start-up")
    minimum: float | None = None
    maximum: float | None = None
    exclusive_minimum: bool = False
    power_of_two: bool = False
    choices: tuple[Any, ...] | None = None
    env: str | None = None           # environment variable that supplies the default
    managed: bool = False            # the operator sets the flag; extraArgs may not
    crd_default: bool = False        # the CRD declares the default (always passed on)
    tune: str | None = None          # the tuner's default range (api/paged_api/search_space.py's grammar)
    tune_off: Any = None             # the tuner's value that leaves the setting (or a dict
                                     # key's object) unset
    keys: tuple["Setting", ...] = ()  # type dict: its keys, each checked like a setting
    key_rules: tuple["AtMost", ...] = ()  # type dict: rules between its keys

    @property
    def rule(self) -> str:
        """What a valid value is, in words."""
        lo, hi = _num(self.minimum), _num(self.maximum)
        if self.power_of_two:
            text = f"a power of two in {lo}..{hi}"
        elif self.choices is not None:
            text = "one of " + ", ".join(show(c) for c in self.choices)
        elif self.type is bool:
            text = "true or false"
        elif self.type is str:
            text = "a string"
        elif self.type is dict:
            text = "a JSON object with keys " + ", ".join(k.name for k in self.keys)
        else:
            noun = "a whole number" if self.type is int else "a number"
            if self.minimum is not None and self.maximum is not None:
                text = f"{noun} in {'(' if self.exclusive_minimum else '['}{lo}, {hi}]" \
                    if self.type is float else f"{noun} in {lo}..{hi}"
            elif self.minimum is not None:
                text = f"{noun} {'>' if self.exclusive_minimum else '>='} {lo}"
            else:
                text = noun
        return text + (" (or unset)" if self.optional else "")


def _num(x: float | None) -> str:
    return "" if x is None else str(int(x)) if float(x).is_integer() else str(x)


def show(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


@dataclass(frozen=True)
class AtLeast:
    """Cross-setting rule: `name` >= `other`, unset ones taking the engine's defaults."""
    name: str
    other: str
    why: str


@dataclass(frozen=True)
class AtMost:
    """Rule between two keys of a dict setting: `name` <= `other` when both are given (an
    unset one is filled from the other)."""
    name: str
    other: str


@dataclass(frozen=True)
class OnlyWhen:
    """Rule between keys of a dict setting: `keys` may be given only while key `key` is
    `value` (its default counting when unset); they belong to that variant."""
    keys: tuple[str, ...]
    key: str
    value: Any
