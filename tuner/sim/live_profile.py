"""A step-time profile from a running service's own steps (its /metrics, or Prometheus).

The serving loop exports every step's time, delivery to the streams included
(`paged:engine_step_duration_seconds`, a histogram: its _sum and _count), and its
composition (`paged:engine_step_shape_total{figure=...}`, the figures of
engine/step_shape.py summed over steps). Between two readings of those counters a window
holds n steps of summed time T and summed figures F; T also holds the loop's time between
those steps while requests were unfinished (`paged:engine_step_gap_seconds`: new requests
taken in, stats, the GIL shared with the HTTP side), which a simulated engine, running its
steps back to back, must charge to the steps. A profile form is linear
(t = intercept + sum c_i f_i), so the window's mean step obeys the same law:
T / n = intercept + sum c_i F_i / n. Windows are then fitted exactly like timed steps
(tuner/sim/profile.fit: the form chosen by held-out error), and the result replaces the
fit of the calibrated profile, whose identity and memory terms it keeps: the live series
knows what the service's steps cost under its real traffic and HTTP streaming, the
calibration what sizes its pool.

A window with fewer than MIN_WINDOW_STEPS steps (an idle service) is skipped; a counter
that went down (the engine restarted) skips its window.

A service with KV tiers also times its copies (`vllm:kv_offload_total_bytes` and
`vllm:kv_offload_total_time` by transfer_type): the series' GPU_to_CPU, CPU_to_GPU and
Disk_to_GPU seconds per byte replace the profile's store, load and disk load rates
(`copy_rates`), which a profile from config.json alone (the in-cluster Job's) lacks: its
simulated copies took no time.
"""
from __future__ import annotations

import dataclasses
import threading
import time
from dataclasses import dataclass, field

import httpx
import numpy as np
from prometheus_client.parser import text_string_to_metric_families

from engine.entrypoints.metrics import STEP_FIGURES
from tuner.sim.profile import (FORMS, SERVED_ROWS, SERVED_ROWS_SQUARED, SERVED_STEP,
                               UNFITTED, Fit, Profile, feature, fit, median_relative_error,
                               nonnegative_lstsq)

STEP_SECONDS = "paged:engine_step_duration_seconds"
STEP_GAP = "paged:engine_step_gap_seconds"
STEP_SHAPE = "paged:engine_step_shape"
MIN_WINDOW_STEPS = 5
COPY_BYTES, COPY_SECONDS = "vllm:kv_offload_total_bytes", "vllm:kv_offload_total_time"
# the copies the simulator times: the host tier's store and load, a disk block's load
STORE, LOAD, DISK_LOAD = "GPU_to_CPU", "CPU_to_GPU", "Disk_to_GPU"
COPY_KINDS = (STORE, LOAD, DISK_LOAD)
MIN_COPY_BYTES = 1 << 20   # fewer bytes moved over a series: too few copies to time


@dataclass
class Totals:
    """The step counters at one moment."""
    t: float
    steps: float
    seconds: float
    figures: dict[str, float] = field(default_factory=dict)
    # transfer_type -> (bytes, seconds) of the KV tiers' copies; empty without a tier
    copies: dict[str, tuple[float, float]] = field(default_factory=dict)
    gap: float = 0.0   # summed loop time between steps with requests unfinished (STEP_GAP)

    @property
    def looped(self) -> float:
        """The serving loop's time for these steps: the steps and the gaps between them
        (what a simulated engine, which runs its steps back to back, charges per step)."""
        return self.seconds + self.gap


def parse_totals(text: str, *, t: float) -> Totals:
    """The step counters in a /metrics text (summed over model names)."""
    steps = seconds = gap = 0.0
    figures = dict.fromkeys(STEP_FIGURES, 0.0)
    seen = False
    moved: dict[str, list[float]] = {}   # transfer_type -> [bytes, seconds]
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            kind = sample.labels.get("transfer_type")
            column = {COPY_BYTES + "_total": 0, COPY_SECONDS + "_total": 1}.get(sample.name)
            if kind in COPY_KINDS and column is not None:
                moved.setdefault(kind, [0.0, 0.0])[column] += sample.value
            elif sample.name == STEP_SECONDS + "_count":
                steps, seen = steps + sample.value, True
            elif sample.name == STEP_SECONDS + "_sum":
                seconds += sample.value
            elif sample.name == STEP_GAP + "_sum":
                gap += sample.value
            elif sample.name == STEP_SHAPE + "_total" and sample.labels.get("figure") in figures:
                figures[sample.labels["figure"]] += sample.value
    if not seen:
        raise ValueError(f"the metrics hold no {STEP_SECONDS}: is this an engine of this "
                         "project (python -m engine.entrypoints.api_server), and recent enough?")
    return Totals(t, steps, seconds, figures, {k: (b, s) for k, (b, s) in moved.items()},
                  gap)


def scrape(url: str, *, timeout: float = 10.0) -> Totals:
    """The step counters of an engine at `url` (its base URL or its /metrics)."""
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        response = httpx.get(target, timeout=timeout)
        response.raise_for_status()
    except httpx.HTTPError as exc:
        raise ValueError(f"could not read {target}: {exc}") from None
    return parse_totals(response.text, t=time.time())


def scrape_series(url: str, *, duration: float, interval: float,
                  log=lambda s: None) -> list[Totals]:
    """Readings every `interval` s for `duration` s (the first one now)."""
    series = [scrape(url)]
    end = series[0].t + duration
    while series[-1].t + interval <= end + 1e-6:
        time.sleep(max(0.0, series[-1].t + interval - time.time()))
        series.append(scrape(url))
        log(f"{len(series) - 1} window(s), {series[-1].steps - series[0].steps:.0f} steps")
    return series


def prometheus_series(reader, selector: str, *, start: float, end: float,
                      interval: float) -> list[Totals]:
    """Readings from Prometheus (a tuner.measure.promql.PrometheusReader) every `interval`
    s over [start, end]; `selector` is a PromQL label matcher ('{job="engine"}')."""
    series = []
    t = start
    while t <= end + 1e-6:
        steps = reader.scalar(f"sum({STEP_SECONDS}_count{selector})", at=t)
        seconds = reader.scalar(f"sum({STEP_SECONDS}_sum{selector})", at=t)
        if steps is not None and seconds is not None:
            shape = reader.query(f"sum by (figure) ({STEP_SHAPE}_total{selector})", at=t)
            figures = dict.fromkeys(STEP_FIGURES, 0.0)
            figures.update({m.get("figure"): v for m, v in shape if m.get("figure") in figures})
            gap = reader.scalar(f"sum({STEP_GAP}_sum{selector})", at=t)
            series.append(Totals(t, steps, seconds, figures,
                                 prometheus_copies(reader, selector, t), gap or 0.0))
        t += interval
    if not series:
        raise ValueError(f"Prometheus has no {STEP_SECONDS} for {selector} between "
                         f"{start:.0f} and {end:.0f}: does it scrape the engine?")
    return series


def prometheus_copies(reader, selector: str, t: float) -> dict[str, tuple[float, float]]:
    """transfer_type -> (bytes, seconds) of the host tier's copies at `t`; empty for a
    service without a tier (or an engine older than vllm:kv_offload_total_time)."""
    def by_kind(name: str) -> dict[str, float]:
        rows = reader.query(f"sum by (transfer_type) ({name}_total{selector})", at=t)
        return {m.get("transfer_type"): v for m, v in rows}
    nbytes, seconds = by_kind(COPY_BYTES), by_kind(COPY_SECONDS)
    return {k: (nbytes[k], seconds[k]) for k in COPY_KINDS if k in nbytes and k in seconds}


def copy_rates(series: list[Totals]) -> dict[str, float]:
    """Seconds per byte of the KV tiers' copies over `series` (its first to its last
    reading), by transfer type (COPY_KINDS): only those that moved MIN_COPY_BYTES or more
    in between and took time; none where a counter went down (a restart)."""
    if len(series) < 2:
        return {}
    rates = {}
    for kind in COPY_KINDS:
        if kind not in series[0].copies or kind not in series[-1].copies:
            continue
        (b0, s0), (b1, s1) = series[0].copies[kind], series[-1].copies[kind]
        if b1 - b0 >= MIN_COPY_BYTES and s1 - s0 > 0:
            rates[kind] = (s1 - s0) / (b1 - b0)
    return rates


def with_copy_rates(profile: Profile, series: list[Totals]) -> Profile:
    """`profile` with the copy rates the series timed (copy_rates); the rest of its memory
    model, and any rate the series did not time, kept."""
    rates = copy_rates(series)
    if not rates:
        return profile
    m = profile.memory
    return dataclasses.replace(profile, memory=dataclasses.replace(
        m, store_seconds_per_byte=rates.get(STORE, m.store_seconds_per_byte),
        load_seconds_per_byte=rates.get(LOAD, m.load_seconds_per_byte),
        disk_load_seconds_per_byte=rates.get(DISK_LOAD, m.disk_load_seconds_per_byte)))


def windows(series: list[Totals], *, min_steps: int = MIN_WINDOW_STEPS
            ) -> tuple[list[dict], list[float], int]:
    """(mean step shape, mean loop seconds per step: the step and its gap) of each busy
    window, and the steps they hold."""
    shapes, seconds, total = [], [], 0
    for a, b in zip(series, series[1:]):
        n = b.steps - a.steps
        deltas = {k: b.figures.get(k, 0.0) - a.figures.get(k, 0.0) for k in STEP_FIGURES}
        if n < min_steps or b.seconds < a.seconds or b.gap < a.gap or \
                min(deltas.values()) < 0:
            continue   # idle, or the engine restarted in between
        shapes.append({k: v / n for k, v in deltas.items()})
        seconds.append((b.looped - a.looped) / n)
        total += int(n)
    return shapes, seconds, total


def steps_price(fit: Fit, steps: float, figures: dict[str, float]) -> float:
    """What a linear profile charges for `steps` steps whose shape figures sum to `figures`:
    intercept x steps + sum c_i F_i (seconds); a serving term's squared rows as the
    engine summed them (an engine older than that counter: at the steps' mean rows)."""
    mean = {k: v / steps for k, v in figures.items()} if steps else figures
    return fit.coefficients.get("intercept", 0.0) * steps + sum(
        c * (steps * feature(mean, name) if name in (SERVED_ROWS_SQUARED, SERVED_STEP)
             else feature(figures, name))
        for name, c in fit.coefficients.items() if name != "intercept")


def priced_share(fit: Fit, series: list[Totals]) -> float | None:
    """The profile's price of every step an engine served between the first and the last
    reading of `series`, over what they measured: 1.0 where the profile times this
    engine's steps right, below 1 where it under-prices them. None without a step in
    between, for an unfitted profile, or when a counter went down (a restart)."""
    if len(series) < 2 or fit.form == UNFITTED:
        return None
    a, b = series[0], series[-1]
    steps, seconds = b.steps - a.steps, b.looped - a.looped
    figures = {k: b.figures.get(k, 0.0) - a.figures.get(k, 0.0) for k in STEP_FIGURES}
    if steps <= 0 or seconds <= 0 or min(figures.values()) < 0:
        return None
    return steps_price(fit, steps, figures) / seconds


def fit_live(series: list[Totals], forms: dict = FORMS) -> tuple[Fit, int]:
    """The profile fit of a live series, and the steps it covers; ValueError when the
    series holds too few busy windows (it names how many it had)."""
    shapes, seconds, steps = windows(series)
    try:
        return fit(shapes, seconds, forms), steps
    except ValueError:
        raise ValueError(
            f"{len(shapes)} busy window(s) of >= {MIN_WINDOW_STEPS} steps in the series "
            f"(of {max(0, len(series) - 1)}); read the service longer or more often while "
            "it serves traffic") from None


DRAFT_TERMS = ("draft_tokens", "draft_seqs", "lookup_seqs")


def carry_drafts(live: Fit, base: Fit, shapes: list[dict]) -> Fit:
    """`live` (fitted on windows that verified no draft: a service that never speculated,
    the capacity sweep's pilot of the defaults) with the draft terms of `base` (the
    calibration, which times them), scaled by how much slower `live` finds these windows
    (the median of live / base over them): windows without drafts leave both terms
    unknown, and a simulator that charges verification nothing or a prompt token's price
    rates speculation too high (a row verifying drafts costs 0.1-0.2 ms besides its draft
    tokens on the embedded model: the calibration's draft phase). A draft token is charged
    at least what `live` charges one (its floor, the prompt token's price). Windows that
    did verify drafts, an unfitted base, or one without draft terms: `live` as it is."""
    if base.form == UNFITTED or not any(base.coefficients.get(k) for k in DRAFT_TERMS) or \
            any(feature(s, k) for s in shapes for k in DRAFT_TERMS):
        return live
    scale = float(np.median([live.predict(s) / max(base.predict(s), 1e-9) for s in shapes]))
    coefficients = dict(live.coefficients)
    tokens_form = "num_tokens" in coefficients    # it charges a draft as a token already
    own = coefficients["num_tokens"] if tokens_form else coefficients.get("draft_tokens", 0.0)
    price = max(own, scale * base.coefficients.get("draft_tokens", 0.0))
    coefficients["draft_tokens"] = price - own if tokens_form else price
    for name in DRAFT_TERMS[1:]:
        coefficients[name] = scale * base.coefficients.get(name, 0.0)
    return dataclasses.replace(live, coefficients=coefficients)


def live_profile(base: Profile, series: list[Totals]) -> Profile:
    """`base` (a calibrated profile of the same model) with its step-time fit replaced by
    the live series' fit (the draft terms carried from `base` where the series verified
    no draft: carry_drafts), and its host tier's copy rates by the series' where it timed
    copies (with_copy_rates)."""
    live, steps = fit_live(series)
    live = carry_drafts(live, base.fit, windows(series)[0])
    return dataclasses.replace(with_copy_rates(base, series), fit=live, num_steps=steps,
                               created=f"live: {len(series) - 1} windows, "
                                       f"{time.strftime('%Y-%m-%dT%H:%M:%S')}")


def serving_term(base: Profile, series: list[Totals]) -> tuple[Profile, dict]:
    """`base` (a profile timed in-process: the calibration) with what serving adds to each
    step, fitted on a served series: seconds per row the step delivers to the streams
    (decode rows and prefill rows: the figure SERVED_ROWS), and per row squared. The
    calibration times the engine alone; a server's steps also deliver every token to its
    stream while the HTTP loop and the load client share the cores (one token's chunk,
    detokenised and written), which the calibration never saw (chat on the embedded
    model, 2026-12-05: the calibration priced the served steps at 0.72-0.87 of their
    time, about 0.3-0.6 ms per row). That cost per row grows with the rows: agentic's
    pilot (2026-12-06) left 1.0-1.2 ms per row unpriced at up to 25 rows a step and 2.3 ms
    at 43-61, so one slope priced small batches too high and large ones too low (12
    settings ranked at Kendall tau 0.56; with the square 0.70, and chat's 0.91 -> 0.94).
    Serving also costs per step that delivers rows (SERVED_STEP): chat's served one-row
    steps (2026-12-07) cost 4.1 ms a token against 3.6 ms priced by the per-row terms
    alone, fitted on the defaults' large batches, and the simulator rated one to four
    sequences 1.3-1.4x their real sustained capacity (with the step term 1.2x; the twelve
    settings' median capacity error 10.9 % -> 7.3 %).
    Three non-negative coefficients, least squares of the relative error (as profile.fit)
    of each busy window's mean step time left over by `base` against its mean rows, its
    steps' mean square and 1 per step (the engine counts `served_rows_squared`; for an
    engine older than that counter the square of the mean rows stands in, low wherever a
    window's batch size varies); the rest of the calibration's shape stays.
    -> (profile, {"seconds_per_row", "seconds_per_row_squared", "seconds_per_step",
    "windows", "error_before", "error_after"}: the windows' median relative error without
    and with the term). ValueError with fewer than two busy windows."""
    shapes, seconds, steps = windows(series)
    if len(shapes) < 2:
        raise ValueError(f"{len(shapes)} busy window(s) of >= {MIN_WINDOW_STEPS} steps in the "
                         "series; the serving term needs at least 2 (read the service longer "
                         "while it serves traffic)")
    terms = (SERVED_ROWS, SERVED_ROWS_SQUARED, SERVED_STEP)
    inprocess = {k: v for k, v in base.fit.coefficients.items() if k not in terms}
    alone = dataclasses.replace(base.fit, coefficients=inprocess)
    y = np.asarray(seconds)
    before = np.asarray([alone.predict(s) for s in shapes])
    x = np.asarray([[feature(s, name) for name in terms] for s in shapes])
    coef = nonnegative_lstsq(x, y - before, weight=1.0 / np.maximum(y, 1e-9))
    served = dataclasses.replace(alone, coefficients={**inprocess, **dict(zip(
        terms, map(float, coef)))})
    after = np.asarray([served.predict(s) for s in shapes])
    info = {"seconds_per_row": float(coef[0]), "seconds_per_row_squared": float(coef[1]),
            "seconds_per_step": float(coef[2]),
            "windows": len(shapes), "steps": steps,
            "error_before": median_relative_error(before, y),
            "error_after": median_relative_error(after, y)}
    return dataclasses.replace(base, fit=served), info


def read_steps(url: str, series: list, interval: float):
    """Read the engine's step counters every `interval` s into `series` until the
    returned function is called (it reads once more); an engine without them adds
    nothing."""
    stop = threading.Event()

    def read() -> None:
        try:
            series.append(scrape(url))
        except ValueError:   # an engine without the step series: no live profile
            stop.set()

    def loop() -> None:
        while not stop.is_set():
            read()
            stop.wait(interval)
    thread = threading.Thread(target=loop, name="step-reader", daemon=True)
    thread.start()

    def done() -> None:
        stop.set()
        thread.join()
        read()
    return done
