"""The serving term (tuner/sim/live_profile.serving_term): what a server adds to each step
the calibration timed in-process, per served row, per row squared and per served step,
fitted on a served engine's step counters."""
import dataclasses
import random

import pytest
from prometheus_client import generate_latest
from test_sim_live_profile import TRUE, _calibrated, _seconds, _step

from engine.entrypoints.metrics import ServerMetrics
from engine.step_shape import StepShape
from tuner.sim.live_profile import MIN_WINDOW_STEPS, parse_totals


SERVING = 3e-4   # seconds a served step adds per row it delivers


def _served_series(rng, windows=30, serving=SERVING, squared=0.0, levels=False,
                   counted=False, per_step=0.0):
    """Counters of a served engine: the in-process law plus `serving` per delivered row,
    `squared` per row squared and `per_step` per step; with `levels` each window's steps all decode one
    number of rows, 0-60 (a load level: a pilot's probes); with `counted` the engine
    counts each step's rows squared (StepShape.of does; older engines did not)."""
    metrics = ServerMetrics(model_name="m", max_model_len=4096)
    series = [parse_totals(generate_latest(metrics.registry).decode(), t=0)]
    for w in range(windows):
        level = rng.randint(0, 60)
        for _ in range(rng.randint(MIN_WINDOW_STEPS, 60)):
            shape = _step(rng)
            if levels:
                shape = dataclasses.replace(shape, decode_seqs=level)
            rows = shape.decode_seqs + shape.prefill_seqs
            if counted:
                shape = dataclasses.replace(shape, served_rows_squared=rows ** 2)
            metrics.observe_step(shape, _seconds(shape) + serving * rows + squared * rows ** 2
                                 + per_step)
        series.append(parse_totals(generate_latest(metrics.registry).decode(), t=w + 1))
    return series


def test_the_serving_term_recovers_what_serving_adds_per_delivered_row(tmp_path):
    from tuner.sim.live_profile import serving_term
    from tuner.sim.profile import SERVED_ROWS, SERVED_ROWS_SQUARED, SERVED_STEP, Profile

    profile, info = serving_term(_calibrated(), _served_series(random.Random(4)))
    assert info["seconds_per_row"] == pytest.approx(SERVING, rel=1e-6)
    assert info["error_after"] < 1e-6 < info["error_before"]
    assert info["windows"] == 30
    # the calibration's shape kept, the term added: a step costs what the served one did
    shape = StepShape(prefill_tokens=200, prefill_seqs=2, decode_seqs=30)
    assert profile.step_seconds(shape) == pytest.approx(_seconds(shape) + SERVING * 32)
    assert {k: v for k, v in profile.fit.coefficients.items()
            if k not in (SERVED_ROWS, SERVED_ROWS_SQUARED, SERVED_STEP)} == TRUE
    assert info["seconds_per_row_squared"] == pytest.approx(0, abs=1e-9)   # a linear cost
    assert info["seconds_per_step"] == pytest.approx(0, abs=1e-9)          # none per step
    # saved and read back with it; a profile that has one is refitted, not stacked
    profile.save(tmp_path / "p.json")
    again = Profile.load(tmp_path / "p.json")
    assert again.fit.coefficients[SERVED_ROWS] == pytest.approx(SERVING)
    twice, _ = serving_term(again, _served_series(random.Random(4)))
    assert twice.fit.coefficients[SERVED_ROWS] == pytest.approx(SERVING, rel=1e-6)


def test_a_per_row_cost_that_grows_with_the_rows_is_recovered_and_priced():
    """Agentic's pilot (2026-12-06) left ~1.1 ms per row unpriced at a few rows a step and
    ~2.3 ms at 40-60: a serving cost per row that grows with the rows. Both coefficients
    come back from windows at several load levels, and a big step is priced at its cost."""
    from tuner.sim.live_profile import priced_share, serving_term
    from tuner.sim.profile import SERVED_ROWS, SERVED_ROWS_SQUARED

    served = _served_series(random.Random(7), windows=40, serving=1e-3, squared=2e-5,
                            levels=True)
    profile, info = serving_term(_calibrated(), served)
    assert info["seconds_per_row"] == pytest.approx(1e-3, rel=1e-4)
    assert info["seconds_per_row_squared"] == pytest.approx(2e-5, rel=1e-4)
    assert profile.fit.coefficients[SERVED_ROWS_SQUARED] == pytest.approx(2e-5, rel=1e-4)
    assert SERVED_ROWS in profile.fit.coefficients
    big = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=60, decode_context=3000)
    assert profile.step_seconds(big) == pytest.approx(_seconds(big) + 60e-3 + 2e-5 * 3600)
    # the squared term priced over one window's summed counters: at its steps' mean rows
    assert priced_share(profile.fit, served[:2]) == pytest.approx(1.0, rel=1e-6)


def test_a_cost_per_served_step_is_recovered_beside_the_cost_per_row():
    """Chat's served one-row steps (2026-12-07) cost 4.1 ms a token against 3.6 ms priced
    by a cost per row fitted on large batches: serving also costs per step. Windows at
    several load levels give both back, and a one-row step is priced at its cost."""
    from tuner.sim.live_profile import priced_share, serving_term
    from tuner.sim.profile import SERVED_STEP

    served = _served_series(random.Random(9), windows=40, serving=3e-4, per_step=8e-4,
                            levels=True)
    profile, info = serving_term(_calibrated(), served)
    assert info["seconds_per_step"] == pytest.approx(8e-4, rel=1e-4)
    assert info["seconds_per_row"] == pytest.approx(3e-4, rel=1e-4)
    assert profile.fit.coefficients[SERVED_STEP] == pytest.approx(8e-4, rel=1e-4)
    one = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=1, decode_context=300)
    assert profile.step_seconds(one) == pytest.approx(_seconds(one) + 3e-4 + 8e-4)
    # a step that delivered no row is not charged for serving
    idle = StepShape(prefill_tokens=0, prefill_seqs=0, decode_seqs=0)
    assert profile.step_seconds(idle) == pytest.approx(max(_seconds(idle), 1e-6))
    # priced over a window's summed counters: once per step
    assert priced_share(profile.fit, served[:2]) == pytest.approx(1.0, rel=1e-6)


def test_the_counted_squares_recover_a_growing_cost_where_batch_sizes_vary():
    """Inside a window of real traffic a step delivers 1-49 rows, not one level: the
    square of the window's mean rows under-states its steps' mean square, so without the
    engine's count the squared coefficient comes back wrong; with it, exact."""
    from tuner.sim.live_profile import priced_share, serving_term

    served = _served_series(random.Random(8), windows=40, serving=1e-3, squared=2e-5,
                            counted=True)
    profile, info = serving_term(_calibrated(), served)
    assert info["seconds_per_row"] == pytest.approx(1e-3, rel=1e-4)
    assert info["seconds_per_row_squared"] == pytest.approx(2e-5, rel=1e-4)
    assert info["error_after"] < 1e-6
    assert priced_share(profile.fit, served) == pytest.approx(1.0, rel=1e-6)
    # the same steps from an engine that did not count the squares: mis-fitted
    old, info = serving_term(_calibrated(), _served_series(
        random.Random(8), windows=40, serving=1e-3, squared=2e-5))
    assert abs(info["seconds_per_row_squared"] / 2e-5 - 1) > 0.05 or \
        abs(info["seconds_per_row"] / 1e-3 - 1) > 0.05
    assert info["error_after"] > 1e-4


def test_served_steps_cheaper_than_the_calibration_add_nothing_and_few_windows_are_an_error():
    from tuner.sim.live_profile import serving_term
    from tuner.sim.profile import SERVED_ROWS

    dearer = {k: 1.5 * v for k, v in TRUE.items()}
    profile, info = serving_term(_calibrated(dearer), _served_series(random.Random(5),
                                                                      serving=0.0))
    assert info["seconds_per_row"] == 0.0 and profile.fit.coefficients[SERVED_ROWS] == 0.0
    with pytest.raises(ValueError, match=r"1 busy window\(s\).*serving term needs at least 2"):
        serving_term(_calibrated(), _served_series(random.Random(6), windows=1))
