"""The speculative_config row of the settings table (api/paged_api/settings.py) and how a checked
object is completed: each method's keys only, with vLLM's defaults. Torch-free."""
from __future__ import annotations

from collections.abc import Callable
from typing import Any

from paged_api.settings_types import AtMost, OnlyWhen, Setting

SPECULATIVE = Setting(
    "speculative_config", dict, None, "Speculative decoding, as vLLM's JSON: "
    '{"method": "ngram", "num_speculative_tokens": K, "prompt_lookup_max": N, '
    '"prompt_lookup_min": M} or {"method": "suffix", "num_speculative_tokens": K, '
    '"suffix_decoding_max_tree_depth": 24, ...} (default: off)', flag="--speculative-config",
    field="speculative", optional=True, managed=True, keys=(
        Setting("method", str, "ngram", "how drafts are proposed: ngram (prompt "
                "lookup in the request's own tokens) or suffix (suffix trees over "
                "the request's tokens and the outputs of past requests of the same "
                "cache_salt)", field="method", choices=("ngram", "suffix")),
        Setting("num_speculative_tokens", int, None, "draft tokens verified per "
                "step and sequence (suffix: the most)", field="numSpeculativeTokens",
                minimum=1, maximum=16, tune="0,2,4,8,suffix:8,suffix:16", tune_off=0),
        Setting("prompt_lookup_max", int, None, "longest n-gram matched (default: "
                "prompt_lookup_min, or 5)", field="promptLookupMax", optional=True,
                minimum=1, maximum=64),
        Setting("prompt_lookup_min", int, None, "shortest n-gram matched (default: "
                "prompt_lookup_max, or 5)", field="promptLookupMin", optional=True,
                minimum=1, maximum=64),
        Setting("disable_by_batch_size", int, None, "no drafts in a step while this "
                "many sequences or more are running (default: no limit)",
                field="disableByBatchSize", optional=True, minimum=1),
        Setting("min_acceptance_rate", float, None, "a sequence whose drafts' "
                "acceptance (moving average) falls below this stops drafting, and "
                "probes again now and then (default: off)", field="minAcceptanceRate",
                optional=True, minimum=0, maximum=1),
        Setting("acceptance_probe_interval", int, None, "with min_acceptance_rate: "
                "decode steps without drafts before a held-back sequence tries "
                "again (default: 16)", field="acceptanceProbeInterval", optional=True,
                minimum=1, maximum=4096),
        Setting("adaptive_draft_knee", int, None, "adaptive draft length: tokens per "
                "step at which a step costs twice a one-token step; each sequence then "
                "drafts the length that maximises its expected tokens per unit of step "
                "cost from its measured acceptance and the batch size, shorter as either "
                "worsens, none when drafting costs more than it saves (default: off)",
                field="adaptiveDraftKnee", optional=True, minimum=1, maximum=1_000_000),
        # method suffix (vLLM's keys; their defaults fill in for suffix only)
        Setting("suffix_decoding_max_tree_depth", int, None, "suffix: longest match "
                "plus draft, in tokens (default: 24)",
                field="suffixDecodingMaxTreeDepth", optional=True, minimum=1,
                maximum=1024),
        Setting("suffix_decoding_max_cached_requests", int, None, "suffix: finished "
                "requests whose outputs the global trees keep, the oldest forgotten "
                "first (0: the request's own tokens only; default: 10000)",
                field="suffixDecodingMaxCachedRequests", optional=True, minimum=0,
                maximum=1_000_000),
        Setting("suffix_decoding_max_spec_factor", float, None, "suffix: a match of "
                "m tokens drafts at most this times m (default: 1.0)",
                field="suffixDecodingMaxSpecFactor", optional=True, minimum=0,
                maximum=64),
        Setting("suffix_decoding_min_token_prob", float, None, "suffix: a draft "
                "stops before its estimated probability falls below this (default: "
                "0.1)", field="suffixDecodingMinTokenProb", optional=True, minimum=0,
                maximum=1),
    ), key_rules=(AtMost("prompt_lookup_min", "prompt_lookup_max"),
                  OnlyWhen(("prompt_lookup_min", "prompt_lookup_max"), "method", "ngram"),
                  OnlyWhen(("suffix_decoding_max_tree_depth",
                            "suffix_decoding_max_cached_requests",
                            "suffix_decoding_max_spec_factor",
                            "suffix_decoding_min_token_prob"), "method", "suffix")))


_SPEC_GATE_KEYS = ("disable_by_batch_size", "min_acceptance_rate", "acceptance_probe_interval",
                   "adaptive_draft_knee")


SUFFIX_DEFAULTS = {"suffix_decoding_max_tree_depth": 24,
                   "suffix_decoding_max_cached_requests": 10_000,
                   "suffix_decoding_max_spec_factor": 1.0, "suffix_decoding_min_token_prob": 0.1}
_NGRAM_KEYS = ("prompt_lookup_min", "prompt_lookup_max")


def normalize_speculative(config: dict[str, Any], label: Callable[[str], str]
                          ) -> dict[str, Any]:
    """Each method's keys only, with vLLM's defaults: n-gram's unset bound takes the other's
    value, both unset 5; suffix's from SUFFIX_DEFAULTS (a key of the other method was refused
    by the OnlyWhen rules before). The off-switches' keys (engine/spec_decode/gate.py)
    appear only when set. `label(key)`: how errors name a key."""
    suffix = config["method"] == "suffix"
    out = {k: v for k, v in config.items() if k not in _SPEC_GATE_KEYS or v is not None}
    if suffix:
        out = {k: v for k, v in out.items() if k not in _NGRAM_KEYS}
        return {**out, **{k: SUFFIX_DEFAULTS[k] if out[k] is None else out[k]
                          for k in SUFFIX_DEFAULTS}}
    out = {k: v for k, v in out.items() if k not in SUFFIX_DEFAULTS}
    lo, hi = config["prompt_lookup_min"], config["prompt_lookup_max"]
    if lo is None and hi is None:
        lo = hi = 5
    return {**out, "prompt_lookup_min": hi if lo is None else lo,
            "prompt_lookup_max": lo if hi is None else hi}


# The tuner's dimension num_speculative_tokens (api/paged_api/search_space.py) holds the method and
# its length as one value: 0 or "off" (no speculation), K or "ngram:K" (n-gram, K tokens),
# "suffix:K" (suffix decoding, at most K). Canonical forms: 0, K (an int) and "suffix:K",
# so an n-gram value reads as it did before suffix decoding (stored studies, baselines).
DRAFT_DIMENSION = "num_speculative_tokens"
DRAFT_METHODS = ("ngram", "suffix")
_METHOD_KEYS = {"ngram": _NGRAM_KEYS, "suffix": tuple(SUFFIX_DEFAULTS)}


def draft_choice(given: Any) -> int | str:
    """A dimension value as written (0, "off", 4, "ngram:4", "suffix:8") -> its canonical
    form; ValueError naming the forms."""
    text = str(given).strip().lower()
    method, sep, count = text.rpartition(":")
    try:
        if isinstance(given, bool) or (sep and method not in DRAFT_METHODS):
            raise ValueError
        k = 0 if text == "off" else float(count)
        if k != int(k):
            raise ValueError
    except ValueError:
        raise ValueError(f"{DRAFT_DIMENSION}: expected off, K, ngram:K or suffix:K (a method "
                         f"of {', '.join(DRAFT_METHODS)} and its draft length), got "
                         f"{given!r}") from None
    return f"suffix:{int(k)}" if method == "suffix" and k else int(k)


def draft_split(value: int | str) -> tuple[str, int]:
    """A canonical dimension value -> (method, num_speculative_tokens)."""
    if isinstance(value, str):
        method, _, count = value.partition(":")
        return method, int(count)
    return "ngram", int(value)


def other_method_keys(value: int | str) -> tuple[str, ...]:
    """The keys of the method the value does not choose (a merge patch removes them)."""
    method, _ = draft_split(value)
    return tuple(k for m, keys in _METHOD_KEYS.items() if m != method for k in keys)


def with_draft(config: dict[str, Any], value: int | str) -> dict[str, Any]:
    """speculative_config `config` (keys by name) set to the value's method and length; the
    other method's keys dropped."""
    method, k = draft_split(value)
    drop = other_method_keys(value)
    return {**{n: v for n, v in config.items() if n not in drop},
            "method": method, DRAFT_DIMENSION: k}


def draft_of(config: dict[str, Any] | None) -> int | str:
    """The dimension's value of a checked speculative_config (None, off: 0)."""
    if config is None:
        return 0
    k = config[DRAFT_DIMENSION]
    return f"suffix:{k}" if config.get("method") == "suffix" else k
