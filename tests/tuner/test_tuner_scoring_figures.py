"""Every figure score() reports, pinned on small hand-computed sample sets; the edges of
quantile(), meets_slo() and load_samples() that the broader tests in test_tuner_scoring.py
leave open (found by scripts/mutation.py)."""
import json

import numpy as np
import pytest

from tuner.measure.scoring import Samples, load_samples, meets_slo, quantile, score

CHAT_SLO = {"chat": {"ttft": 0.4}}
RECORDS = [
    {"kind": "chat", "ok": True, "ttft": 0.2, "itl": [0.1, 0.3], "e2e": 1.0, "output_tokens": 3},
    # a one-token reply: no inter-token gaps, and no token count written
    {"kind": "chat", "ok": True, "ttft": 0.4, "itl": None, "e2e": 2.0},
    # a kind without an SLO entry: success is enough; no first-token time recorded
    {"kind": "batch", "ok": True, "ttft": None, "itl": [0.5], "e2e": 3.0, "output_tokens": 2},
    {"kind": "chat", "ok": False, "error": "HTTP 500", "itl": []},
]


def test_score_reports_every_figure_with_linear_percentiles():
    figures = score(Samples(list(RECORDS), start=10.0, stop=12.0), CHAT_SLO)
    assert figures == pytest.approx({
        "window_s": 2.0, "requests": 4.0, "completed": 3.0, "failed": 1.0,
        "slo_met": 3.0,                       # the chat reply at exactly its TTFT limit counts
        "goodput": 1.5, "throughput": 1.5,
        "output_tokens_per_s": 2.5,           # (3 + 0 + 2) / 2 s
        "slo_attainment": 0.75,
        # only the replies that have a first-token time
        "ttft_p50": 0.3, "ttft_p90": 0.38, "ttft_p99": 0.398,
        "e2e_p50": 2.0, "e2e_p90": 2.8, "e2e_p99": 2.98,
        # per-request mean gap: 0.2, 0 (one token), 0.5
        "tpot_p50": 0.2, "tpot_p90": 0.44, "tpot_p99": 0.494,
        "itl_p50": 0.3, "itl_p90": 0.46, "itl_p99": 0.496,
    })


def test_an_empty_run_has_zero_attainment_and_no_percentiles():
    assert score(Samples([], start=0.0, stop=4.0), CHAT_SLO) == {
        "window_s": 4.0, "requests": 0.0, "completed": 0.0, "failed": 0.0, "slo_met": 0.0,
        "goodput": 0.0, "throughput": 0.0, "output_tokens_per_s": 0.0, "slo_attainment": 0.0}


def test_a_sub_second_window_is_kept_as_it_is():
    figures = score(Samples(RECORDS[:1], start=3.0, stop=3.5), CHAT_SLO)
    assert (figures["window_s"], figures["goodput"]) == (0.5, 2.0)
    assert score(Samples(RECORDS[:1]), CHAT_SLO, window=0.25)["throughput"] == 4.0


@pytest.mark.parametrize("start, stop", [(None, 5.0), (5.0, None), (None, None)])
def test_scoring_without_both_markers_asks_for_a_window(start, stop):
    with pytest.raises(ValueError) as error:
        score(Samples(RECORDS[:1], start=start, stop=stop), CHAT_SLO)
    assert str(error.value) == "samples have no start/stop markers; pass window="


def test_a_threshold_is_met_at_exactly_its_limit():
    record = {"ok": True, "ttft": 0.5, "e2e": 2.0, "itl": [0.1, 0.1]}
    assert meets_slo(record, {"ttft": 0.5, "e2e": 2.0, "tpot": 0.1})
    assert not meets_slo(record, {"e2e": 1.999})


@pytest.mark.parametrize("values", [[1.0, 2.0, 4.0], [1.0, 2.0, 4.0, 8.0],
                                    [3.0, 1.0, 2.0, 9.0, 5.0]])
@pytest.mark.parametrize("q", [0.0, 0.3, 0.5, 0.75, 0.9, 0.99, 1.0])
def test_quantile_interpolates_between_neighbours_like_numpy(values, q):
    # Fractional positions: with 101 values (test_tuner_scoring.py) p50/p90/p99 land on
    # exact ranks and never interpolate.
    assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))


def test_load_samples_keeps_the_first_start_and_skips_only_unparsable_lines(tmp_path):
    record = {"kind": "chat", "ok": True, "ttft": 0.1, "itl": [], "e2e": 0.2}
    path = tmp_path / "samples.jsonl"
    path.write_text("\n".join([
        json.dumps({"event": "start", "t": 1.0}),
        '{"kind": "chat", "ok": tr',          # a writer killed mid-line, then resumed
        json.dumps({"event": "start", "t": 2.0}),
        json.dumps(record),
        json.dumps({"event": "stop", "t": 9.0})]))
    samples = load_samples(path)
    assert (samples.start, samples.stop, samples.records) == (1.0, 9.0, [record])
