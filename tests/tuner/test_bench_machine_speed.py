"""benchmarks/machine_speed.py: the machine's speed against a profile, and the fidelity
bench's errors read at the pilot's speed."""
from __future__ import annotations

import re

import pytest

from benchmarks import machine_speed
from benchmarks.sim_fidelity_grids import DEFAULTS, GRID
from engine.config import EngineConfig


class PricedAt:
    """A profile whose every step costs `seconds`, and which keeps the shapes it priced."""

    def __init__(self, seconds: float) -> None:
        self.seconds, self.priced = seconds, []

    def step_seconds(self, shape) -> float:
        self.priced.append(shape)
        return self.seconds


def test_the_index_times_the_same_phases_every_pass_against_the_profile():
    profile = PricedAt(1e-3)
    speed = machine_speed.SpeedIndex(profile)
    profile.priced.clear()   # the warm pass at construction is not measured
    value = speed.one_pass()
    steps = list(profile.priced)
    # every step of the pass priced, and it is the engine's own timed steps
    assert [s for s, _ in speed.timed] == steps
    assert value == pytest.approx(sum(t for _, t in speed.timed) / (1e-3 * len(steps)))
    # the phases as written: each prompt prefilled once, each output token decoded
    prompts = sum(n * p for n, p, _ in machine_speed.PHASES)
    decodes = sum(n * (out - 1) for n, _, out in machine_speed.PHASES)
    assert sum(s.prefill_tokens for s in steps) == prompts
    assert sum(s.decode_seqs for s in steps) == decodes
    assert max(s.decode_seqs for s in steps) == 16   # the decode phase runs batched
    # a second pass runs the same steps (the same prompts, from an empty engine)
    profile.priced.clear()
    speed.measure(repeats=2)
    again = profile.priced
    assert [s.as_dict() for s in again] == [s.as_dict() for s in steps] * 2
    speed.engine.check_no_leaks()


def test_a_capacity_is_read_at_the_reference_speed():
    # measured while steps took 20 % longer than at the reference: read 1.2x higher
    assert machine_speed.at_speed(10.0, 1.2, 1.0) == pytest.approx(12.0)
    assert machine_speed.at_speed(10.0, 0.9, 1.08) == pytest.approx(10.0 * 0.9 / 1.08)
    with pytest.raises(ValueError, match="> 0"):
        machine_speed.at_speed(10.0, 0.0, 1.0)
    with pytest.raises(ValueError, match="no steps"):
        machine_speed.index([], lambda shape: 1.0)


def test_the_defaults_row_is_the_engines_defaults():
    config = EngineConfig()
    assert DEFAULTS in GRID
    assert {k: getattr(config, k) for k in DEFAULTS} == DEFAULTS


def test_the_report_reads_real_capacities_at_the_pilots_speed():
    # the simulator right about every setting at the pilot's speed; the real runs made
    # at other speeds, one of them the defaults again
    truth = [10.0, 20.0, 30.0, 40.0]
    speeds = [1.0, 1.25, 0.8, 1.1]
    settings = [{"max_num_seqs": 1}, {"max_num_seqs": 2}, DEFAULTS, {"max_num_seqs": 8}]
    rows = [{"settings": s, "real_cap": t / (v / 1.0), "speed": v, "sim_cap": t}
            for s, t, v in zip(settings, truth, speeds)]
    text = machine_speed.speed_report(rows, {"speed": 1.0, "pilot_capacity": 30.0}, ["sim"])
    assert "capacity error 0.0%, Kendall tau 1.00" in text
    line = next(x for x in text.splitlines() if "the defaults" in x)
    grid, fixed = re.findall(r"\(([\d.]+)x\)", line)
    assert float(grid) == pytest.approx(30.0 / 0.8 / 30.0, abs=0.01)   # 1.25x raw
    assert float(fixed) == pytest.approx(1.0)
    # against the raw capacities the same simulator is off
    unfixed = [{**r, "speed": 1.0} for r in rows]
    assert "capacity error 0.0%" not in machine_speed.speed_report(
        unfixed, {"speed": 1.0}, ["sim"])
