"""The search space: which engine settings a sweep varies and over which values.

It lives beside the settings table it reads (torch-free) because both the tuner and the
operator (api/paged_api/contract.py, parsing a PagedInferenceTuning's searchSpace) use it.

Command-line grammar (`--param NAME=SPEC`, repeatable; a file uses the same SPEC strings
or YAML lists/mappings):

  8,16,32            choices (one value fixes the setting)
  pow2:8..128        the powers of two in [8, 128], as choices
  1..64              an integer (or float, for float settings) range
  1..64:log          ... sampled on a log scale
  0.5..0.95:step=0.05  ... on a grid of that step
  none               leave the setting out (the engine's default applies)

A key of an object setting with a `tune` range is a dimension of its own, named by the key.
num_speculative_tokens is the speculative method and its length in one dimension:
num_speculative_tokens=off,ngram:4,suffix:8 (or 0,4,suffix:8: a bare K is n-gram) searches
speculative_config {"method": "ngram" | "suffix", "num_speculative_tokens": K}, 0 or off
(the key's `tune_off`) leaving speculation off; a range (0..8) is n-gram lengths.

YAML file (`--space-file`): a mapping NAME -> SPEC string, list of choices, or
{low, high, step, log}. It replaces the default space; `--param` then overrides entries.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from paged_api import settings as engine_settings
from paged_api import settings_k8s
from paged_api import settings_speculative as spec_decode

# The settings a sweep may vary: every row of the settings table a PagedInferenceService
# spec holds (spec.engine's, and the other sections' such as spec.kvCache.offloadGiB: each
# row's `section`; a result is applied there) and the keys of its object settings with a
# `tune` range. The default space is each one's `tune` range but OPT_IN ones, which a
# workload asks for (WorkloadSpec.tune_also): a host KV tier pays only when requests come
# back to prefixes the device pool evicted (multi-turn chat, RAG), else costs memory.
PARENT: dict[str, engine_settings.Setting] = {
    k.name: s for s in engine_settings.SPEC_SETTINGS for k in s.keys if k.tune}
SETTINGS: dict[str, engine_settings.Setting] = {
    s.name: s for s in engine_settings.IN_SPEC} | {
    k.name: k for s in engine_settings.SPEC_SETTINGS for k in s.keys if k.tune}
OPT_IN = frozenset({"kv_offloading_size"})

DEFAULT_SPACE = {s.name: s.tune for s in SETTINGS.values() if s.tune and s.name not in OPT_IN}
_BLOCK = engine_settings.SETTINGS["block_size"]
WIDE_BLOCK_SIZES = f"pow2:{int(_BLOCK.minimum)}..{int(_BLOCK.maximum)}"


class SpaceError(ValueError):
    """A search-space definition the user must fix; the message names the setting."""


@dataclass(frozen=True)
class Param:
    name: str
    choices: tuple | None = None       # categorical when set
    low: float | None = None
    high: float | None = None
    step: float | None = None
    log: bool = False

    @property
    def type(self) -> type:
        return SETTINGS[self.name].type

    def suggest(self, trial) -> Any:
        if self.choices is not None:
            return trial.suggest_categorical(self.name, list(self.choices))
        if self.type is int:
            return trial.suggest_int(self.name, int(self.low), int(self.high),
                                     step=int(self.step or 1), log=self.log)
        return trial.suggest_float(self.name, self.low, self.high, step=self.step, log=self.log)

    def grid_values(self) -> list:
        """Every value, for an exhaustive grid; SpaceError for a continuous range."""
        if self.choices is not None:
            return list(self.choices)
        if self.type is int and not self.log:
            return list(range(int(self.low), int(self.high) + 1, int(self.step or 1)))
        if self.step is None:
            raise SpaceError(f"{self.name}: a grid needs choices or a step, not {self.low}..{self.high}")
        n = int(round((self.high - self.low) / self.step))
        return [round(self.low + i * self.step, 10) for i in range(n + 1)]


def _convert(name: str, text: Any) -> Any:
    if name == spec_decode.DRAFT_DIMENSION:  # the method and its length: 4, suffix:8
        try:
            return spec_decode.draft_choice(text)
        except ValueError as exc:
            raise SpaceError(str(exc)) from None
    kind = SETTINGS[name].type
    if kind is bool:
        if isinstance(text, bool):
            return text
        if str(text).lower() in ("true", "1", "yes", "on"):
            return True
        if str(text).lower() in ("false", "0", "no", "off"):
            return False
        raise SpaceError(f"{name}: expected true/false, got {text!r}")
    try:
        value = kind(float(text)) if kind is int else kind(text)
    except (TypeError, ValueError):
        raise SpaceError(f"{name}: {text!r} is not a valid {kind.__name__}") from None
    if kind is int and float(text) != value:
        raise SpaceError(f"{name}: {text!r} is not an integer")
    return value


def parse_param(name: str, spec: Any) -> Param | None:
    """One setting's spec (string, list or mapping) -> Param; None for `none`."""
    if name not in SETTINGS:
        raise SpaceError(f"unknown setting {name!r}; known: {', '.join(SETTINGS)}")
    if SETTINGS[name].type is dict:
        keys = [k for k, parent in PARENT.items() if parent.name == name]
        raise SpaceError(f"{name} is searched by its keys, not as a whole: "
                         f"{', '.join(keys) or 'none of its keys has a range'}")
    if isinstance(spec, (list, tuple)):
        if not spec:
            raise SpaceError(f"{name}: empty list of choices")
        return Param(name, choices=_allowed(name, (_convert(name, v) for v in spec)))
    if isinstance(spec, dict):
        unknown = set(spec) - {"low", "high", "step", "log"}
        if unknown or "low" not in spec or "high" not in spec:
            raise SpaceError(f"{name}: a range needs keys low, high (and optional step, log)")
        return _range(name, spec["low"], spec["high"], spec.get("step"), bool(spec.get("log")))
    text = str(spec).strip()
    if text.lower() == "none":
        return None
    if not text:
        raise SpaceError(f"{name}: empty specification")
    if text.startswith("pow2:"):
        low, high = _bounds(name, text[5:])
        values = tuple(2 ** k for k in range(0, 31) if low <= 2 ** k <= high)
        if not values:
            raise SpaceError(f"{name}: no power of two in {text[5:]}")
        return Param(name, choices=_allowed(name, values))
    if ".." in text:
        body, *options = text.split(":")
        low, high = _bounds(name, body)
        step, log = None, False
        for option in options:
            if option == "log":
                log = True
            elif option.startswith("step="):
                step = _convert(name, option[5:])
            else:
                raise SpaceError(f"{name}: unknown range option {option!r} (use log or step=S)")
        return _range(name, low, high, step, log)
    return Param(name, choices=_allowed(name, (_convert(name, v) for v in text.split(",")
                                               if v.strip())))


def _allowed(name: str, values: Any) -> tuple:
    """Values the engine accepts (the settings table's rule), else SpaceError naming it."""
    out, s = tuple(values), SETTINGS[name]
    for value in out:
        if name in PARENT and value == s.tune_off:
            continue
        try:
            engine_settings.check(s, spec_decode.draft_split(value)[1] if
                                  name == spec_decode.DRAFT_DIMENSION else value, name)
        except ValueError as exc:
            off = f" (or {s.tune_off}: {PARENT[name].name} off)" if name in PARENT else ""
            raise SpaceError(f"{exc}{off}") from None
    return out


def _bounds(name: str, text: str) -> tuple[float, float]:
    parts = text.split("..")
    if len(parts) != 2:
        raise SpaceError(f"{name}: a range is LOW..HIGH, got {text!r}")
    return _convert(name, parts[0]), _convert(name, parts[1])


def _range(name: str, low: Any, high: Any, step: Any, log: bool) -> Param:
    if SETTINGS[name].type is bool:
        raise SpaceError(f"{name}: a boolean takes choices (true,false), not a range")
    if SETTINGS[name].power_of_two:
        raise SpaceError(f"{name}: must be a power of two; give choices or pow2:LO..HI, "
                         f"not a range")
    low, high = _allowed(name, (_convert(name, low), _convert(name, high)))
    if low > high:
        raise SpaceError(f"{name}: empty range {low}..{high} (low > high)")
    if log and (low <= 0 or step is not None):
        raise SpaceError(f"{name}: a log range needs low > 0 and no step")
    if step is not None and (step <= 0 or not math.isfinite(step)):
        raise SpaceError(f"{name}: step must be positive")
    return Param(name, low=low, high=high, step=step, log=log)


def build_space(*, params: list[str] = (), space_file: str | None = None,
                wide_block_sizes: bool = False, also: tuple[str, ...] = ()) -> list[Param]:
    """Defaults with the `tune` ranges of `also` (a workload's tune_also; or the file), then
    `--param NAME=SPEC` overrides. SpaceError when empty."""
    specs: dict[str, Any] = dict(DEFAULT_SPACE) | {n: SETTINGS[n].tune for n in also}
    if wide_block_sizes:
        specs["block_size"] = WIDE_BLOCK_SIZES
    if space_file:
        path = Path(space_file)
        if not path.is_file():
            raise SpaceError(f"--space-file {space_file}: no such file")
        loaded = yaml.safe_load(path.read_text()) or {}
        if not isinstance(loaded, dict):
            raise SpaceError(f"--space-file {space_file}: expected a mapping NAME -> SPEC")
        specs = loaded
    for item in params:
        name, sep, spec = item.partition("=")
        if not sep:
            raise SpaceError(f"--param {item!r}: expected NAME=SPEC, e.g. max_num_seqs=1..64:log")
        specs[name.strip()] = spec
    space = [p for p in (parse_param(n, s) for n, s in specs.items()) if p is not None]
    if not space:
        raise SpaceError("the search space is empty: give at least one setting with "
                         "--param NAME=SPEC or in --space-file")
    return space


def default_value(name: str) -> Any:
    """The engine's default of a dimension (a key dimension's parent unset: its tune_off)."""
    if name in PARENT:
        return SETTINGS[name].tune_off if PARENT[name].default is None else \
            PARENT[name].default.get(name)
    s = SETTINGS[name]
    return s.tune_off if s.default is None else s.default


def engine_values(values: dict[str, Any]) -> dict[str, Any]:
    """A trial's values by dimension -> the engine's settings by name (the table's): a key
    dimension goes into its object setting (with the keys' defaults; at its tune_off the
    object is None, unset; a setting at its tune_off too)."""
    out = {n: None if SETTINGS[n].tune_off is not None and v == SETTINGS[n].tune_off else v
           for n, v in values.items() if n not in PARENT}
    for name, value in values.items():
        if name not in PARENT:
            continue
        parent = PARENT[name]
        if value == SETTINGS[name].tune_off:
            out[parent.name] = None
        else:
            base = out.get(parent.name) or {k.name: k.default for k in parent.keys
                                            if k.default is not None}
            out[parent.name] = spec_decode.with_draft(base, value) if \
                name == spec_decode.DRAFT_DIMENSION else {**base, name: value}
    return out


def to_engine_spec(settings: dict[str, Any]) -> dict[str, Any]:
    """snake_case settings (dimensions) -> the camelCase keys of PagedInferenceService's
    spec.engine; an object setting a dimension turns off is None (a merge patch's null).
    Settings of other sections are left out: to_spec_patch places them."""
    out: dict[str, Any] = {}
    for name, value in engine_values(settings).items():
        s = SETTINGS[name]
        if s.section != "engine":
            continue
        if value is None:
            out[s.field] = None
        elif s.type is dict:
            out |= settings_k8s.to_spec({name: value})
            draft = settings.get(spec_decode.DRAFT_DIMENSION)
            if name == PARENT[spec_decode.DRAFT_DIMENSION].name and draft is not None:
                # a merge patch onto the target's keys: the other method's ones removed
                keys = {k.name: k.field for k in s.keys}
                out[s.field] |= {keys[k]: None for k in spec_decode.other_method_keys(draft)}
        else:
            out[s.field] = round(float(value), 4) if s.type is float else s.type(value)
    return out


def to_spec_patch(settings: dict[str, Any], *, record: bool = False) -> dict[str, Any]:
    """snake_case settings -> a merge patch of PagedInferenceService's spec: each setting at
    its row's spec.<section>.<field> (kv_offloading_size 2 -> kvCache.offloadGiB 2.0); one
    turned off is None, which removes it, or with `record` (a trial's line in
    status.history) its tune_off (offloadGiB 0), so the line names everything it ran."""
    out: dict[str, Any] = {"engine": to_engine_spec(settings)}
    for name, value in engine_values(settings).items():
        s = SETTINGS[name]
        if s.section == "engine":
            continue
        if value is None:
            value = s.tune_off if record else None
        out.setdefault(s.section, {})[s.field] = None if value is None else \
            round(float(value), 4) if s.type is float else s.type(value)
    return out


def from_spec_sections(spec: dict[str, Any], *, where: str = "spec") -> dict[str, Any]:
    """The settings outside spec.engine that a PagedInferenceService spec (or patch) sets,
    checked, by name."""
    try:
        return {s.name: engine_settings.check(s, (spec.get(s.section) or {})[s.field],
                                              f"{where}.{s.section}.{s.field}")
                for s in engine_settings.IN_SPEC if s.section != "engine"
                and (spec.get(s.section) or {}).get(s.field) is not None}
    except ValueError as exc:
        raise SpaceError(str(exc)) from None


def sections_baseline(spec: dict[str, Any], space: tuple[Param, ...] | list[Param], *,
                      where: str = "spec") -> dict[str, Any]:
    """The dimensions of `space` outside spec.engine at the values `spec` runs: its own,
    else the engine's default (kv_offloading_size 0: no host tier), so that a candidate
    equal to the current settings is not taken for a change."""
    have = from_spec_sections(spec, where=where)
    return {p.name: have.get(p.name, default_value(p.name)) for p in space
            if SETTINGS[p.name].section != "engine"}


def from_engine_spec(spec: dict[str, Any], *, where: str = "spec.engine") -> dict[str, Any]:
    """spec.engine's camelCase keys -> snake_case settings; SpaceError naming a key the
    tuner does not know (keys it does not set, such as cpuThreads, are refused too: a
    baseline the tuner cannot start its engine with would not be the baseline)."""
    by_key = {s.field: s.name for s in engine_settings.SPEC_SETTINGS}
    out: dict[str, Any] = {}
    for key, value in spec.items():
        if key not in by_key:
            raise SpaceError(f"{where}: unknown engine setting {key!r}; known: "
                             f"{', '.join(by_key)}")
        s = SETTINGS[by_key[key]]
        if s.type is dict:
            try:
                out[s.name] = engine_settings.check(s, value, f"{where}.{key}", by_field=True)
            except ValueError as exc:
                raise SpaceError(str(exc)) from None
            # ... and its key dimensions, so the baseline compares with searched settings
            out |= {k: spec_decode.draft_of(out[s.name]) if k == spec_decode.DRAFT_DIMENSION
                    else SETTINGS[k].tune_off if out[s.name] is None else out[s.name][k]
                    for k, parent in PARENT.items() if parent is s}
        else:
            out[s.name] = _convert(s.name, value)
    return out
