"""The statistics of the decision, on simulated measurements (pure Python, seeded, fast):
an engine with a known goodput per setting and known noise."""
import math
import random

import pytest

from tuner.search.stats import decide, paired_gain, t975


def simulate_rounds(rng, truths, rounds, *, sigma, round_sigma=0.1):
    """Per-round goodputs for arms with true goodputs `truths`: multiplicative log-normal
    noise per measurement (sigma) and per round, shared by the arms (machine load)."""
    out = [[] for _ in truths]
    for _ in range(rounds):
        shared = rng.gauss(0, round_sigma)
        for i, truth in enumerate(truths):
            out[i].append(truth * math.exp(shared + rng.gauss(0, sigma)))
    return out


@pytest.mark.parametrize("rounds, sigma, true_gain", [(3, 0.15, 1.3), (5, 0.1, 1.0),
                                                      (8, 0.3, 0.8)])
def test_interval_covers_the_true_gain_95_percent_of_the_time(rounds, sigma, true_gain):
    rng = random.Random(rounds)
    runs, covered = 2000, 0
    for _ in range(runs):
        base, cand = simulate_rounds(rng, [10.0, 10.0 * true_gain], rounds, sigma=sigma)
        gain = paired_gain(base, cand, floor=0.01)
        covered += gain.low <= true_gain <= gain.high
    # binomial sd at 95 % over 2000 runs is 0.49 %: 0.935..0.965 is about +-3 sd
    assert 0.935 <= covered / runs <= 0.965


@pytest.mark.parametrize("rounds, power", [(3, 0.8), (5, 0.97)])
def test_a_truly_better_setting_is_chosen_with_its_interval_above_1(rounds, power):
    # 1.5x better, 8 % noise per measurement: 3 rounds (t with 2 df) find it ~85 % of
    # the time, 5 rounds almost always; the worse candidate is never chosen
    rng = random.Random(1)
    wins = 0
    for _ in range(500):
        base, worse, better = simulate_rounds(rng, [10.0, 9.0, 15.0], rounds, sigma=0.08)
        gains = {"C1": paired_gain(base, worse, floor=0.01),
                 "C2": paired_gain(base, better, floor=0.01)}
        decision = decide(gains)
        wins += decision.winner == "C2" and gains["C2"].low > 1
    assert wins / 500 > power


def test_settings_better_only_by_noise_are_rarely_applied():
    # two candidates as good as the baseline: a winner is declared only when a lower bound
    # exceeds 1 by chance; at 2.5 % per one-sided bound, at most ~5 % for two
    rng = random.Random(2)
    applied = sum(decide({"C1": paired_gain(b, c1, floor=0.01),
                          "C2": paired_gain(b, c2, floor=0.01)}).winner is not None
                  for b, c1, c2 in (simulate_rounds(rng, [10.0] * 3, 3, sigma=0.15)
                                    for _ in range(2000)))
    assert applied / 2000 < 0.06


def test_decision_picks_the_highest_lower_bound_not_the_highest_mean():
    from tuner.search.stats import Gain
    decision = decide({"C1": Gain(1.8, 0.9, 3.6, 3), "C2": Gain(1.3, 1.1, 1.5, 3)})
    assert decision.winner == "C2" and "lower bound above 1" in decision.reason
    none = decide({"C1": Gain(1.8, 0.9, 3.6, 3), "C2": None})
    assert none.winner is None and none.reason.startswith("no significant gain over the baseline")
    assert decide({"C1": Gain(1.3, 1.1, 1.5, 3)}, min_gain=1.2).winner is None


def test_paired_gain_edges():
    assert paired_gain([2.0, 2.0], [4.0, 4.0], floor=0.1).ratio == pytest.approx(2.0)
    one = paired_gain([2.0], [3.0], floor=0.1)
    assert one.low == 0.0 and one.high == math.inf  # one round: no noise estimate
    zero = paired_gain([0.0, 0.0, 0.0], [1.0, 1.0, 1.0], floor=0.5)
    assert zero.ratio == pytest.approx(2.0)  # 0 req/s floored at half a request per window
    with pytest.raises(ValueError, match="same, non-zero number of rounds"):
        paired_gain([1.0, 2.0], [1.0], floor=0.1)
    assert t975(2) == pytest.approx(4.303) and t975(200) == pytest.approx(1.972, abs=2e-3)
    assert t975(31) == pytest.approx(2.040, abs=2e-3)
