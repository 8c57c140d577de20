"""A step-time profile from a live service's step counters (tuner/sim/live_profile.py)."""
import dataclasses
import random

import pytest
from prometheus_client import generate_latest

from engine.entrypoints.metrics import ServerMetrics
from engine.step_shape import StepShape
from tuner.sim.live_profile import (MIN_WINDOW_STEPS, Totals, fit_live, parse_totals,
                                    windows)

TRUE = {"intercept": 0.004, "prefill_tokens": 2e-5, "decode_seqs": 6e-4, "draft_tokens": 3e-4}


def _step(rng):
    return StepShape(prefill_tokens=rng.choice([0, 0, 32, 200, 512]), prefill_seqs=1,
                     decode_seqs=rng.randint(0, 48), draft_tokens=rng.choice([0, 0, 8]),
                     decode_context=rng.randint(0, 4000))


def _seconds(shape):
    return TRUE["intercept"] + sum(c * getattr(shape, k) for k, c in TRUE.items()
                                   if k != "intercept")


def _series(rng, windows=40, metrics=None):
    """Counters read after each of `windows` windows of 5-60 steps of a known law."""
    metrics = metrics or ServerMetrics(model_name="m", max_model_len=4096)
    series = [parse_totals(generate_latest(metrics.registry).decode(), t=0)]
    for w in range(windows):
        for _ in range(rng.randint(MIN_WINDOW_STEPS, 60)):
            shape = _step(rng)
            metrics.observe_step(shape, _seconds(shape))
        series.append(parse_totals(generate_latest(metrics.registry).decode(), t=w + 1))
    return series


def test_the_counters_on_metrics_are_the_sums_of_the_steps():
    metrics, rng = ServerMetrics(model_name="m", max_model_len=4096), random.Random(1)
    shapes = [_step(rng) for _ in range(30)]
    for s in shapes:
        metrics.observe_step(s, _seconds(s))
    totals = parse_totals(generate_latest(metrics.registry).decode(), t=0)
    assert totals.steps == 30
    assert totals.seconds == pytest.approx(sum(map(_seconds, shapes)))
    for name in ("prefill_tokens", "decode_seqs", "decode_context", "draft_tokens"):
        assert totals.figures[name] == sum(getattr(s, name) for s in shapes), name


def test_windows_of_a_live_series_recover_a_known_step_law():
    fit, steps = fit_live(_series(random.Random(2)))
    assert steps > 40 * MIN_WINDOW_STEPS
    for name, value in TRUE.items():
        assert fit.coefficients.get(name, 0.0) == pytest.approx(value, rel=0.02), name
    assert fit.heldout_error < 0.01


def test_the_loops_gaps_between_steps_are_charged_to_the_steps():
    """A served engine idles between its steps (new requests, stats, the GIL); a simulated
    one runs them back to back, so the live fit prices each step with its gap: a constant
    gap is the intercept's, one per prefill token that token's price."""
    metrics, rng = ServerMetrics(model_name="m", max_model_len=4096), random.Random(4)
    series = [parse_totals(generate_latest(metrics.registry).decode(), t=0)]
    gaps = 0.0
    for w in range(30):
        for _ in range(rng.randint(MIN_WINDOW_STEPS, 40)):
            shape = _step(rng)
            gap = 0.001 + 1e-5 * shape.prefill_tokens
            metrics.observe_step(shape, _seconds(shape))
            metrics.step_gap.observe(gap)
            gaps += gap
        series.append(parse_totals(generate_latest(metrics.registry).decode(), t=w + 1))
    assert series[-1].gap == pytest.approx(gaps)
    assert series[-1].looped == pytest.approx(series[-1].seconds + gaps)
    fit, _ = fit_live(series)
    assert fit.coefficients["intercept"] == pytest.approx(TRUE["intercept"] + 0.001, rel=0.02)
    assert fit.coefficients["prefill_tokens"] == pytest.approx(
        TRUE["prefill_tokens"] + 1e-5, rel=0.02)
    # an engine that exports no gaps (older than the series) is fitted on its steps alone
    older = [dataclasses.replace(t, gap=0.0) for t in series]
    assert fit_live(older)[0].coefficients["intercept"] == pytest.approx(TRUE["intercept"],
                                                                        rel=0.02)


def test_idle_windows_and_a_restart_are_skipped():
    t = lambda i, steps, sec, tok: Totals(i, steps, sec, {"prefill_tokens": tok})  # noqa: E731
    series = [t(0, 100, 1.0, 1000), t(1, 100 + MIN_WINDOW_STEPS - 1, 1.1, 1100),  # idle
              t(2, 200, 2.0, 3000), t(3, 10, 0.1, 50),    # restarted: counters fell
              t(4, 30, 0.3, 450)]
    shapes, seconds, steps = windows(series)
    busy = 200 - (100 + MIN_WINDOW_STEPS - 1)
    assert steps == busy + 20
    assert [s["prefill_tokens"] for s in shapes] == pytest.approx([1900 / busy, 20.0])
    assert seconds == pytest.approx([0.9 / busy, 0.01])
    # the gaps count in each window's time, and their counter falling alone (the last
    # window) is a restart too
    gapped = [dataclasses.replace(x, gap=g) for x, g in zip(series, (0, 0, 0.5, 0.6, 0.1))]
    assert windows(gapped)[1] == pytest.approx([1.4 / busy])


def test_too_few_busy_windows_and_a_foreign_metrics_page_are_clear_errors():
    with pytest.raises(ValueError, match=r"3 busy window\(s\).*read the service longer"):
        fit_live(_series(random.Random(3), windows=3))
    with pytest.raises(ValueError, match="no paged:engine_step_duration_seconds"):
        parse_totals("# TYPE up gauge\nup 1\n", t=0)


def test_read_steps_collects_a_series_until_stopped_and_nothing_from_a_foreign_endpoint():
    import time

    from step_feeder import assert_recovers_the_law, feeding_metrics
    from tuner.sim.live_profile import read_steps

    series = []
    with feeding_metrics() as url:
        done = read_steps(url, series, 0.3)
        deadline = time.monotonic() + 30
        while len(series) < 20 and time.monotonic() < deadline:
            time.sleep(0.05)
        done()
        count = len(series)
    assert count >= 21 and len(series) == count          # a last reading, then none
    assert all(b.t >= a.t and b.steps >= a.steps for a, b in zip(series, series[1:]))
    assert_recovers_the_law(fit_live(series)[0].coefficients)
    nothing = []
    read_steps("http://127.0.0.1:9", nothing, 0.05)()
    assert nothing == []


def _calibrated(coefficients=None):
    from tuner.sim.profile import Fit, Identity, Memory, Profile
    return Profile(Identity("m", "f", "hw", "t", 1),
                   Fit("rows", dict(coefficients or TRUE), 0.05),
                   Memory(0, 1e6, 1000, 0, 0, 2048, 100), num_steps=100)


def test_a_profile_prices_an_engines_served_steps_against_their_time():
    from tuner.sim.live_profile import priced_share
    from tuner.sim.profile import UNFITTED, Fit

    rng = random.Random(5)
    series = _series(rng, windows=12)
    exact = Fit("attention", dict(TRUE), 0.0)
    assert priced_share(exact, series) == pytest.approx(1.0, rel=1e-6)
    # a profile 20 % cheaper per decode row and per step under-prices them
    cheap = Fit("attention", {k: 0.8 * v for k, v in TRUE.items()}, 0.0)
    assert priced_share(cheap, series) == pytest.approx(0.8, rel=1e-6)
    # one term dropped: the steps' drafts left unpriced count
    no_drafts = Fit("attention", {k: v for k, v in TRUE.items() if k != "draft_tokens"}, 0.0)
    assert priced_share(no_drafts, series) < 0.999
    # from the first reading to the last: the middle readings do not matter
    assert priced_share(cheap, [series[0], series[-1]]) == priced_share(cheap, series)
    # nothing to price: one reading, no step between two, a restart, no fit
    assert priced_share(exact, series[:1]) is None
    assert priced_share(exact, [series[3], series[3]]) is None
    assert priced_share(exact, [series[-1], series[0]]) is None
    assert priced_share(Fit(UNFITTED, {}, float("inf")), series) is None


def _law_series(rng, law, *, drafts: bool, windows=30):
    """Counters of steps timed by `law` (a Fit); with `drafts`, some rows verify 1-8."""
    metrics = ServerMetrics(model_name="m", max_model_len=4096)
    series = [parse_totals(generate_latest(metrics.registry).decode(), t=0)]
    for w in range(windows):
        for _ in range(rng.randint(MIN_WINDOW_STEPS, 60)):
            seqs = rng.randint(1, 48)
            spec = rng.randint(0, seqs) if drafts else 0
            shape = StepShape(prefill_tokens=rng.choice([0, 0, 32, 200, 512]), prefill_seqs=1,
                              decode_seqs=seqs, draft_seqs=spec,
                              draft_tokens=spec * rng.randint(1, 8))
            metrics.observe_step(shape, law.predict(shape))
        series.append(parse_totals(generate_latest(metrics.registry).decode(), t=w + 1))
    return series


def test_a_series_without_drafts_takes_the_calibrations_draft_terms_at_its_own_scale():
    """A pilot that never speculated cannot time verification: its refit carries the
    calibration's draft terms, scaled by how much slower it finds the same steps; a draft
    token never below the refit's own price. A series that verified drafts times them."""
    from tuner.sim.live_profile import carry_drafts, live_profile
    from tuner.sim.profile import Fit

    calibration = {"intercept": 0.002, "prefill_tokens": 1e-5, "decode_seqs": 3e-4,
                   "draft_tokens": 1.5e-4, "draft_seqs": 2e-4}
    base = _calibrated(calibration)
    served = Fit("rows", {k: 2 * v for k, v in calibration.items()}, 0.0)   # 2x slower
    plain = live_profile(base, _law_series(random.Random(7), served, drafts=False)).fit
    for name, value in served.coefficients.items():
        assert plain.coefficients[name] == pytest.approx(value, rel=1e-3), name
    spec = StepShape(decode_seqs=16, draft_seqs=16, draft_tokens=64)
    assert plain.predict(spec) == pytest.approx(served.predict(spec), rel=1e-3)
    # drafts timed by the series itself: its own fit (here: verification free)
    cheap = Fit("rows", {**served.coefficients, "draft_tokens": 2e-5, "draft_seqs": 0.0}, 0.0)
    timed = live_profile(base, _law_series(random.Random(8), cheap, drafts=True)).fit
    assert timed.coefficients["draft_seqs"] == pytest.approx(0.0, abs=1e-7)
    assert timed.coefficients["draft_tokens"] == pytest.approx(2e-5, rel=1e-3)
    # the tokens form prices a draft as a token already: only the rest is added
    tokens = Fit("tokens", {"intercept": 0.004, "num_tokens": 1e-4}, 0.0)
    shapes = [StepShape(decode_seqs=n).as_dict() for n in (4, 8, 16)]
    carried = carry_drafts(tokens, base.fit, shapes)
    scale = tokens.predict(shapes[1]) / base.fit.predict(shapes[1])
    assert carried.coefficients["draft_tokens"] == pytest.approx(1.5e-4 * scale - 1e-4)
    assert carried.coefficients["draft_seqs"] == pytest.approx(2e-4 * scale)
    # nothing to carry from a base without draft terms
    bare = Fit("rows", {k: v for k, v in calibration.items() if "draft" not in k}, 0.0)
    assert carry_drafts(tokens, bare, shapes) is tokens


def test_a_tiered_engines_copy_counters_time_the_profiles_host_tier(tiny_checkpoints,
                                                                     monkeypatch):
    """A live profile of an engine with a host KV tier takes its copy rates from the
    engine's own counters (vllm:kv_offload_total_bytes / _total_time on /metrics): each
    the tier's seconds over its bytes, stores and loads apart; the rest of the profile's
    memory model stays."""
    from engine import LLM, SamplingParams
    from engine.kv_medium import Medium
    from engine.kv_offload.metrics import collector
    from tuner.sim import live_profile as live

    block = 2 * 2 * 16 * 2 * 16 * 4   # the tiny checkpoints' block: layers, K/V, 16 tokens
    llm = LLM(model=tiny_checkpoints["llama"], block_size=16, num_gpu_blocks_override=10,
              max_model_len=128, kv_offloading_size=40 * block / 2**30)
    tiers = llm.llm_engine.offload
    metrics = ServerMetrics(model_name="m", max_model_len=128)
    metrics.registry.register(collector(tiers, "m"))

    def read(t):
        metrics.observe_step(StepShape(decode_seqs=1), 0.01)   # the step series is there
        return parse_totals(generate_latest(metrics.registry).decode(), t=t)

    first = read(0)
    assert first.copies == dict.fromkeys(live.COPY_KINDS, (0.0, 0.0))
    rng = random.Random(7)
    prefixes = [[rng.randrange(3, 250) for _ in range(64)] for _ in range(6)]
    for tail in (1, 2):   # each prefix evicts earlier ones to the host tier; then back
        for prefix in prefixes:
            llm.generate([{"prompt_token_ids": prefix + [tail]}],
                         SamplingParams(temperature=0, max_tokens=2))
            tiers.drain()
    last = read(1)
    stats = tiers.stats
    assert tiers.block_bytes == block
    stored, loaded = stats.blocks_stored[Medium.CPU], stats.blocks_loaded[Medium.CPU]
    assert stored > 0 and loaded > 0
    # a load's copy time is shared among its blocks: all of them within the jobs' own time
    assert 0 < stats.seconds_loaded[Medium.CPU] <= stats.load_seconds_sum
    assert last.copies[live.STORE] == (stored * block, pytest.approx(
        stats.seconds_stored[Medium.CPU]))
    assert last.copies[live.LOAD] == (loaded * block, pytest.approx(
        stats.seconds_loaded[Medium.CPU]))

    base = _calibrated()
    base.memory.store_seconds_per_byte, base.memory.load_seconds_per_byte = 1.0, 2.0
    assert live.copy_rates([first, last]) == {}   # fewer than MIN_COPY_BYTES moved
    monkeypatch.setattr(live, "MIN_COPY_BYTES", block)
    rates = live.copy_rates([first, last])
    assert rates[live.STORE] == pytest.approx(stats.seconds_stored[Medium.CPU] / (stored * block))
    assert rates[live.LOAD] == pytest.approx(stats.seconds_loaded[Medium.CPU] / (loaded * block))
    assert 0 < rates[live.STORE] < 1e-6 and 0 < rates[live.LOAD] < 1e-6   # above 1 MB/s
    timed = live.with_copy_rates(base, [first, last])
    assert (timed.memory.store_seconds_per_byte, timed.memory.load_seconds_per_byte) == \
        (rates[live.STORE], rates[live.LOAD])
    assert dataclasses.replace(timed.memory, store_seconds_per_byte=1.0,
                               load_seconds_per_byte=2.0) == base.memory
    assert timed.fit == base.fit


def test_copy_rates_need_bytes_moved_and_no_restart_and_keep_what_they_did_not_time():
    from tuner.sim import live_profile as live

    mb = live.MIN_COPY_BYTES

    def at(t, store, load=None):
        copies = {live.STORE: store} if load is None else {live.STORE: store, live.LOAD: load}
        return Totals(t, 0, 0.0, {}, copies)

    # the load moved enough, the store one byte short of the bound
    series = [at(0, (0, 0.0), (mb, 1.0)), at(1, (mb - 1, 0.5)),
              at(2, (mb - 1, 0.5), (3 * mb, 2.0))]
    assert live.copy_rates(series) == {live.LOAD: pytest.approx(1.0 / (2 * mb))}
    base = _calibrated()
    base.memory.store_seconds_per_byte = 7e-10
    timed = live.with_copy_rates(base, series)
    assert timed.memory.store_seconds_per_byte == 7e-10
    assert timed.memory.load_seconds_per_byte == pytest.approx(1.0 / (2 * mb))
    assert live.copy_rates([at(0, (5 * mb, 1.0)), at(1, (mb, 0.1))]) == {}   # restarted
    assert live.copy_rates([at(0, (0, 0.0)), at(1, (mb, 0.0))]) == {}   # took no time
    assert live.copy_rates([at(0, (0, 0.0)), at(1, (mb, 1.0))]) == {live.STORE: 1.0 / mb}
    assert live.copy_rates([at(0, (0, 0.0))]) == {}
    assert live.with_copy_rates(base, [at(0, (0, 0.0))]) is base
    # a live profile takes them with its fit
    fitted = live.live_profile(base, [
        dataclasses.replace(s, copies={live.LOAD: (i * mb, i * 1e-3)})
        for i, s in enumerate(_series(random.Random(5)))])
    assert fitted.memory.load_seconds_per_byte == pytest.approx(1e-3 / mb)
    assert fitted.memory.store_seconds_per_byte == 7e-10
