"""Which step-time profile a capacity sweep simulates with: the calibration, or the refit
from the pilot's served steps (tuner/sim/live_profile.py), whichever predicts the pilot's
real capacity better."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from tuner.sim.live_profile import live_profile


def live_refit(plan, series: list, *, real: float, calibrated: float | None,
               predict: Callable[[object], float | None]) -> None:
    """The simulator's profile (plan: a CapacityPlan) refitted from the pilot's steps when
    they are enough (else the calibration stays, and the log says why), and kept only if it
    predicts the pilot's real capacity `real` at least as well as the calibration did
    (`calibrated`; `predict(sim)`: the baseline's simulated capacity on that SimContext): a
    step-time fit can be close on the steps it saw and still miss the capacity
    (docs/benchmarks/tuning.md: the live refit was 27-38 % off where the calibration was
    14-18 %). Without a real capacity the refit is kept."""
    try:
        profile = live_profile(plan.sim.profile, series)
    except ValueError as exc:
        plan.log(f"profile: the calibration stays ({exc})")
        return
    plan.log(f"profile: refitted from the pilot's {profile.num_steps} served steps, form "
             f"{profile.fit.form}, held-out error {profile.fit.heldout_error:.1%} "
             f"(calibration: {plan.sim.profile.fit.form}, "
             f"{plan.sim.profile.fit.heldout_error:.1%})")
    refit = dataclasses.replace(plan.sim, profile=profile)
    if real > 0 and calibrated:
        live = predict(refit)
        errors = {"calibration": abs(calibrated - real) / real,
                  "live": abs(live - real) / real if live else math.inf}
        plan.profile_check = {"pilot": real, "calibration": calibrated, "live": live,
                              "errors": errors}
        keep = errors["live"] <= errors["calibration"]
        plan.log(f"profile: the pilot's real capacity {real:.2f} req/s, simulated "
                 f"{calibrated:.2f} by the calibration ({errors['calibration']:.0%} off) and "
                 f"{live or 0:.2f} by the refit ({errors['live']:.0%} off): the "
                 f"{'refit' if keep else 'calibration'} is kept")
        if not keep:
            return
    plan.sim = refit
    plan.live = True


def pool_blocks(url: str, *, timeout: float = 10.0) -> int | None:
    """num_gpu_blocks of vllm:cache_config_info on an engine's /metrics (None: absent)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as resp:
        text = resp.read().decode()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info" and \
                    str(sample.labels.get("num_gpu_blocks", "")).isdigit():
                return int(sample.labels["num_gpu_blocks"])
    return None


def fit_pool(plan, blocks: int, settings: dict) -> None:
    """The simulator's memory made to give the pilot's pool: `blocks` KV blocks with the
    baseline's `settings` (the simulated engine's full settings). A profile from
    config.json (tuner/sim/calibrate.config_profile) knows the KV bytes per token but not
    the weights or activations; what the pilot's pool leaves of its budget is counted as
    weights, so other fractions and block sizes scale from the measured point. On a CPU
    the budget is cpu_memory_gib; on a GPU, whose memory is not in the spec, the device's
    bytes are what makes the pool fit with those weights (`memory.weight_bytes`). A CPU
    engine's settings name its cpu_memory_gib (the Job's simulator_base)."""
    from engine.config import EngineConfig

    memory = plan.sim.profile.memory
    default = EngineConfig()
    full = {"block_size": default.block_size, "cpu_memory_gib": default.cpu_memory_gib,
            "gpu_memory_utilization": default.gpu_memory_utilization, **settings}
    block, fraction = int(full["block_size"]), float(full["gpu_memory_utilization"])
    pool = blocks * block * memory.kv_bytes_per_token
    if "cpu_memory_gib" not in settings:
        device = (memory.weight_bytes + pool) / fraction
        fitted = dataclasses.replace(memory, device_bytes=device, activation_base=0.0,
                                     activation_per_token=0.0)
    else:
        budget = fraction * float(full["cpu_memory_gib"]) * 2**30
        fitted = dataclasses.replace(memory, weight_bytes=budget - pool, activation_base=0.0,
                                     activation_per_token=0.0)
    plan.sim = dataclasses.replace(plan.sim, profile=dataclasses.replace(
        plan.sim.profile, memory=fitted))
    plan.log(f"profile: the pilot's pool, {blocks} blocks of {block} tokens, sizes the "
             "simulated engines' pools")
