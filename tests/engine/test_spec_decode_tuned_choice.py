"""bench_spec_decode.py --tuned (benchmarks/spec_decode_tuned.py): the tuner's range and
mapping for num_speculative_tokens, its decision rule on calibration rounds, and the
instrumentation columns."""
from __future__ import annotations

from benchmarks import spec_decode_tuned as tuned


def test_the_candidates_are_the_tuners_range_and_mapping():
    assert tuned.candidates() == [0, 2, 4, 8, "suffix:8", "suffix:16"]
    assert tuned.spec_config(0, 2, 4) is None
    assert tuned.spec_config(4, 2, 4) == {"method": "ngram", "num_speculative_tokens": 4,
                                          "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    # suffix decoding has no lookup bounds: they would fail its config's check
    assert tuned.spec_config("suffix:8", 2, 4) == {"method": "suffix",
                                                   "num_speculative_tokens": 8}


def _serve(rates: dict[int, list[float]], calls: list):
    def serve(k, r):
        calls.append((k, r))
        return rates[k][r]
    return serve


def test_a_consistent_gain_is_chosen_and_the_order_alternates():
    calls = []
    rates = {0: [10, 11, 9], 2: [14, 15.5, 12.4], 4: [20, 22.5, 17.9], 8: [19, 30, 12]}
    k, why = tuned.choose(_serve(rates, calls), [0, 2, 4, 8], 3)
    assert k == 4, why  # k=8's mean is close but its rounds disagree: lower bound below
    assert calls[:4] == [(0, 0), (2, 0), (4, 0), (8, 0)]
    assert calls[4:8] == [(8, 1), (4, 1), (2, 1), (0, 1)]


def test_a_suffix_candidate_can_be_chosen_and_is_returned_as_given():
    rates = {0: [10, 11, 9], 4: [11, 11, 9], "suffix:8": [20, 22.5, 17.9]}
    k, why = tuned.choose(_serve(rates, []), [0, 4, "suffix:8"], 3)
    assert k == "suffix:8", why


def test_no_significant_gain_keeps_speculation_off():
    rates = {0: [10, 12], 2: [10.5, 11.8], 4: [9, 13], 8: [7, 8]}
    k, why = tuned.choose(_serve(rates, []), [0, 2, 4, 8], 2)
    assert k == 0 and "no significant gain" in why


def test_the_columns_count_decode_rows_from_the_counters():
    # 2 requests, 12 tokens out: 2 from the prefills, 10 from decode rows; 3 drafts accepted
    # -> 7 decode rows, 2 of them with drafts (4 draft tokens)
    acc, pos, drafted, per_step = tuned._spec_columns((2, 4, 3, [2, 1]), 12, 2)
    assert (acc, pos, drafted, per_step) == ("75", "100 / 50", "29", "1.43")
    assert tuned._spec_columns((0, 0, 0, []), 12, 2) == ("–", "–", "0", "1.00")


def test_one_calibration_round_cannot_choose():
    rates = {0: [10], 2: [30], 4: [40], 8: [50]}  # no spread to bound the gain with
    assert tuned.choose(_serve(rates, []), [0, 2, 4, 8], 1)[0] == 0
