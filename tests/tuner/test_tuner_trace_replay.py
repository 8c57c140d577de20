"""A trace with two prefix groups, replayed against a real engine (tiny model, one thread)
that writes its --request-log: the sends follow the trace's arrival times, the engine's
prefix-cache hits show the sharing, and `python -m tuner trace` turns the engine's log
back into the same trace (lengths, groups, shared prefix, arrival offsets)."""
import json
import subprocess
import sys

import httpx
import pytest

from loadtests.workloads.trace import TraceRequest, read_trace, write_trace
from tuner.measure import server_metrics as metrics
from tuner.measure.engine_process import EngineProcess
from tuner.measure.loadgen import LoadSpec, run_load
from tuner.measure.scoring import load_samples

pytestmark = pytest.mark.timeout(240)
SHARED, PROMPT, OUTPUT = 64, 96, 3


def _trace():
    # groups a and b alternate every 0.35 s; a group's requests are 0.7 s apart, so each
    # finds its predecessor's blocks cached; two ungrouped requests share nothing
    out = [TraceRequest(timestamp=round(0.35 * i, 2), prompt_tokens=PROMPT, output_tokens=OUTPUT,
                        prefix_group="ab"[i % 2], prefix_tokens=SHARED) for i in range(8)]
    out += [TraceRequest(timestamp=3.0, prompt_tokens=PROMPT, output_tokens=OUTPUT),
            TraceRequest(timestamp=3.2, prompt_tokens=PROMPT, output_tokens=OUTPUT)]
    return out


def test_trace_replay_timing_sharing_and_request_log_round_trip(tmp_path):
    trace_path, log = tmp_path / "trace.jsonl", tmp_path / "requests.jsonl"
    write_trace(trace_path, _trace())
    engine = EngineProcess(flags=["--cpu-threads", "1", "--max-model-len", "256",
                                  "--request-log", str(log)], log_path=tmp_path / "engine.log")
    engine.start(timeout=180)
    try:
        before = metrics.scrape(engine.url)
        run_load(LoadSpec(workload="trace", trace=str(trace_path), duration=6, users=1,
                          arrival="open"), url=engine.url, workdir=tmp_path / "load")
        after = metrics.scrape(engine.url)
        one = httpx.post(engine.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1})
        assert one.status_code == 200
    finally:
        engine.stop()
    samples = load_samples(tmp_path / "load" / "samples.jsonl")
    assert len(samples.records) == 10 and all(r["ok"] for r in samples.records), samples.records
    assert all(r["prompt_tokens"] == PROMPT and r["output_tokens"] == OUTPUT
               for r in samples.records)
    starts = sorted(r["start"] for r in samples.records)
    for sent, planned in zip(starts, [r.timestamp for r in _trace()]):
        assert abs((sent - starts[0]) - planned) < 0.15, (sent - starts[0], planned)

    hits = metrics.counter_delta(before, after, "vllm:prefix_cache_hits")
    # 6 requests (3 per group) find their group's 64 shared tokens cached; nothing else is
    # shared (the tail of each prompt and the two ungrouped prompts are their own)
    assert 6 * SHARED * 0.75 <= hits <= 6 * SHARED + 16, hits

    lines = [json.loads(line) for line in log.read_text().splitlines()]
    assert len(lines) == 11  # the 10 replayed + the one sent after
    assert all("prompt" not in record and "text" not in record for record in lines)
    out = tmp_path / "back.jsonl"
    cli = subprocess.run([sys.executable, "-m", "tuner", "trace", str(log), "-o", str(out)],
                         capture_output=True, text=True, timeout=60)
    assert cli.returncode == 0, cli.stderr
    assert "inferred:" in cli.stdout and "assumed:" in cli.stdout
    back = read_trace(out)[:10]
    assert [(r.prompt_tokens, r.output_tokens) for r in back] == [(PROMPT, OUTPUT)] * 10
    groups = [r.prefix_group for r in back]
    assert groups[:8] == ["g0", "g1"] * 4 and groups[8:] == [None, None]
    assert {r.prefix_tokens for r in back[:8]} == {SHARED}
    for got, planned in zip(back, _trace()):
        assert abs(got.timestamp - planned.timestamp) < 0.15


def test_tuner_trace_refuses_a_log_that_is_not_the_engines(tmp_path):
    log = tmp_path / "bad.jsonl"
    log.write_text('{"ts": 1.0, "prompt_tokens": 5, "output_tokens": 2}\n{"ts": "x"}\n')
    cli = subprocess.run([sys.executable, "-m", "tuner", "trace", str(log), "-o",
                          str(tmp_path / "t.jsonl")], capture_output=True, text=True, timeout=60)
    assert cli.returncode == 2 and "line 2" in cli.stderr and "--request-log" in cli.stderr
