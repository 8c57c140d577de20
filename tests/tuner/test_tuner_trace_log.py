"""Request-log hashing and the log -> trace conversion, without an engine."""
import subprocess
import sys
import time

import pytest

from engine.entrypoints.request_log import RequestLog, prefix_hashes
from tuner.sources.log_to_trace import log_to_trace, read_request_log


def test_prefix_hashes_agree_exactly_as_far_as_the_prompts_do():
    a = list(range(100))
    b = list(range(50)) + [999] * 50
    ha, hb = prefix_hashes(a, 16), prefix_hashes(b, 16)
    assert len(ha) == len(hb) == 3  # depths 16, 32, 64 fit in 100 tokens
    assert ha[:2] == hb[:2] and ha[2] != hb[2]  # 50 shared tokens: 16 and 32 agree, 64 not
    assert prefix_hashes(list(range(10)), 16) == []


def test_groups_and_shared_depths_from_a_written_log(tmp_path):
    log = RequestLog(tmp_path / "r.jsonl", prefix_tokens=8)
    system = list(range(40))  # a 40-token shared prefix: depths 8, 16, 32 agree, 64 not
    for i in range(3):
        log.record(arrival_monotonic=time.monotonic(),
                   prompt_token_ids=system + [1000 + i] * 60, output_tokens=5,
                   finish_reason="length")
    log.record(arrival_monotonic=time.monotonic(),
               prompt_token_ids=[7] * 30, output_tokens=0, finish_reason="abort")
    log.close()
    trace = log_to_trace(read_request_log([tmp_path / "r.jsonl"]))
    assert [r.prefix_group for r in trace] == ["g0", "g0", "g0", None]
    assert [r.prefix_tokens for r in trace[:3]] == [32] * 3
    assert trace[3].output_tokens == 1 and trace[0].timestamp == 0.0
    with pytest.raises(ValueError, match="--min-group"):
        log_to_trace(read_request_log([tmp_path / "r.jsonl"]), min_group=1)


def test_engine_refuses_a_request_log_in_a_missing_folder(tmp_path):
    result = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0",
                             "--request-log", str(tmp_path / "nope" / "r.jsonl")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode != 0 and "--request-log" in result.stderr
