"""`python -m engine serve --speculative-config ...`: the flag reaches the engine, the
completions equal a server's without it, vLLM's spec_decode metrics count, and a bad config
stops the server with a message naming the field."""
from __future__ import annotations

import json
import subprocess
import sys

import httpx
import pytest

from engine import LLM, SamplingParams
from engine.entrypoints.metrics import ServerMetrics
from tests.server.conftest import REPO, ServerProcess, scrape

pytestmark = pytest.mark.xdist_group("server")

SPEC = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}
ARGS = ["--max-model-len", "256", "--num-gpu-blocks-override", "128", "--seed", "0"]
PROMPT = "cache block page cache block page cache block page cache block"


def test_the_served_engine_speculates_and_counts_it():
    """Served with drafts, the greedy completion is the one the engine gives without them."""
    expected = LLM(max_model_len=256, num_gpu_blocks_override=128, seed=0).generate(
        [PROMPT], SamplingParams(temperature=0, max_tokens=24))[0].outputs[0].text
    server = ServerProcess(*ARGS, "--speculative-config", json.dumps(SPEC))
    try:
        model = httpx.get(server.base_url + "/v1/models").json()["data"][0]["id"]
        body = {"model": model, "prompt": PROMPT, "max_tokens": 24, "temperature": 0}
        r = httpx.post(server.base_url + "/v1/completions", json=body, timeout=60)
        assert r.status_code == 200, r.text
        spec = scrape(server.base_url)
    finally:
        server.stop()
    assert r.json()["choices"][0]["text"] == expected
    assert spec["vllm:spec_decode_num_drafts_total"] > 0
    drafts = spec["vllm:spec_decode_num_draft_tokens_total"]
    accepted = spec["vllm:spec_decode_num_accepted_tokens_total"]
    assert 0 < accepted <= drafts
    per_pos = [spec[f"vllm:spec_decode_num_accepted_tokens_per_pos_total{{position={j}}}"]
               for j in range(3)]
    assert sum(per_pos) == accepted and per_pos == sorted(per_pos, reverse=True)


def test_metrics_count_only_what_each_step_added():
    """Counters follow the engine's cumulative totals (the baseline before serving is not
    counted), per position."""
    llm = LLM(num_gpu_blocks_override=128, max_model_len=256,
              speculative_config={**SPEC, "num_speculative_tokens": 2})
    metrics = ServerMetrics(model_name="m", max_model_len=256)
    metrics.observe_stats(llm.llm_engine.get_stats())
    llm.generate([PROMPT] * 2, SamplingParams(temperature=0, max_tokens=24))
    stats = llm.llm_engine.get_stats()
    metrics.observe_stats(stats)
    metrics.observe_stats(stats)  # nothing new
    sample = metrics.registry.get_sample_value
    lbl = {"model_name": "m"}
    assert sample("vllm:spec_decode_num_drafts_total", lbl) == stats.spec_num_drafts > 0
    assert sample("vllm:spec_decode_num_draft_tokens_total", lbl) == stats.spec_num_draft_tokens
    assert sample("vllm:spec_decode_num_accepted_tokens_total", lbl) == \
        stats.spec_num_accepted_tokens > 0
    for j in range(2):
        assert sample("vllm:spec_decode_num_accepted_tokens_per_pos_total",
                      {**lbl, "position": str(j)}) == stats.spec_num_accepted_tokens_per_pos[j]


@pytest.mark.parametrize("config, message", [
    ('{"method": "ngram", "num_speculative_tokens": 0}',
     "num_speculative_tokens must be a whole number in 1..16, got 0"),
    ('{"method": "medusa", "num_speculative_tokens": 2}',
     "method must be one of ngram, suffix, got 'medusa'"),
    ('{"num_speculative_tokens": 2, "prompt_lookup_min": 3, "prompt_lookup_max": 2}',
     "prompt_lookup_min (3) must be <= prompt_lookup_max (2)"),
    ('{"num_speculative_tokens": 2', "must be a JSON object with keys method, "),
])
def test_the_flag_refuses_a_bad_config_naming_the_field(config, message, capsys):
    from engine.entrypoints.cli import build_parser

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--speculative-config", config])
    err = capsys.readouterr().err
    assert f"argument --speculative-config: {message}" in err, err


def test_a_bad_config_stops_the_server_before_the_model_loads():
    out = subprocess.run([sys.executable, "-m", "engine", "serve", "--port", "0",
                          "--speculative-config", '{"num_speculative_tokens": -1}'],
                         cwd=REPO, capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr[-2000:]
    assert ("argument --speculative-config: num_speculative_tokens must be a whole number "
            "in 1..16, got -1") in out.stderr
