"""The simulator runs the engine's own scheduler: the same request stream through the
real engine (its model runner on a virtual clock at a fixed step time) and through the
profiled runner gives the same schedule; the capacity search on it finds the knee of a
system whose capacity is known; bad input is refused by name."""
from __future__ import annotations

import pytest
import torch

from engine.config import EngineConfig
from engine.llm_engine import LLMEngine
from loadtests.workloads.trace import TraceRequest
from tuner.sim.engine import ProfiledRunner, VirtualClock, sim_engine
from tuner.sim.profile import Fit, Identity, Memory, Profile
from tuner.sim.simulate import sim_capacity, simulate
from tuner.sim.stream import TraceStream

STEP = 0.05


def _profile(coefficients=None, form="tokens") -> Profile:
    return Profile(Identity("builtin://default", "f" * 64, "cpu", "2.13.0", 1),
                   Fit(form, coefficients or {"intercept": STEP, "num_tokens": 0.0}, 0.0),
                   Memory(0.0, 1.3e7, 4096, 0.0, 2e4, 2048, 609), 100)


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


def _trace() -> list[TraceRequest]:
    """Two tenants' system prompts (prefix hits), lengths that overflow a small pool
    (preemptions), arrivals faster than the engine drains them."""
    out = []
    for i in range(14):
        out.append(TraceRequest(timestamp=0.08 * i, prompt_tokens=60 + 9 * (i % 5),
                                output_tokens=12 + 4 * (i % 4), prefix_group=f"g{i % 2}",
                                prefix_tokens=48))
    return out


SETTINGS = dict(block_size=16, max_num_seqs=4, max_num_batched_tokens=64, max_model_len=256,
                num_gpu_blocks_override=16, enable_prefix_caching=True, cpu_threads=1)


def _run(engine_and_clock, hf_config):
    return simulate(_profile(), SETTINGS, TraceStream(_trace(), max_model_len=256),
                    duration=30.0, slos={}, hf_config=hf_config, keep_schedule=True,
                    engine=engine_and_clock)


def test_same_stream_same_schedule_as_the_real_engine(hf_config):
    clock = VirtualClock()
    real = LLMEngine(EngineConfig(**SETTINGS), clock=clock)
    execute = real.runner.execute

    def fixed_step(batch, prompt_logits=None):   # the real model, a fixed step time
        clock.now += STEP
        return execute(batch, prompt_logits)
    real.runner.execute = fixed_step
    measured = _run((real, clock), hf_config)
    simulated = _run(None, hf_config)
    assert measured.schedule == simulated.schedule
    for name in ("server_preemptions", "prefix_cache_hit_rate", "evictions", "steps",
                 "completed", "ttft_p50", "e2e_p90"):
        assert measured.figures[name] == pytest.approx(simulated.figures[name]), name
    # the stream exercised what the comparison is about
    assert simulated.figures["server_preemptions"] > 0
    assert simulated.figures["prefix_cache_hit_rate"] > 0.2
    assert simulated.figures["completed"] == len(_trace())
    chunked = [n for step in simulated.schedule for _, n in step if n > 1]
    assert max(chunked) <= SETTINGS["max_num_batched_tokens"]


def test_runner_rows_and_drafts_follow_the_model_runner_contract(hf_config):
    from engine.sampling_params import SamplingParams
    from engine.scheduler import ScheduledBatch
    from engine.sequence import Sequence

    clock = VirtualClock()
    runner = ProfiledRunner(_profile(), clock, hf_config, num_blocks=8, block_size=16,
                            acceptance=1.0, seed=0)
    p = SamplingParams(max_tokens=8)
    chunk = Sequence("a", list(range(40)), 40, p)       # 16 of 40: no row
    last = Sequence("b", list(range(20)), 20, p)        # the prompt's end: one row
    last.num_computed_tokens = 4
    spec = Sequence("c", list(range(31)), 30, p)        # a decode with 2 drafts: 3 rows
    spec.num_computed_tokens = 30
    batch = ScheduledBatch(seqs=[chunk, last, spec], num_new_tokens=[16, 16, 3],
                           draft_token_ids=[[], [], [11, 12]])
    logits, rows = runner.execute(batch)
    assert rows == [1, 2, 2, 2]
    assert logits.shape == (4, 609)
    picked = logits.tokens
    assert logits.tensor().argmax(dim=1).tolist() == picked   # the tensor picks the same
    assert picked[1:3] == [11, 12]       # acceptance 1: both drafts confirmed
    assert clock.now == pytest.approx(STEP)
    runner.acceptance = 0.0
    logits, _ = runner.execute(batch)
    assert logits.tokens[1] != 11  # acceptance 0: the first draft rejected


def test_capacity_search_finds_the_knee_of_a_known_system(hf_config):
    """Each step costs 2 ms per token and nothing else (no batching gain): one replica
    serves 1 / (0.002 x (100 + 20)) = 4.17 requests/s of 100-token prompts and 20-token
    replies; evenly spaced arrivals meet a loose SLO below that and queue without end
    above it."""
    profile = _profile({"intercept": 0.0, "num_tokens": 0.002})
    knee = 1 / (0.002 * 120)
    trace = [TraceRequest(timestamp=float(i), prompt_tokens=100, output_tokens=20)
             for i in range(400)]
    slos = {"trace": {"e2e": 3.0}}

    def run_at(rate, probe):
        return simulate(profile, dict(max_num_seqs=64, cpu_memory_gib=0.5),
                        TraceStream(trace, rate=rate, max_model_len=2048),
                        duration=60.0, slos=slos, hf_config=hf_config,
                        probe_for=0.9 if probe else None)
    result = sim_capacity(run_at, slos, start=1.0, rel_tol=0.03)
    assert 0.9 * knee <= result.rate <= 1.03 * knee
    assert knee < result.upper <= 1.1 * knee


def test_bad_input_is_refused_by_name(hf_config):
    with pytest.raises(ValueError, match="rate must be > 0"):
        TraceStream(_trace(), rate=0, max_model_len=256)
    with pytest.raises(ValueError, match="holds no requests"):
        TraceStream([], max_model_len=256)
    with pytest.raises(ValueError, match="gpu_memory_utilization"):
        sim_engine(_profile(), {"gpu_memory_utilization": 0.01, "cpu_memory_gib": 0.1},
                   hf_config=hf_config)
    with pytest.raises(ValueError, match="max_num_seqs"):   # the engine's own check
        sim_engine(_profile(), {"max_num_seqs": 0}, hf_config=hf_config)


def test_the_front_end_time_is_added_to_every_requests_first_token_and_end(hf_config):
    """The same stream with 40 ms outside the engine's steps: each request's TTFT and E2E
    are 40 ms later, its gaps and the schedule unchanged; a TTFT SLO between the two
    passes without it and fails with it."""
    def run(front):
        return simulate(_profile(), SETTINGS, TraceStream(_trace(), max_model_len=256),
                        duration=30.0, slos={"trace": {"ttft": 10.0}}, hf_config=hf_config,
                        keep_schedule=True, front=front)
    plain, late = run(0.0), run(0.04)
    assert plain.schedule == late.schedule
    pairs = list(zip(plain.samples.records, late.samples.records))
    assert len(pairs) == len(_trace())
    for a, b in pairs:
        assert b["ttft"] - a["ttft"] == pytest.approx(0.04)
        assert b["e2e"] - a["e2e"] == pytest.approx(0.04)
        assert b["itl"] == a["itl"]
    from tuner.measure.scoring import score
    first = min(r["ttft"] for r in plain.samples.records)
    slos = {"trace": {"ttft": first + 0.02}}
    assert score(plain.samples, slos)["slo_attainment"] > score(late.samples, slos)[
        "slo_attainment"]


def test_front_seconds_is_the_difference_of_median_ttfts():
    from tuner.sim.simulate import front_seconds

    real = [{"ok": True, "ttft": t} for t in (0.05, 0.03, 0.04)] + [{"ok": False}]
    sim = [{"ok": True, "ttft": t} for t in (0.01, 0.02, 0.03, 0.5)]
    assert front_seconds(real, sim) == pytest.approx(0.04 - 0.025)
    assert front_seconds(sim, real) == 0.0          # never below zero
    with pytest.raises(ValueError, match="the real run completed no request"):
        front_seconds([{"ok": False}], sim)
    with pytest.raises(ValueError, match="the simulated run completed no request"):
        front_seconds(real, [])


def test_the_profiled_sampler_picks_what_the_engines_sampler_picks(hf_config):
    """ProfiledSampler reads each row's token off RowTokens; the engine's own Sampler on
    the tensor makes the same choices: the same stream, with drafts verified, gives the
    same schedule either way. A row that asks for more (logprobs, temperature) goes
    through the tensor."""
    from engine.sampler import Sampler
    from engine.sampling_params import SamplingParams
    from engine.sequence import Sequence
    from tuner.sim.calibrate import FixedDrafts
    from tuner.sim.engine import ProfiledSampler, RowTokens

    settings = {**SETTINGS, "speculative_config": {"method": "ngram",
                                                    "num_speculative_tokens": 3}}

    def run(engine_sampler: bool):
        engine, clock = sim_engine(_profile(), settings, hf_config=hf_config, acceptance=0.6)
        assert isinstance(engine.sampler, ProfiledSampler)
        engine.scheduler.proposer = FixedDrafts(3)   # drafts every step, 60 % accepted
        if engine_sampler:
            sampler = Sampler(eos_token_ids=engine.info.eos_token_ids, seed=0,
                              device=engine.runner.device)
            engine.sampler = engine.output.sampler = sampler
            execute = engine.runner.execute

            def tensor_logits(batch, prompt_logits=None):   # the logits as a tensor
                logits, rows = execute(batch, prompt_logits)
                return logits.tensor(), rows
            engine.runner.execute = tensor_logits
        result = simulate(_profile(), settings, TraceStream(_trace(), max_model_len=256),
                          duration=30.0, slos={}, hf_config=hf_config, keep_schedule=True,
                          engine=(engine, clock))
        return result, engine.spec_stats.num_draft_tokens
    (fast, drafted), (engine_side, drafted_too) = run(False), run(True)
    assert fast.schedule == engine_side.schedule and drafted == drafted_too > 0
    assert fast.figures["ttft_p50"] == engine_side.figures["ttft_p50"]

    sampler = ProfiledSampler(eos_token_ids=frozenset(), seed=0, device=torch.device("cpu"))
    plain = Sequence("a", [1, 2], 2, SamplingParams(max_tokens=4, temperature=0.0))
    asks = Sequence("b", [1, 2], 2, SamplingParams(max_tokens=4, temperature=0.0, logprobs=2))
    rows = RowTokens([7, 9], 16)
    assert sampler(rows, [plain, plain]).token_ids == [7, 9]
    out = sampler(rows, [plain, asks])          # through the tensor: logprobs as asked
    assert out.token_ids == [7, 9] and set(out.top_logprobs[1]) >= {9}
    assert out.top_logprobs[0] is None and out.logprobs[1] == pytest.approx(0.0, abs=1e-9)
