"""The engine's settings table: the one source for every place that names a setting.

From `TABLE` derive: `EngineConfig`'s checks (engine/config.py), the `python -m engine serve`
flags (engine/entrypoints/cli.py), the operator's spec.engine parsing and flag mapping and
the CRD's spec.engine schema (api/paged_api/settings_k8s.py; scripts/gen_crd_engine.py writes the
schema into the chart) and the tuner's search space (api/paged_api/search_space.py). Like vLLM's
`EngineArgs`, but extended to the CRD and the tuner. docs/INTERFACES.md: how to add one.

Torch-free on purpose: the operator image ships engine/__init__.py, this, its row types and
speculative row (settings_types.py, settings_speculative.py) and settings_k8s.py.
Errors have one format wherever a value comes from: `<name> must be <rule>, got <value>`,
where <name> is how that source spells the setting (block_size, --block-size,
spec.engine.blockSize, PAGED_CPU_THREADS); argparse writes `argument --block-size: must ...`.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Callable, Mapping
from typing import Any

from paged_api.settings_speculative import SPECULATIVE, normalize_speculative
from paged_api.settings_types import AtLeast, AtMost, OnlyWhen, Setting, show

__all__ = ["AtLeast", "AtMost", "OnlyWhen", "Setting", "show", "TABLE", "SETTINGS",
           "IN_SPEC", "SPEC_SETTINGS", "RULES", "TOGETHER", "check", "parse_text", "check_rules", "env_value",
           "env_default", "flags_for"]


TABLE: tuple[Setting, ...] = (
    Setting("model", str, None, "local Hugging Face checkpoint directory, or builtin://NAME "
            "(None: the embedded tiny model)", flag="--model", optional=True, managed=True),
    Setting("served_model_name", str, None, "model id in the API and in metrics labels "
            "(default: directory name, or a built-in model's name)",
            flag="--served-model-name", optional=True, managed=True),
    Setting("block_size", int, 16, "Tokens per KV-cache block", flag="--block-size",
            field="blockSize", minimum=1, maximum=256, power_of_two=True, managed=True,
            crd_default=True, tune="pow2:8..128"),
    Setting("gpu_memory_utilization", float, 0.9, "Fraction of accelerator memory for "
            "weights + KV cache; on CPU, a fraction of cpu_memory_gib",
            flag="--gpu-memory-utilization", field="gpuMemoryUtilization", minimum=0,
            exclusive_minimum=True, maximum=1, managed=True, crd_default=True,
            tune="0.5..0.95:step=0.05"),
    Setting("max_num_seqs", int, 256, "Most sequences running in one step",
            flag="--max-num-seqs", field="maxNumSeqs", minimum=1, managed=True,
            tune="1..64:log"),
    Setting("max_num_batched_tokens", int, 2048, "Most tokens scheduled in one step",
            flag="--max-num-batched-tokens", field="maxNumBatchedTokens", minimum=1,
            managed=True, tune="256..8192:log"),
    Setting("max_model_len", int, None, "Longest prompt + output in tokens (default: the "
            "model's max_position_embeddings)", flag="--max-model-len", field="maxModelLen",
            optional=True, minimum=2, managed=True),
    Setting("enable_prefix_caching", bool, True, "Reuse the KV blocks of shared prefixes",
            flag="--enable-prefix-caching", field="enablePrefixCaching", managed=True,
            crd_default=True),
    Setting("num_gpu_blocks_override", int, None, "Allocate this many KV blocks instead of "
            "sizing the cache from memory", flag="--num-gpu-blocks-override", optional=True,
            minimum=1),
    Setting("seed", int, 0, "Seed of the engine's random state", flag="--seed"),
    Setting("dtype", str, "auto", "Weights and activations dtype", flag="--dtype",
            choices=("auto", "float32", "float16", "bfloat16", "half", "float")),
    Setting("scheduling_policy", str, "fcfs", "priority: requests' `priority` field orders "
            "the queue (lower first)", flag="--scheduling-policy", choices=("fcfs", "priority")),
    Setting("device", str, "auto", "auto (CUDA when available), cpu or cuda[:N]"),
    Setting("cpu_memory_gib", float, 2.0, "CPU 'device memory' in GiB", flag="--cpu-memory-gib",
            minimum=0, exclusive_minimum=True, env="PAGED_CPU_MEMORY_GIB"),
    Setting("cpu_threads", int, None, "On CPU, torch intra-op threads (default: one per "
            "core); fewer when other busy processes share the cores", flag="--cpu-threads",
            optional=True, minimum=1, env="PAGED_CPU_THREADS"),
    Setting("attention_backend", str, None, "torch or triton (default: by device, or "
            "$PAGED_ATTENTION_BACKEND)", optional=True, choices=("torch", "triton")),
    Setting("disable_log_stats", bool, True, "Do not log engine statistics"),
    SPECULATIVE,
    Setting("kv_events_config", dict, None, "Publish KV cache events (blocks stored in and "
            "removed from the prefix cache), as vLLM's JSON: {\"enable_kv_cache_events\": "
            'true, "publisher": "zmq", "endpoint": "tcp://*:5557", "replay_endpoint": '
            '"tcp://*:5558", "topic": "kv-events"} (default: off; engine/kv_events.py)',
            flag="--kv-events-config", optional=True, managed=True, keys=(
                Setting("enable_kv_cache_events", bool, False, "publish the events"),
                Setting("publisher", str, "zmq", "zmq, or null for none",
                        choices=("zmq", "null")),
                Setting("endpoint", str, "tcp://*:5557", "ZeroMQ PUB address (a * host or "
                        "port binds, as in vLLM; tcp://HOST:*: a free port)"),
                Setting("replay_endpoint", str, None, "ZeroMQ ROUTER address answering "
                        "replay and snapshot requests (default: none)", optional=True),
                Setting("buffer_steps", int, 10_000, "batches kept for replay", minimum=1),
                Setting("hwm", int, 100_000, "the PUB socket's high-water mark", minimum=0),
                Setting("max_queue_size", int, 100_000, "batches waiting for the publisher "
                        "thread before new ones are dropped", minimum=1),
                Setting("topic", str, "", "ZeroMQ topic of every message"),
            )),
    # KV tiers under the device pool (engine/kv_offload/), vLLM's flag names
    Setting("kv_offloading_size", float, None, "GiB of host memory for a KV tier under the "
            "device pool: blocks the pool evicts are kept there and loaded back instead of "
            "recomputed (default: off)", flag="--kv-offloading-size", optional=True, minimum=0,
            managed=True,  # the operator sets the tiers' flags from spec.kvCache
            section="kvCache", field="offloadGiB",
            tune="0,0.5,1,2,4", tune_off=0),  # only for workloads that revisit prefixes
    Setting("kv_offloading_backend", str, "native", "how the host tier moves blocks (only "
            "native: the engine's own copies)", flag="--kv-offloading-backend",
            choices=("native",)),
    Setting("kv_offloading_eviction_policy", str, "lru", "which host-tier blocks make room "
            "for new ones: lru (least recently used) or arc (adaptive replacement: blocks "
            "used once go first, so a stream of one-off prompts does not flush the prefixes "
            "that recur; vLLM's eviction_policy)", flag="--kv-offloading-eviction-policy",
            choices=("lru", "arc")),
    Setting("kv_disk_dir", str, None, "directory of a disk KV tier under the host tier, "
            "shareable by engines on one node (needs kv_disk_size)", flag="--kv-disk-dir",
            optional=True, managed=True),
    Setting("kv_disk_size", float, None, "GiB the disk tier's directory may hold, with every "
            "engine writing to it (needs kv_disk_dir)", flag="--kv-disk-size", optional=True,
            minimum=0, managed=True),
)
SETTINGS: dict[str, Setting] = {s.name: s for s in TABLE}
# The settings a PagedInferenceService spec holds, each at spec.<section>.<field> (the tuner
# may vary them): IN_SPEC all of them, SPEC_SETTINGS spec.engine's.
IN_SPEC: tuple[Setting, ...] = tuple(s for s in TABLE if s.field)
SPEC_SETTINGS: tuple[Setting, ...] = tuple(s for s in IN_SPEC if s.section == "engine")
RULES: tuple[AtLeast, ...] = (
    AtLeast("max_num_batched_tokens", "max_num_seqs",
            "every running sequence needs at least one token per step"),
)
# Settings that are given together or not at all.
TOGETHER: tuple[tuple[str, str], ...] = (("kv_disk_dir", "kv_disk_size"),)

def check(setting: Setting | str, value: Any, label: str | None = None, *,
          by_field: bool = False) -> Any:
    """`value` if valid for the setting (an int given for a float becomes a float), else
    ValueError `<label> must be <rule>, got <value>` (label defaults to the setting's name).
    A dict setting's keys are read and named by their `field` (camelCase) when `by_field`;
    the result is keyed by name either way."""
    s = SETTINGS[setting] if isinstance(setting, str) else setting
    if value is None and s.optional:
        return None
    bad = ValueError(f"{s.name if label is None else label} must be {s.rule}, got {value!r}")
    if isinstance(value, bool) and s.type is not bool:
        raise bad
    if s.type is dict:
        return _check_object(s, value, s.name if label is None else label, bad, by_field)
    if s.type is float and isinstance(value, int):
        value = float(value)
    if s.type is str and isinstance(value, os.PathLike):
        value = os.fspath(value)  # a model directory given as a Path
    if not isinstance(value, s.type) or (s.type is float and not math.isfinite(value)):
        raise bad
    if s.choices is not None and value not in s.choices:
        raise bad
    if s.minimum is not None and (value <= s.minimum if s.exclusive_minimum
                                  else value < s.minimum):
        raise bad
    if s.maximum is not None and value > s.maximum:
        raise bad
    if s.power_of_two and value & (value - 1):
        raise bad
    return value


def _check_object(s: Setting, value: Any, label: str, bad: ValueError, by_field: bool
                  ) -> dict[str, Any]:
    """A dict setting: known keys only, each checked (`<label>.<key> must be ...`), required
    ones (no default, not optional) present, defaults filled in, then its key rules."""
    if not isinstance(value, Mapping):
        raise bad
    key_of = {k.name: k.field if by_field else k.name for k in s.keys}
    unknown = sorted(set(value) - set(key_of.values()), key=str)
    prefix = f"{label}." if label else ""  # argparse's label is "" (it names the flag)
    if unknown:
        raise ValueError(f"{label or 'the object'} has no key {unknown[0]!r}; known: "
                         f"{', '.join(key_of.values())}")
    out: dict[str, Any] = {}
    for key in s.keys:
        raw = value.get(key_of[key.name])
        if raw is None and key.default is None and not key.optional:
            raise ValueError(f"{prefix}{key_of[key.name]} is required: {key.rule}")
        out[key.name] = check(key, key.default if raw is None else raw,
                              prefix + key_of[key.name])
    for rule in s.key_rules:
        given = [k for k in getattr(rule, "keys", ()) if out[k] is not None]
        if given and out[rule.key] != rule.value:
            raise ValueError(f"{prefix}{key_of[given[0]]} applies to {key_of[rule.key]} "
                             f"{rule.value} only, not {out[rule.key]}")
    normalize = _NORMALIZE.get(s.name)
    out = normalize(out, lambda key: prefix + key_of[key]) if normalize else out
    for rule in (r for r in s.key_rules if isinstance(r, AtMost)):
        if out.get(rule.name) is not None and out.get(rule.other) is not None \
                and out[rule.name] > out[rule.other]:
            raise ValueError(f"{prefix}{key_of[rule.name]} ({out[rule.name]}) must be <= "
                             f"{prefix}{key_of[rule.other]} ({out[rule.other]})")
    return out


# a dict setting's completion: (checked keys, key -> its label in errors) -> the value
_NORMALIZE: dict[str, Callable[[dict[str, Any], Callable[[str], str]], dict[str, Any]]] = {
    "speculative_config": normalize_speculative}


def parse_text(setting: Setting | str, text: str, label: str | None = None) -> Any:
    """A command-line or environment string -> a checked value (same errors as check)."""
    s = SETTINGS[setting] if isinstance(setting, str) else setting
    value: Any = text
    try:
        if s.type is int:
            value = int(text)
        elif s.type is float:
            value = float(text)
        elif s.type is bool:
            value = {"true": True, "1": True, "false": False, "0": False}[text.lower()]
        elif s.type is dict:
            value = json.loads(text)
    except (ValueError, KeyError):
        name = s.name if label is None else label
        raise ValueError(f"{name} must be {s.rule}, got {text!r}") from None
    return check(s, value, label)


def check_rules(values: Mapping[str, Any], label: Callable[[Setting], str] | None = None,
                ) -> None:
    """The cross-setting rules on `values` (by name); missing or None: the default."""
    name_of = label or (lambda s: s.name)
    for rule in RULES:
        a, b = SETTINGS[rule.name], SETTINGS[rule.other]
        va, vb = (values.get(s.name) if values.get(s.name) is not None else s.default
                  for s in (a, b))
        if va < vb:
            raise ValueError(f"{name_of(a)} ({va}) must be >= {name_of(b)} ({vb}): {rule.why}")
    for one, other in TOGETHER:
        a, b = SETTINGS[one], SETTINGS[other]
        if (values.get(one) is None) != (values.get(other) is None):
            given, missing = (a, b) if values.get(one) is not None else (b, a)
            raise ValueError(f"{name_of(given)} needs {name_of(missing)}: set both or neither")


def env_value(setting: Setting | str) -> Any:
    """The setting's environment variable, checked; None when unset or empty."""
    s = SETTINGS[setting] if isinstance(setting, str) else setting
    raw = os.environ.get(s.env) if s.env else None
    return None if raw is None or raw == "" else parse_text(s, raw, s.env)


def env_default(name: str) -> Any:
    """The default EngineConfig uses: the environment's value, else the table's."""
    value = env_value(name)
    return SETTINGS[name].default if value is None else value


# --- command line (the parser's flags: engine/entrypoints/cli.py) -------------------------

def flags_for(values: Mapping[str, Any]) -> list[str]:
    """Engine flags for settings by name (None: left out, the engine's default applies)."""
    out: list[str] = []
    for name, value in values.items():
        s = SETTINGS[name]
        if value is None:
            continue
        if s.flag is None:
            raise ValueError(f"{name} has no command-line flag")
        if s.type is bool:
            out.append(s.flag if value else s.flag.replace("--", "--no-", 1))
        elif s.type is dict:
            out += [s.flag, json.dumps(value, separators=(",", ":"))]
        else:
            out += [s.flag, repr(float(value)) if s.type is float else str(value)]
    return out

