"""Which step-time profile a capacity sweep simulates with: the calibration with the serving
term of the pilot's served steps, or (without one) the refit from those steps
(tuner/sim/live_profile.py) where it predicts the pilot's real capacity better; its KV
pool sized from the pilot's; its step times scaled so that
the baseline's simulated capacity is the pilot's real one (anchor_time)."""
from __future__ import annotations

import dataclasses
import math
from typing import Callable

from tuner.sim.live_profile import live_profile, serving_term


def live_refit(plan, series: list, *, real: float, calibrated: bool,
               predict: Callable[[object], float | None]) -> None:
    """The simulator's profile (plan: a CapacityPlan) from the pilot's served steps. A
    calibration (`calibrated`: plan.sim's profile was timed) gets their serving term (what
    the server adds per delivered row, which the in-process calibration never timed:
    serving_term) and is kept with it: on every workload whose fidelity was measured
    (docs/benchmarks/tuning.md, 12 settings against real runs) it ranked the settings at
    least as well as a refit of the same steps: Kendall tau 0.94 against 0.82 on chat,
    0.70 and 0.53 against 0.47 and 0.53 on agentic, 0.64 against 0.09 on summarize; the
    level, which the refit often has closer, is the anchor's to set (anchor_time). The
    refit is still simulated, for the record (plan.profile_check: both against the pilot's
    real capacity `real`; `predict(sim)`: the baseline's simulated capacity on that
    SimContext). Without a serving term (too few busy windows, or the baseline does not
    simulate with it) the refit is kept if it predicts the pilot's real capacity at least
    as well as the calibration (a step-time fit can be close on the steps it saw and still
    miss the capacity: the live refit was 27-38 % off where the calibration was 14-18 %);
    without a calibration, or without a real capacity, the refit is kept when the steps
    are enough to fit one (else the profile stays, and the log says why)."""
    figure = with_serving_term(plan, series, predict) if calibrated else None
    served = figure is not None
    try:
        profile = live_profile(plan.sim.profile, series)
    except ValueError as exc:
        plan.log(f"profile: the {'calibration' if calibrated else 'profile'} stays ({exc})")
        return
    plan.log(f"profile: refitted from the pilot's {profile.num_steps} served steps, form "
             f"{profile.fit.form}, held-out error {profile.fit.heldout_error:.1%} "
             f"(calibration: {plan.sim.profile.fit.form}, "
             f"{plan.sim.profile.fit.heldout_error:.1%})")
    refit = dataclasses.replace(plan.sim, profile=profile)
    if calibrated and (served or real > 0):
        figure = figure or predict(plan.sim)
        live = predict(refit)
        errors = {"calibration": abs(figure - real) / real if figure and real > 0
                  else math.inf,
                  "live": abs(live - real) / real if live and real > 0 else math.inf}
        plan.profile_check = {"pilot": real, "calibration": figure, "live": live,
                              "errors": errors, "serving_term": served}
        keep = not served and errors["live"] <= errors["calibration"]
        why = ("the calibration with its serving term is kept (it ranks settings better; "
               "the anchor sets its level)" if served else
               f"the {'refit' if keep else 'calibration'} is kept")
        plan.log(f"profile: the pilot's real capacity {real:.2f} req/s, simulated "
                 f"{figure or 0:.2f} by the calibration ({errors['calibration']:.0%} off) and "
                 f"{live or 0:.2f} by the refit ({errors['live']:.0%} off): {why}")
        if not keep:
            return
    plan.sim = refit
    plan.live = True


def with_serving_term(plan, series: list, predict: Callable[[object], float | None]
                      ) -> float | None:
    """plan.sim's (calibrated) profile with the serving term of the pilot's served steps
    (tuner/sim/live_profile.serving_term; plan.serving records it); -> the baseline's
    simulated capacity on it (None: too few busy windows, or the baseline does not simulate
    with it; the profile then unchanged). On the
    embedded model's 12 chat settings (docs/benchmarks/tuning.md, 2026-12-05) it put their
    level at 1.00x the real capacities where the calibration alone said 1.35x, and after
    one common factor (the anchor's) their median error at 4.4 % where the calibration's
    was 8.8 %; the ranking stayed (Kendall tau 0.76 both; real runs of the same settings
    agree with each other at 0.76-0.88)."""
    try:
        profile, info = serving_term(plan.sim.profile, series)
    except ValueError as exc:
        plan.log(f"profile: no serving term ({exc})")
        return None
    served = dataclasses.replace(plan.sim, profile=profile)
    capacity = predict(served)
    term = (f"{info['seconds_per_step'] * 1000:.3f} ms per served step + "
            f"{info['seconds_per_row'] * 1000:.3f} ms per served row + "
            f"{info['seconds_per_row_squared'] * 1e6:.2f} us per row squared, the serving "
            f"term of the pilot's {info['windows']} busy windows (their step time's median error "
            f"{info['error_before']:.1%} -> {info['error_after']:.1%})")
    if not capacity:
        plan.log(f"profile: the calibration stays without {term}: the baseline does not "
                 "simulate with it")
        return None
    plan.sim, plan.serving = served, {k: float(f"{v:.6g}") for k, v in info.items()}
    plan.log(f"profile: the calibration + {term}")
    return capacity


def pool_blocks(url: str, *, timeout: float = 10.0) -> int | None:
    """num_gpu_blocks of vllm:cache_config_info on an engine's /metrics (None: absent, or
    the engine did not answer: the simulated pools then stay the profile's)."""
    import urllib.request

    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"{url}/metrics", timeout=timeout) as resp:
            text = resp.read().decode()
    except OSError:
        return None
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "vllm:cache_config_info" and \
                    str(sample.labels.get("num_gpu_blocks", "")).isdigit():
                return int(sample.labels["num_gpu_blocks"])
    return None


def fit_pool(plan, blocks: int, settings: dict) -> None:
    """The simulator's memory re-anchored on the pilot's pool: `blocks` KV blocks with the
    baseline's `settings` (the simulated engine's full settings). The engine sizes its pool
    as fraction x device - weights - activations, and measures its activations at start
    (on a CPU from the process's resident memory: the calibration's figure can be far from
    a served engine's). So the activations' constant term becomes what makes the
    baseline's pool the pilot's, the weights and the activations' slopes in
    max_num_batched_tokens and in the sequences' logits kept (a profile from
    config.json, calibrate.config_profile, has no token slope, and its weights are the
    model's facts). The device is the profile's (a GPU calibration), else cpu_memory_gib when the settings name it (a CPU target in a
    cluster: the Job's simulator_base); else it is unknown and becomes what holds the
    weights, the activations and the pilot's pool at the baseline's fraction."""
    from engine.config import EngineConfig

    memory = plan.sim.profile.memory
    default = EngineConfig()
    full = {"block_size": default.block_size, "cpu_memory_gib": default.cpu_memory_gib,
            "gpu_memory_utilization": default.gpu_memory_utilization,
            "max_num_batched_tokens": default.max_num_batched_tokens,
            "max_num_seqs": default.max_num_seqs,
            **{k: v for k, v in settings.items() if v is not None}}
    block, fraction = int(full["block_size"]), float(full["gpu_memory_utilization"])
    limits = {"max_num_batched_tokens": int(full["max_num_batched_tokens"]),
              "max_num_seqs": int(full["max_num_seqs"])}
    pool = blocks * block * memory.kv_bytes_per_token
    slope = memory.activations(**limits) - memory.activation_base
    before = memory.num_blocks(block_size=block, fraction=fraction,
                               cpu_memory_gib=float(full["cpu_memory_gib"]), **limits)
    device = memory.device_bytes or (float(settings["cpu_memory_gib"]) * 2**30
                                     if settings.get("cpu_memory_gib") else None)
    if device:
        fitted = dataclasses.replace(memory, activation_base=fraction * device
                                     - memory.weight_bytes - slope - pool)
    else:
        fitted = dataclasses.replace(memory, device_bytes=(
            memory.weight_bytes + memory.activation_base + slope + pool) / fraction)
    plan.sim = dataclasses.replace(plan.sim, profile=dataclasses.replace(
        plan.sim.profile, memory=fitted))
    plan.pool = {"pilot_blocks": blocks, "block_size": block, "profile_blocks": before}
    plan.log(f"profile: the pilot's pool, {blocks} blocks of {block} tokens (the profile "
             f"said {before}), sizes the simulated engines' pools")


ANCHOR_TOLERANCE = 0.1        # the baseline simulated within 10 % of its pilot: left as is
ANCHOR_STEPS = 8              # simulations of the baseline at most, after the first
ANCHOR_RANGE = (1 / 16, 16)   # the factor's bounds: beyond them the profile is not this engine
ANCHOR_MIN_SLOPE = 0.1        # d log capacity / d log factor below this: not time-bound
ANCHOR_TREND = 3              # the last pairs tried whose trend sets the next step


def _slope(tried: list[tuple[float, float]]) -> float:
    """k of log capacity = a - k log factor, least squares over the (factor, capacity)
    pairs (one pair: 1)."""
    if len(tried) == 1:
        return 1.0
    xs = [math.log(f) for f, _ in tried]
    ys = [math.log(c) for _, c in tried]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return -sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / sum((x - mx) ** 2 for x in xs)


def _bracket(tried: list[tuple[float, float]], real: float) -> tuple[tuple, tuple]:
    """((the largest factor tried that simulated above `real`, its capacity), (the
    smallest that simulated below it, its capacity)); (a range's end, None) where none
    did. The factor sought lies between while the capacities fall with the factor (noise
    can cross them: then the caller ignores the bracket)."""
    above = max(((f, c) for f, c in tried if c > real), default=(ANCHOR_RANGE[0], None))
    below = min(((f, c) for f, c in tried if c < real), default=(ANCHOR_RANGE[1], None))
    return above, below


def _between(low: float, above: float, high: float, below: float, real: float) -> float:
    """The factor between `low` (simulated `above` the pilot's `real`) and `high`
    (`below` it) where the line through both, log capacity on log factor, meets `real`,
    kept in the bracket's middle half (log scale) so that a knee or a cliff between them
    still halves it within a few steps."""
    a, b = math.log(low), math.log(high)
    over, under = math.log(above / real), math.log(below / real)
    x = a + (b - a) * over / (over - under)
    return math.exp(min(max(x, a + (b - a) / 4), b - (b - a) / 4))


def scaled(sim, factor: float):
    """`sim` (a SimContext) with every step time of its profile x `factor`."""
    fit = sim.profile.fit
    return dataclasses.replace(sim, profile=dataclasses.replace(
        sim.profile, fit=dataclasses.replace(
            fit, coefficients={k: v * factor for k, v in fit.coefficients.items()})))


def anchor_time(plan, *, real: float, simulated: float | None,
                predict: Callable[[object], float | None]) -> None:
    """The profile's step times (plan.sim) scaled by one factor so that the baseline's
    simulated capacity is its pilot's real one `real`, within ANCHOR_TOLERANCE
    (`simulated`: the baseline's simulated capacity now; `predict(sim)`: on another
    SimContext). A profile can time the steps it saw and still be off by a constant
    share on the served engine: steps timed under another load of the machine (a shared
    CI node, a Job's pod beside the trials), delivery to the streams in another process.
    The settings' ranking comes from the profile's shape; its level from the one real
    capacity the sweep holds. Until factors on both sides of the pilot are tried, each
    step goes where the trend of log capacity against log factor (capacity ~ factor^-k;
    k and its level by least squares over the last ANCHOR_TREND pairs, first k = 1) meets
    the pilot; then where the line between the bracket's two ends does, in its middle
    half (_between); the closest factor tried stays. A simulated capacity search reads its
    knee a little high or low at each factor (passing and failing rates interleave there),
    near a TTFT-bound knee the capacity falls steeply with the factor, and it can drop
    between two close factors (the queue verdict of probes near a one-sequence knee
    flips: x0.769 8.60 req/s, x0.724 15.89 in the local cluster): a
    secant through the last two pairs turned back on one pair read low (CI, 2026-12-07:
    it kept 6.19 req/s against the pilot's 9.77). On 400 synthetic curves of each kind
    with +-20 % noise (benchmarks/bench_anchor.py) this lands within the tolerance for
    96 % of power laws, 99 % of steep knees and 59 % of 3x cliffs, where the secant (4
    steps) did for 78 %, 68 % and 25 %. Where two steps barely move the baseline's
    capacity (a pool-bound baseline), nothing is scaled.
    plan.anchor records it."""
    if not (real > 0 and simulated and simulated > 0):
        plan.anchor = None
        return
    tried = [(1.0, simulated)]
    while abs(tried[-1][1] - real) / real > ANCHOR_TOLERANCE and len(tried) <= ANCHOR_STEPS:
        recent = tried[-ANCHOR_TREND:]
        slope = _slope(recent)
        if slope < ANCHOR_MIN_SLOPE:
            if len(tried) >= 3:
                break   # two steps barely moved it: not bound by step time
            slope = 1.0   # one flat step may be a knee's noise: a second one tells
        xs, ys = [math.log(f) for f, _ in recent], [math.log(c) for _, c in recent]
        level = sum(ys) / len(ys) + slope * sum(xs) / len(xs)
        nxt = min(max(math.exp((level - math.log(real)) / slope), ANCHOR_RANGE[0]),
                  ANCHOR_RANGE[1])
        (low, above), (high, below) = _bracket(tried, real)
        if above is not None and below is not None and low < high:
            nxt = _between(low, above, high, below, real)
        elif low < high and not low < nxt < high:   # the trend left the bracket: halve it
            nxt = math.sqrt(low * high)
        if any(math.isclose(nxt, f, rel_tol=1e-3) for f, _ in tried):
            break
        got = predict(scaled(plan.sim, nxt))
        if not got:
            break
        tried.append((nxt, got))
    factor, capacity = min(tried, key=lambda fc: abs(fc[1] - real))
    plan.anchor = {"pilot": real, "simulated": simulated, "factor": round(factor, 4),
                   "anchored": capacity, "simulations": len(tried) - 1,
                   "tried": [[round(f, 4), round(c, 4)] for f, c in tried]}
    if factor == 1.0:
        plan.log(f"profile: the baseline simulated at {simulated:.2f} req/s against its "
                 f"pilot's {real:.2f}: "
                 + ("close enough, step times kept" if len(tried) == 1 else
                    "no step-time factor brings it closer (not bound by step time); kept"))
        return
    plan.sim = scaled(plan.sim, factor)
    plan.log(f"profile: step times x {factor:.3g} so the baseline's simulated capacity is its "
             f"pilot's ({simulated:.2f} -> {capacity:.2f} req/s; real {real:.2f}; tried "
             + ", ".join(f"x{f:.3g}: {c:.2f}" for f, c in tried[1:]) + ")")
