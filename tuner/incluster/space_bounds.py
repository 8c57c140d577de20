"""The default search space, bounded by what the target's resources allow.

With spec.searchSpace unset, the Job searches the settings table's ranges; before the study
starts it leaves out the values no trial could start with, or that could not change what a
trial measures, from the target's spec (its memory, engine settings) and the model's size
(tuner/incluster/model_facts.py), with the engine's own pool arithmetic
(engine/kv_capacity.py):

- gpuMemoryUtilization: the low end rises to the smallest fraction whose pool holds one
  maxModelLen sequence next to the weights (the engine refuses to start below it); on a CPU
  target with spec.resources.memory the high end falls to memory / the engine's CPU memory
  (the whole budget is resident: above it, the container is OOM-killed);
- blockSize: sizes no fraction can start with (a maxModelLen sequence rounded up to whole
  blocks) are dropped;
- maxNumSeqs: at most the pool's blocks at the highest fraction and smallest block size
  (each running sequence holds a block at least);
- maxNumBatchedTokens: at most the pool's tokens (each scheduled token takes a KV slot).
  Its low end stays: prefill is always chunked, so the engine needs no step to hold a
  maxModelLen prompt, and its rule (batched tokens >= sequences) is one between the two
  settings, which the caps keep satisfiable (the pool's blocks <= its tokens).

Activations are counted as zero (the engine measures them at start-up), so a value is left
out only when no combination with it can start; a combination the engine then refuses is
an infeasible trial, as before. A GPU target's device memory is not in its spec (Kubernetes
counts GPUs, not their memory): the memory-dependent bounds are then off, and the notes say
so. A space the user gave is searched as given; the notes name its values outside the bounds.
offloadGiB is not capped: the operator adds it to the container's memory (kv_cache.memory).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

from paged_api import settings as engine_settings
from engine.kv_capacity import DTYPE_BYTES, blocks_for, dtype_name, num_kv_blocks
from paged_api.contract import TuningSpec
from paged_api.fields import quantity_value
from paged_api.kv_cache import CPU_RUNTIME_GIB, cpu_device_gib, memory_for_cpu_device
from tuner.incluster.model_facts import ModelFacts, Unknown, model_facts
from paged_api.search_space import Param

GIB = 2**30
FRACTION, BLOCK, SEQS, TOKENS = ("gpu_memory_utilization", "block_size", "max_num_seqs",
                                 "max_num_batched_tokens")
CPU_MEMORY = engine_settings.SETTINGS["cpu_memory_gib"]
DEFAULT_MAX_MODEL_LEN = 2048   # the engine's, for a config without max_position_embeddings


@dataclass(frozen=True)
class TargetMemory:
    """What the target's spec gives its engine."""
    on_cpu: bool
    device_bytes: float | None    # the engine's device memory: on CPU cpu_memory_gib, on
    device_label: str             # a GPU unknown (None); and how to name it to the user
    limit_bytes: float | None     # spec.resources.memory (the container's, without offloadGiB)
    from_limit: bool = False      # device_bytes derived from limit_bytes, as the operator does


def extra_arg(args: list[str], flag: str) -> str | None:
    """The value of `flag` in extraArgs (`--flag V` or `--flag=V`), the last one winning."""
    value = None
    for i, arg in enumerate(args):
        if arg == flag and i + 1 < len(args):
            value = args[i + 1]
        elif arg.startswith(flag + "="):
            value = arg.split("=", 1)[1]
    return value


def target_memory(spec: dict[str, Any]) -> TargetMemory:
    resources = spec.get("resources") or {}
    limit = quantity_value(resources["memory"]) if resources.get("memory") else None
    if int(resources.get("gpus", 1) or 0) > 0:
        return TargetMemory(False, None, "the GPU's memory", limit)
    args = [str(a) for a in (spec.get("engine") or {}).get("extraArgs") or []]
    env = {e.get("name"): e.get("value") for e in spec.get("env") or []}
    given, where = extra_arg(args, CPU_MEMORY.flag), f"spec.engine.extraArgs {CPU_MEMORY.flag}"
    if given is None and env.get(CPU_MEMORY.env):
        given, where = env[CPU_MEMORY.env], f"spec.env {CPU_MEMORY.env}"
    derived = cpu_device_gib(resources.get("memory"))   # what the operator gives the pod
    if given is not None:
        gib = engine_settings.parse_text(CPU_MEMORY, given, where)
    elif derived is not None:
        gib, where = derived, (f"spec.resources.memory less the engine's runtime, "
                               f"{CPU_RUNTIME_GIB:g} GiB; or set spec.env {CPU_MEMORY.env}")
    else:
        gib, where = CPU_MEMORY.default, f"the engine's default; set spec.env {CPU_MEMORY.env}"
    return TargetMemory(True, gib * GIB, f"{gib:g} GiB of CPU memory ({where})", limit,
                        from_limit=given is None and derived is not None)


@dataclass(frozen=True)
class Pool:
    """The model's needs in the target's memory."""
    device_bytes: float
    weight_bytes: float
    kv_bytes_per_token: int
    max_model_len: int

    def min_fraction(self, block_size: int) -> float:
        """The smallest fraction at which one max_model_len sequence fits (activations 0)."""
        need = blocks_for(self.max_model_len, block_size) * block_size
        return (self.weight_bytes + need * self.kv_bytes_per_token) / self.device_bytes

    def blocks(self, fraction: float, block_size: int) -> int:
        return num_kv_blocks(device_bytes=self.device_bytes, fraction=fraction,
                             weight_bytes=self.weight_bytes, activation_bytes=0,
                             block_bytes=block_size * self.kv_bytes_per_token)


class DoesNotFit(ValueError):
    """No fraction of the target's memory holds the weights and one maxModelLen sequence."""


def _gib(n: float) -> str:
    return f"{n / GIB:.3g} GiB"


def _grid_up(value: float, low: float, step: float | None) -> float:
    if step is None:
        return value
    return round(low + math.ceil((value - low) / step - 1e-9) * step, 10)


def _grid_down(value: float, low: float, step: float | None) -> float:
    if step is None:
        return value
    return round(low + math.floor((value - low) / step + 1e-9) * step, 10)


def _values(p: Param | None, fallback: Any) -> list:
    if p is None:
        return [fallback]
    return list(p.choices) if p.choices is not None else [p.low, p.high]


def _clamp(p: Param, low: float | None, high: float | None) -> Param:
    """`p` within [low, high] (None: that end unbounded)."""
    lo = -math.inf if low is None else low
    hi = math.inf if high is None else high
    if p.choices is not None:
        return dataclasses.replace(p, choices=tuple(v for v in p.choices if lo <= v <= hi))
    new_low, new_high = max(p.low, lo), min(p.high, hi)
    if p.type is int:
        new_low, new_high = math.ceil(new_low), math.floor(new_high)
    elif p.step is not None:
        new_low, new_high = _grid_up(new_low, p.low, p.step), _grid_down(new_high, p.low, p.step)
    return dataclasses.replace(p, low=p.type(new_low), high=p.type(new_high))


def _empty(p: Param) -> bool:
    return not p.choices if p.choices is not None else p.low > p.high


def _show(p: Param) -> str:
    if p.choices is not None:
        return ",".join(f"{v:g}" for v in p.choices)
    return f"{p.low:g}..{p.high:g}"


def bound(space: tuple[Param, ...], pool: Pool, *, fraction_cap: float | None,
          defaults: dict[str, Any], why_cap: str) -> tuple[tuple[Param, ...], list[str]]:
    """`space` narrowed to what `pool` allows -> (the space, a note per narrowed setting).
    `fraction_cap`: the highest fraction the container's memory holds (None: 1).
    `defaults`: the target's value of a setting the space does not vary. DoesNotFit when no
    fraction up to the cap holds the weights and one max_model_len sequence."""
    params = {p.name: p for p in space}
    cap = 1.0 if fraction_cap is None else min(1.0, fraction_cap)
    given = params.get(FRACTION)
    capped = _clamp(given, None, cap) if given is not None else None
    if capped is not None and _empty(capped):
        raise DoesNotFit(f"{FRACTION}: no value of {_show(given)} is at most {cap:.3g}"
                         f"{why_cap}")
    top = max(_values(capped, min(defaults[FRACTION], cap)))   # on the fraction's grid
    sizes = [b for b in _values(params.get(BLOCK), defaults[BLOCK])
             if pool.min_fraction(b) <= top]
    if not sizes:
        smallest = min(_values(params.get(BLOCK), defaults[BLOCK]),
                       key=pool.min_fraction)
        need = pool.min_fraction(smallest) * pool.device_bytes
        raise DoesNotFit(
            f"the weights ({_gib(pool.weight_bytes)}) and the KV cache of one maxModelLen "
            f"{pool.max_model_len} sequence ({_gib(need - pool.weight_bytes)}) need "
            f"{_gib(need)}, more than {top:g} x {_gib(pool.device_bytes)}{why_cap}")
    low = min(pool.min_fraction(b) for b in sizes)
    blocks = max(pool.blocks(top, b) for b in sizes)          # at the smallest block size
    tokens = max(pool.blocks(top, b) * b for b in sizes)
    wanted = {FRACTION: (low, cap), SEQS: (None, blocks), TOKENS: (None, tokens)}
    reasons = {
        BLOCK: f"a maxModelLen {pool.max_model_len} sequence in whole blocks must fit "
               f"beside the weights at fraction {top:g}",
        FRACTION: f"the weights ({_gib(pool.weight_bytes)}) and one maxModelLen "
                  f"{pool.max_model_len} sequence need {_gib(low * pool.device_bytes)}"
                  f"{why_cap}",
        SEQS: f"the pool holds {blocks} blocks at fraction {top:g}, and a running sequence "
              "takes one at least",
        TOKENS: f"the pool holds {tokens} tokens at fraction {top:g}, and a scheduled token "
                "takes a KV slot"}
    out, notes = [], []
    for p in space:
        new = p
        if p.name == BLOCK:
            new = dataclasses.replace(p, choices=tuple(b for b in p.choices if b in sizes)) \
                if p.choices is not None else p
        elif p.name in wanted:
            new = _clamp(p, *wanted[p.name])
            if p.choices is None and new.low > new.high and p.name in (SEQS, TOKENS):
                new = dataclasses.replace(new, low=new.high)   # the cap below the table's low
        if _empty(new) and p.name == FRACTION:   # no trial could start
            raise DoesNotFit(f"{p.name}: no value of {_show(p)} is left: {reasons[p.name]}")
        if new != p:   # (a given space's choices all above a cap: none, in the note)
            notes.append(f"{p.name} {_show(p)} -> {_show(new) or 'none'}: {reasons[p.name]}")
        out.append(new)
    return tuple(out), notes


def render(space: tuple[Param, ...]) -> dict[str, Any]:
    """The space in spec.searchSpace's grammar (status.searchSpace: copy it into a spec)."""
    from paged_api.contract import SEARCH_KEYS

    key_of = {name: key for key, name in SEARCH_KEYS.items()}
    out: dict[str, Any] = {}
    for p in space:
        if p.choices is not None:
            out[key_of[p.name]] = list(p.choices)
        else:
            out[key_of[p.name]] = {"min": p.low, "max": p.high,
                                   **({"step": p.step} if p.step is not None else {}),
                                   **({"log": True} if p.log else {})}
    return out


def bounded_space(space: tuple[Param, ...], *, given: bool, target: str,
                  target_spec: dict[str, Any], facts: ModelFacts | Unknown
                  ) -> tuple[tuple[Param, ...], list[str]]:
    """The Job's space for `target` -> (the space searched, notes for status and the log).
    `given`: spec.searchSpace was set (searched as given; the notes name what the target
    cannot start). ValueError naming what to change when the model fits at no fraction."""
    if isinstance(facts, Unknown):
        return space, [f"the settings table's ranges, not bounded: {facts.why}"]
    memory = target_memory(target_spec)
    if memory.device_bytes is None:
        gpus = (target_spec.get("resources") or {}).get("gpus", 1)
        return space, [f"the settings table's ranges, not bounded: {target} runs on "
                       f"{gpus} GPU(s), whose memory its spec does not say"]
    engine = target_spec.get("engine") or {}
    args = [str(a) for a in engine.get("extraArgs") or []]
    dtype = DTYPE_BYTES[dtype_name(extra_arg(args, "--dtype") or "auto", facts.config_dtype, "cpu")]
    pool = Pool(memory.device_bytes, facts.parameters * dtype,
                facts.kv_shape.bytes_per_token(dtype),
                int(engine.get("maxModelLen") or facts.max_position_embeddings
                    or DEFAULT_MAX_MODEL_LEN))
    cap = memory.limit_bytes / memory.device_bytes if memory.limit_bytes else None
    limit = (f"; spec.resources.memory {_gib(memory.limit_bytes)} holds {cap:.3g} of it"
             if cap is not None else "")
    defaults = {FRACTION: float(engine.get("gpuMemoryUtilization") or 0.9),
                BLOCK: int(engine.get("blockSize") or 16)}
    try:
        bounded, narrowed = bound(space, pool, fraction_cap=cap, defaults=defaults,
                                  why_cap=f" of {memory.device_label}{limit}")
    except DoesNotFit as exc:
        params = {p.name: p for p in space}
        need = min(pool.min_fraction(b) for b in _values(params.get(BLOCK), defaults[BLOCK])
                   ) * pool.device_bytes
        top = max(_values(params.get(FRACTION), defaults[FRACTION]))
        if need > top * pool.device_bytes and memory.from_limit:
            fix = (f"raise spec.resources.memory above "
                   f"{memory_for_cpu_device(need / top / GIB):.3g} GiB")
        elif need > top * pool.device_bytes:
            fix = (f"raise the engine's CPU memory (spec.env {CPU_MEMORY.env}) above "
                   f"{_gib(need / top)}" + (" and spec.resources.memory with it" if cap else ""))
        elif memory.limit_bytes and need > memory.limit_bytes:
            fix = f"raise spec.resources.memory above {_gib(need)}"
        else:   # the fractions searched, of the engine's CPU memory, pass the limit
            fix = (f"set spec.env {CPU_MEMORY.env} to at most spec.resources.memory "
                   f"({_gib(memory.limit_bytes or 0)}), or raise spec.resources.memory")
        raise ValueError(f"spec.targetRef: {target} cannot hold {facts.source} at any "
                         f"gpuMemoryUtilization searched: {exc}. On {target}: {fix}, or "
                         "lower spec.engine.maxModelLen") from None
    facts_note = (f"{facts.source}: {facts.parameters} parameters ({_gib(pool.weight_bytes)}"
                  f"), {pool.kv_bytes_per_token} KV bytes per token, maxModelLen "
                  f"{pool.max_model_len}, in {memory.device_label}{limit}")
    if given:
        return space, [facts_note] + [f"spec.searchSpace is searched as given, but outside "
                                      f"what {target} can start: {n}" for n in narrowed]
    return bounded, [facts_note] + (narrowed or ["the settings table's ranges fit"])


def job_space(tuning: TuningSpec, spec: dict[str, Any], target: dict[str, Any]
              ) -> tuple[TuningSpec, dict[str, Any]]:
    """The tuning with the space the Job searches, and status.searchSpace (that space, in
    spec.searchSpace's grammar) with status.searchSpaceNotes (how it was bounded, or why not)."""
    target_spec = target.get("spec") or {}
    space, notes = bounded_space(
        tuning.space, given=spec.get("searchSpace") is not None, target=tuning.target,
        target_spec=target_spec, facts=model_facts((target_spec.get("model") or {}).get("uri")))
    return (dataclasses.replace(tuning, space=space),
            {"searchSpace": render(space), "searchSpaceNotes": notes})
