"""Goodput and client-side quantiles from hand-built sample sets."""
import json

import numpy as np
import pytest

from tuner.measure.scoring import Samples, load_samples, meets_slo, quantile, score, tpot

SLOS = {"chat": {"ttft": 1.0, "tpot": 0.1}, "summarize": {"e2e": 5.0}}


def _rec(kind, ok=True, ttft=0.5, itl=(0.05, 0.05), e2e=1.0, tokens=3):
    return {"kind": kind, "ok": ok, "ttft": ttft if ok else None, "itl": list(itl),
            "e2e": e2e if ok else None, "output_tokens": tokens}


def test_meets_slo_checks_every_threshold_of_the_kind():
    assert meets_slo(_rec("chat"), SLOS["chat"])
    assert not meets_slo(_rec("chat", ttft=1.2), SLOS["chat"])
    assert not meets_slo(_rec("chat", itl=(0.05, 0.2)), SLOS["chat"])  # TPOT 0.125
    assert meets_slo(_rec("chat", itl=(0.02, 0.17)), SLOS["chat"])     # TPOT 0.095: a mean
    assert not meets_slo(_rec("chat", ok=False), SLOS["chat"])
    assert meets_slo(_rec("summarize", ttft=9.0, e2e=4.9), SLOS["summarize"])
    assert tpot(_rec("chat", itl=())) == 0.0


def test_tpot_is_per_token_when_a_chunk_carries_a_steps_drafted_tokens():
    """With speculation one streamed chunk carries every token a step accepted: the gaps
    are per step. TPOT is per output token after the first (DistServe's), as the simulator
    and a reply of one token per chunk both read it."""
    # 7 tokens in 3 chunks: the first token, then 3 + 3 (two steps of accepted drafts)
    chunked = _rec("chat", itl=(0.15, 0.15), tokens=7)
    assert tpot(chunked) == pytest.approx(0.05)
    assert meets_slo(chunked, {"tpot": 0.1})          # the mean gap (0.15) would fail it
    assert not meets_slo(_rec("chat", itl=(0.35, 0.35), tokens=7), {"tpot": 0.1})  # 0.117
    # one token per chunk: the mean gap, as before
    assert tpot(_rec("chat", itl=(0.05, 0.2), tokens=3)) == pytest.approx(0.125)
    # no token count (a server without usage), or one below the chunks: the chunks count
    assert tpot(_rec("chat", itl=(0.1, 0.3), tokens=0)) == pytest.approx(0.2)
    assert tpot(_rec("chat", itl=(0.1, 0.3), tokens=2)) == pytest.approx(0.2)
    # batched with rows that stream one token per chunk: each request by its own count
    figures = score(Samples([chunked, _rec("chat", itl=(0.05, 0.05), tokens=3),
                             _rec("chat", itl=(0.3,), tokens=2)], start=0.0, stop=1.0),
                    {"chat": {"tpot": 0.1}})
    assert figures["slo_met"] == 2
    assert figures["tpot_p50"] == pytest.approx(0.05)


def test_goodput_counts_only_requests_meeting_their_own_kinds_slos():
    records = [_rec("chat"), _rec("chat", ttft=2.0), _rec("summarize", e2e=6.0),
               _rec("summarize", e2e=4.0), _rec("chat", ok=False),
               {"kind": "chat", "ok": False, "error": "unfinished at end of run", "itl": []}]
    figures = score(Samples(records, start=100.0, stop=110.0), SLOS)
    assert figures["window_s"] == 10.0
    assert figures["slo_met"] == 2
    assert figures["goodput"] == pytest.approx(0.2)
    assert figures["throughput"] == pytest.approx(0.4)   # 4 completed
    assert figures["slo_attainment"] == pytest.approx(2 / 6)
    assert figures["output_tokens_per_s"] == pytest.approx(1.2)


def test_in_progress_scoring_uses_now_and_markers_are_required():
    samples = Samples([_rec("chat")], start=100.0)
    assert score(samples, SLOS, now=104.0)["goodput"] == pytest.approx(0.25)
    with pytest.raises(ValueError):
        score(Samples([_rec("chat")]), SLOS)


def test_quantiles_match_numpy_linear():
    rng = np.random.default_rng(0)
    values = list(rng.exponential(size=101))
    for q in (0.5, 0.9, 0.99):
        assert quantile(values, q) == pytest.approx(float(np.quantile(values, q)))
    assert quantile([], 0.5) is None


def test_load_samples_reads_markers_and_skips_a_torn_last_line(tmp_path):
    path = tmp_path / "samples.jsonl"
    lines = [json.dumps({"event": "start", "t": 5.0}), json.dumps(_rec("chat")),
             json.dumps({"event": "stop", "t": 7.0}), '{"kind": "chat", "ok": tr']
    path.write_text("\n".join(lines))
    samples = load_samples(path)
    assert (samples.start, samples.stop, len(samples.records)) == (5.0, 7.0, 1)
    assert load_samples(tmp_path / "missing.jsonl").records == []
