"""A PagedInferenceTuning's spec, read once at the boundary into a `TuningSpec`.

Names follow the CRD (camelCase); `searchSpace` keys are `spec.engine`'s keys, mapped to
the tuner's settings through the one table of engine settings (tuner.space.SETTINGS), so
the CRD, the tuner and the engine agree. A value is a list of choices or a range
`{min, max, log, step}`. Errors are ValueErrors naming the field to change.
"""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from loadtests.workloads import WORKLOAD_NAMES
from tuner.space import SETTINGS, Param, SpaceError, parse_param

GROUP = "serving.pagedinference.dev"
VERSION = "v1alpha1"
TUNINGS = "pagedinferencetunings"
SERVICES = "pagedinferenceservices"
MODES = ("Manual", "Auto")
BY_KEY = {key: name for name, (_, key, _) in SETTINGS.items()}
# PagedInferenceService names are at most 52 characters; trial names add "-c9-baseline"
MAX_NAME = 38


@dataclass(frozen=True)
class TuningSpec:
    target: str
    workload: str
    space: tuple[Param, ...]
    trials: int = 24
    parallelism: int = 1
    duration: float = 120.0         # seconds of load per measurement
    users: int | None = None        # closed loop; None: the workload's
    rate: float | None = None       # open loop instead (requests/s)
    slo: tuple[tuple[str, float], ...] = ()   # (ttft|tpot|e2e, seconds) overrides
    length_scale: float = 1.0
    warmup_requests: int = 2
    confirm_rounds: int = 3
    candidates: int = 1
    prometheus_url: str | None = None
    mode: str = "Manual"
    min_gain: float = 1.0
    startup_timeout: float = 600.0
    seed: int = 0


def parse_duration(value: Any, field: str) -> float:
    """`120`, `"120s"`, `"2m"`, `"1.5m"` -> seconds."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*(s|m|h)?\s*", str(value))
        if not found:
            raise ValueError(f"spec.{field}: {value!r} is not a duration such as 120s or 2m")
        seconds = float(found[1]) * {"s": 1, "m": 60, "h": 3600, None: 1}[found[2]]
    if seconds <= 0:
        raise ValueError(f"spec.{field} must be positive, got {value!r}")
    return seconds


def _number(spec: dict, field: str, kind: type, default: Any, *, low: float) -> Any:
    value = spec.get(field, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) \
            or (kind is int and float(value) != int(value)):
        raise ValueError(f"spec.{field}: expected {kind.__name__}, got {value!r}")
    if value < low:
        raise ValueError(f"spec.{field} must be at least {low:g}, got {value!r}")
    return kind(value)


def search_space(space: Any) -> tuple[Param, ...]:
    """`{blockSize: [16, 32], maxNumSeqs: {min: 8, max: 512, log: true}}` -> Params."""
    if not isinstance(space, dict) or not space:
        raise ValueError("spec.searchSpace: give at least one engine setting, e.g. "
                         "{maxNumSeqs: {min: 8, max: 256, log: true}}")
    out = []
    for key, value in space.items():
        if key not in BY_KEY:
            raise ValueError(f"spec.searchSpace.{key}: unknown engine setting; known: "
                             f"{', '.join(BY_KEY)}")
        if isinstance(value, dict):
            unknown = set(value) - {"min", "max", "log", "step"}
            if unknown or not {"min", "max"} <= set(value):
                raise ValueError(f"spec.searchSpace.{key}: a range is {{min, max, log, step}}")
            value = {"low": value["min"], "high": value["max"],
                     **{k: value[k] for k in ("log", "step") if k in value}}
        elif not isinstance(value, list):
            raise ValueError(f"spec.searchSpace.{key}: expected a list of values or "
                             "{min, max, log, step}")
        try:
            param = parse_param(BY_KEY[key], value)
        except SpaceError as exc:
            raise ValueError(f"spec.searchSpace.{key}: {exc}") from None
        if param is not None:
            out.append(param)
    return tuple(out)


def parse_tuning(spec: dict[str, Any]) -> TuningSpec:
    target = (spec.get("targetRef") or {}).get("name")
    if not target:
        raise ValueError("spec.targetRef.name: name the PagedInferenceService to tune")
    workload = spec.get("workload", "chat")
    if workload not in WORKLOAD_NAMES:
        raise ValueError(f"spec.workload: {workload!r} is not one of {', '.join(WORKLOAD_NAMES)}")
    slo = []
    for field, name in (("ttftSeconds", "ttft"), ("itlSeconds", "tpot"), ("e2eSeconds", "e2e")):
        value = (spec.get("slo") or {}).get(field)
        if value is not None:
            slo.append((name, _number(spec["slo"], field, float, None, low=1e-6)))
    apply = spec.get("apply") or {}
    mode = apply.get("mode", "Manual")
    if mode not in MODES:
        raise ValueError(f"spec.apply.mode: {mode!r} is not Manual or Auto")
    confirm = spec.get("confirm") or {}
    rounds = _number(confirm, "rounds", int, 3, low=2)
    if spec.get("users") is not None and spec.get("rate") is not None:
        raise ValueError("spec.users and spec.rate: give one (closed or open loop), not both")
    return TuningSpec(
        target=target, workload=workload, space=search_space(spec.get("searchSpace")),
        trials=_number(spec, "trials", int, 24, low=1),
        parallelism=_number(spec, "parallelism", int, 1, low=1),
        duration=parse_duration(spec.get("trialDuration", "120s"), "trialDuration"),
        users=_number(spec, "users", int, None, low=1),
        rate=_number(spec, "rate", float, None, low=1e-6), slo=tuple(slo),
        length_scale=_number(spec, "lengthScale", float, 1.0, low=1e-3),
        warmup_requests=_number(spec, "warmupRequests", int, 2, low=0),
        confirm_rounds=rounds, candidates=_number(confirm, "candidates", int, 1, low=1),
        prometheus_url=(spec.get("prometheus") or {}).get("url") or None,
        mode=mode, min_gain=_number(apply, "minGain", float, 1.0, low=0),
        startup_timeout=parse_duration(spec.get("startupTimeout", "600s"), "startupTimeout"),
        seed=_number(spec, "seed", int, 0, low=0))


def camel(settings: dict[str, Any]) -> dict[str, Any]:
    """snake_case settings -> spec.engine keys (values as the CRD takes them)."""
    from tuner.space import to_engine_spec
    return to_engine_spec(settings)


def flags_to_engine(flags: list[str]) -> dict[str, Any]:
    """Engine flags (tuner.space.engine_flags) back to spec.engine keys: tuner.confirm
    hands its measure callback flags, a trial service needs spec.engine."""
    by_flag = {flag: name for name, (flag, _, _) in SETTINGS.items()}
    settings: dict[str, Any] = {}
    i = 0
    while i < len(flags):
        flag = flags[i]
        if flag.startswith("--no-") and "--" + flag[5:] in by_flag:
            settings[by_flag["--" + flag[5:]]] = False
        elif SETTINGS.get(by_flag.get(flag, ""), (0, 0, None))[2] is bool:
            settings[by_flag[flag]] = True
        elif flag in by_flag:
            i += 1
            settings[by_flag[flag]] = SETTINGS[by_flag[flag]][2](float(flags[i])) \
                if SETTINGS[by_flag[flag]][2] is int else float(flags[i])
        else:
            raise ValueError(f"not an engine setting flag: {flag!r}")
        i += 1
    return camel(settings)
