"""benchmarks/bench_kv_offload.py, bench_kv_multiturn.py and bench_kv_eviction.py on a tiny
checkpoint: the open-loop
arrival schedule, the open loop keeping to it, and the options that can be given wrong.
Speed is not asserted (that is the benchmarks' job)."""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from benchmarks import bench_kv_eviction, bench_kv_multiturn, bench_kv_offload  # noqa: E402
from benchmarks.kv_bench_common import model_path, open_loop_schedule, quantile  # noqa: E402


def test_schedule_is_one_poisson_process_dealt_round_robin():
    arrivals = open_loop_schedule(conversations=5, turns=4000, rate=8.0, seed=3)
    merged = sorted(t for conv in arrivals for t in conv)
    # the k-th arrival overall is turn k // 5 of conversation k % 5
    assert all(arrivals[k % 5][k // 5] == merged[k] for k in range(len(merged)))
    gaps = [b - a for a, b in zip([0.0] + merged, merged)]
    assert all(g > 0 for g in gaps)
    assert statistics.fmean(gaps) == pytest.approx(1 / 8.0, rel=0.03)
    # exponential gaps: the standard deviation equals the mean (not evenly spaced)
    assert statistics.pstdev(gaps) == pytest.approx(1 / 8.0, rel=0.05)
    assert open_loop_schedule(5, 40, 8.0, seed=3) == [c[:40] for c in arrivals]
    assert open_loop_schedule(5, 40, 8.0, seed=4) != [c[:40] for c in arrivals]


@pytest.mark.parametrize("rate", [0.0, -1.0])
def test_schedule_refuses_a_rate_that_is_not_positive(rate):
    with pytest.raises(ValueError, match="rate must be > 0"):
        open_loop_schedule(2, 2, rate, seed=0)


def test_quantile_is_the_value_at_rank_floor_q_n():
    values = [5.0, 1.0, 4.0, 2.0, 3.0]
    assert [quantile(values, q) for q in (0.0, 0.5, 0.9, 1.0)] == [1.0, 3.0, 5.0, 5.0]
    assert quantile(list(range(10)), 0.5) == 5
    assert quantile(list(range(10)), 0.75) == 7  # floor, not rounding


def test_a_model_too_short_for_the_request_is_named_with_the_shortfall(tiny_checkpoints):
    path = tiny_checkpoints["llama"]
    positions = json.loads((Path(path) / "config.json").read_text())["max_position_embeddings"]
    assert model_path(path, positions) == path
    with pytest.raises(ValueError, match=f"max_position_embeddings={positions}; ask for at "
                                         "least 1 fewer tokens"):
        model_path(path, positions + 1)


@pytest.mark.parametrize("rate", [40.0, 4000.0])
def test_open_loop_sends_no_turn_before_it_is_due_or_before_its_answer(tiny_checkpoints, rate):
    from engine import LLMEngine

    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=4,
                                 num_gpu_blocks_override=64, dtype="float32", max_num_seqs=2)
    sent: dict[tuple[int, int], tuple[str, float]] = {}  # (conversation, turn): id, time
    done: dict[str, float] = {}
    add, step = engine.add_request, engine.step

    def add_request(request_id, ids, params):
        # a history opens with its conversation's first message, [11 + c, 12, 13]; each
        # turn adds a 3-token message and a 2-token answer
        sent[(ids[0] - 11, (len(ids) - 3) // 5)] = (request_id, time.perf_counter())
        return add(request_id, ids, params)

    def record_step():
        outs = step()
        for out in outs:
            if out.finished:
                done[out.request_id] = time.perf_counter()
        return outs

    engine.add_request, engine.step = add_request, record_step
    messages = [[[11 + c, 12, 13 + t] for t in range(3)] for c in range(3)]
    arrivals = open_loop_schedule(3, 3, rate=rate, seed=1)
    start = time.perf_counter()
    seconds, tokens, ttfts, history, late = bench_kv_multiturn._open_loop(
        engine, messages, arrivals, max_tokens=2)
    assert tokens == 18 and len(ttfts) == 9
    assert all(len(h) == 3 * 3 + 3 * 2 for h in history)  # every message and answer
    assert sorted(sent) == [(c, t) for c in range(3) for t in range(3)]
    counted_late = 0
    for (c, t), (request_id, when) in sent.items():
        assert when - start >= arrivals[c][t]  # never before it is due
        if t:
            answered = done[sent[(c, t - 1)][0]]
            assert answered <= when  # never before the previous answer
            counted_late += answered - start > arrivals[c][t]
    # (the two clocks differ by microseconds: a turn due between them may count either way)
    assert abs(late - counted_late) <= 1
    if rate > 1000:  # all 9 due within a few ms, before any answer: every later turn is late
        assert late == counted_late == 6
    assert seconds >= max(max(a) for a in arrivals)


def test_multiturn_open_loop_table(tiny_checkpoints, capsys):
    assert bench_kv_multiturn.main([
        "--models", tiny_checkpoints["llama"], "--conversations", "3", "--turns", "2",
        "--system-tokens", "8", "--user-tokens", "8", "--max-tokens", "2", "--block-size", "4",
        "--rounds", "1", "--loop", "open", "--load", "0.5", "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "open loop (rate 0.5 x tiers-off turns/s" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| /")]
    assert [r[2].strip() for r in rows] == ["off", "host"]
    assert [r[6].strip() for r in rows][0] == "1.00x"  # off against itself
    assert float(rows[0][10]) == float(rows[1][10]) > 0  # one arrival rate for both
    assert all(r[11].strip().endswith("%") for r in rows)  # late turns


@pytest.mark.parametrize("argv, message", [
    (["--loop", "open", "--load", "0"], "--load 0.0: give a fraction > 0"),
    (["--loop", "open", "--rate", "-2"], "--rate -2.0: give arrivals per second > 0"),
    (["--rounds", "0"], "--rounds 0: give at least 1"),
])
def test_multiturn_refuses_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_kv_multiturn.main(argv)
    assert message in capsys.readouterr().err


def test_tiers_table_for_a_subset_of_configurations(tiny_checkpoints, capsys, monkeypatch):
    lengths: list[int] = []
    run = bench_kv_offload._run

    def recording_run(engine, request_id, ids):
        lengths.append(len(ids))
        return run(engine, request_id, ids)

    monkeypatch.setattr(bench_kv_offload, "_run", recording_run)
    assert bench_kv_offload.main([
        "--models", tiny_checkpoints["llama"], "--prefix", "32", "--block-size", "4",
        "--rounds", "1", "--configs", "host,recompute", "--warmup-prefix", "8",
        "--threads", "1"]) == 0
    out = capsys.readouterr().out
    assert "1 rounds (+1 warm-up of 8 tokens)" in out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| /")]
    assert [r[2].strip() for r in rows] == ["host", "recompute"]
    assert int(rows[0][3]) == 32 and int(rows[1][3]) < 32  # tokens cached
    assert rows[1][5].strip() == "1.0x"
    tail = bench_kv_offload.TAIL
    # per configuration: first, filler, timed; the warm-up round on 8 tokens, then 32
    assert lengths == [8 + tail] * 6 + [32 + tail] * 6


@pytest.mark.parametrize("argv, message", [
    (["--configs", "host,disk"], "recompute among them"),
    (["--configs", "host,recompute,tape"], "(unknown: ['tape'])"),
    (["--configs", "host,host,recompute"], "at most once"),
    (["--prefix", "30", "--block-size", "4"], "--prefix 30: give a positive multiple"),
    (["--prefix", "32", "--warmup-prefix", "48"], "--warmup-prefix 48: give 0 to 32"),
])
def test_tiers_refuses_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_kv_offload.main(argv)
    assert message in capsys.readouterr().err


def test_eviction_loop_holds_a_turn_for_its_answer_and_sends_documents_fresh(tiny_checkpoints):
    from engine import LLMEngine

    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=4,
                                 num_gpu_blocks_override=64, dtype="float32", max_num_seqs=3)
    sent: list[list[int]] = []
    add = engine.add_request
    engine.add_request = lambda rid, ids, params: (sent.append(list(ids)), add(rid, ids, params))
    items = [("turn", 0, [11, 12]), ("doc", [21, 22, 23]), ("turn", 0, [13]), ("turn", 1, [14]),
             ("doc", [24, 25])]
    seconds, tokens, turns, docs, answers = bench_kv_eviction._serve(engine, items, 3, 2)
    assert tokens == 10 and len(turns) == 3 and len(docs) == 2
    # conversation 0's second turn is its first turn, that answer, then the new message
    assert sent[2] == [11, 12] + answers[0] + [13]
    assert sent[1] == [21, 22, 23] and sent[3] == [14] and sent[4] == [24, 25]
    assert all(len(a) == 2 for a in answers)


def test_eviction_table_has_off_lru_and_arc_on_the_same_host_tier(tiny_checkpoints, capsys):
    assert bench_kv_eviction.main([
        "--models", tiny_checkpoints["llama"], "--conversations", "3", "--turns", "3",
        "--system-tokens", "8", "--user-tokens", "8", "--doc-tokens", "24", "--max-tokens", "2",
        "--block-size", "4", "--rounds", "1", "--threads", "1"]) == 0
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| /")]
    assert [r[3].strip() for r in rows] == ["off", "lru", "arc"]
    assert rows[0][8].strip() == "1.00x" and int(rows[0][11]) == 0
    # the conversations' working set: 3 x ceil((8 + 3 x 10) / 4) blocks; the host tier 3/4
    assert {int(r[2]) for r in rows} == {int(3 * 10 * 0.75)}
    assert all(int(r[11]) > 0 for r in rows[1:]), "both policies should load from the host"


@pytest.mark.parametrize("argv, message", [
    (["--rounds", "0"], "--rounds 0: give at least 1"),
    (["--host-share", "0"], "--host-share 0.0: give a share > 0"),
])
def test_eviction_refuses_bad_options(argv, message, capsys):
    with pytest.raises(SystemExit):
        bench_kv_eviction.main(argv)
    assert message in capsys.readouterr().err
