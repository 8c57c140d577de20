"""Speculation per method in the simulator (tuner/sim/drafts.py): the replay of a method's
proposer over the model's replies counts what the real engine counts; the simulated engine
drafts and accepts at the replayed rates, position by position, through the engine's own
gate; a SimContext replays each method once."""
from __future__ import annotations

import random

import pytest

from engine import LLM, SamplingParams
from engine.config import EngineConfig
from loadtests.workloads.trace import TraceRequest
from test_sim_engine import SETTINGS, _profile
from tuner.sim.drafts import DraftModel, Reply, drafting_key, model_replies, replay
from tuner.sim.simulate import simulate
from tuner.sim.stream import TraceStream

NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
         "prompt_lookup_max": 3}
SUFFIX = {"method": "suffix", "num_speculative_tokens": 4}


def _checked(spec: dict) -> dict:
    return EngineConfig(speculative_config=spec).speculative_config


def _prompts() -> list[list[int]]:
    """Token ids with repeats (n-gram matches) and recurring requests (suffix matches)."""
    rng = random.Random(3)
    base = [rng.randrange(5, 200) for _ in range(12)]
    out = []
    for i in range(6):
        tail = [rng.randrange(5, 200) for _ in range(3 + i)]
        out.append(base + tail + base[:6] + tail if i % 2 else tail + base)
    return out


@pytest.mark.parametrize("spec", [NGRAM, SUFFIX], ids=["ngram", "suffix"])
def test_the_replay_counts_what_the_engine_counts(tiny_checkpoints, spec):
    """Greedy replies, one request at a time: the replay's drafts, draft tokens and
    per-position acceptance equal the engine's own spec_decode counters, and its decode
    steps are the engine's (tokens out less accepted drafts less the prefill's tokens)."""
    llm = LLM(tiny_checkpoints["llama"], speculative_config=dict(spec), block_size=16)
    replies = []
    for prompt in _prompts():   # in order: suffix learns each reply once it has finished
        params = SamplingParams(max_tokens=40, temperature=0.0)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        replies.append(Reply(prompt, list(out.outputs[0].token_ids), 40))
    stats = llm.llm_engine.get_stats()
    model = replay(_checked(spec), replies)

    assert model.drafting == stats.spec_num_drafts > 0
    assert sum((i + 1) * c for i, c in enumerate(model.length_counts)) == \
        stats.spec_num_draft_tokens
    # the engine counts acceptance per position unconditionally: accepted[j] is the same
    assert model.accepted == stats.spec_num_accepted_tokens_per_pos
    assert 0 < stats.spec_num_accepted_tokens < stats.spec_num_draft_tokens
    out_tokens = sum(len(r.output_ids) for r in replies)
    assert model.steps == out_tokens - len(replies) - stats.spec_num_accepted_tokens


def test_acceptance_is_per_position_given_the_ones_before():
    """N-gram (min = max = 1, k = 3) on the prompt 'a b c d', traced by hand. Its replies:
    (1) the prompt twice: two steps, each drafting 'b c d', all accepted; (2) it leaves the
    cycle at its 4th token: 'b c' accepted and 'd' missed, then two steps with no earlier
    occurrence of the last token, so no drafts; (3) it leaves at once: 'b' missed."""
    spec = _checked({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 1})
    cycle = [10, 11, 12, 13]
    replies = [Reply(cycle, cycle * 2, 64), Reply(cycle, [10, 11, 12, 99, 5, 6], 64),
               Reply(cycle, [10, 77], 64)]
    assert replay(spec, replies[:1]).offered == (2, 2, 2)
    model = replay(spec, replies)
    assert (model.steps, model.drafting, model.length_counts) == (6, 4, (0, 0, 4))
    assert model.offered == (4, 3, 3) and model.accepted == (3, 3, 2)
    assert model.accept == pytest.approx((0.75, 1.0, 2 / 3))
    assert model.draft_share == pytest.approx(4 / 6)
    # 1 + 4/6 * (0.75 + 0.75 * 1.0 + 0.75 * 1.0 * 2/3)
    assert model.tokens_per_step == pytest.approx(1 + 4 / 6 * 2.0)
    with pytest.raises(ValueError, match="max_tokens"):
        replay(spec, [Reply(cycle, [10], 64)])


def _trace(n=40) -> list[TraceRequest]:
    return [TraceRequest(timestamp=0.5 * i, prompt_tokens=40, output_tokens=60)
            for i in range(n)]


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


def test_the_simulated_engine_drafts_and_accepts_at_the_models_rates(hf_config):
    model = DraftModel("ngram", steps=100, drafting=50, length_counts=(0, 0, 50),
                       offered=(50, 40, 20), accepted=(40, 20, 20))   # 0.8, 0.5, 1.0
    drafts, per_pos, decode_rows = _spec_counts(_checked(NGRAM), model, hf_config)
    assert decode_rows > 1000
    assert drafts / decode_rows == pytest.approx(0.5, abs=0.05)
    assert per_pos[0] / drafts == pytest.approx(0.8, abs=0.05)
    assert per_pos[1] / per_pos[0] == pytest.approx(0.5, abs=0.06)
    # position 3 is accepted whenever it is verified (near max_tokens a draft is shorter)
    assert per_pos[2] / per_pos[1] == pytest.approx(1.0, abs=0.03)


def _spec_counts(spec, model, hf_config, **extra):
    """(drafts, accepted per position, decode rows) of one simulated run."""
    from tuner.sim.engine import sim_engine

    settings = {**SETTINGS, "num_gpu_blocks_override": 200, "max_num_batched_tokens": 128,
                "speculative_config": spec, **extra}
    engine, clock = sim_engine(_profile(), settings, hf_config=hf_config,
                               drafts=lambda s: model)
    result = simulate(_profile(), settings, TraceStream(_trace(), max_model_len=256),
                      duration=60.0, slos={}, hf_config=hf_config, engine=(engine, clock))
    assert result.figures["completed"] == len(_trace())
    stats = engine.spec_stats
    out = sum(r.output_tokens for r in _trace())
    decode_rows = out - len(_trace()) - stats.num_accepted_tokens
    return stats.num_drafts, stats.accepted_per_pos, decode_rows


def test_the_engines_gate_acts_on_the_simulated_batch(hf_config):
    model = DraftModel("ngram", steps=1, drafting=1, length_counts=(0, 0, 1),
                       offered=(1, 1, 1), accepted=(1, 1, 1))
    drafts, _, _ = _spec_counts(_checked(NGRAM), model, hf_config)
    assert drafts > 0
    gated = _checked({**NGRAM, "disable_by_batch_size": 1})
    assert _spec_counts(gated, model, hf_config)[0] == 0


def test_a_context_replays_each_method_once_and_a_fixed_rate_keeps_the_old_model(
        tiny_checkpoints, hf_config):
    from tuner.sim.context import SimContext

    trace = _trace(12)
    ctx = SimContext(_profile(), {}, trace=trace, duration=20.0,
                     model=tiny_checkpoints["llama"])
    replies = [Reply([5, 6, 7, 8] * 3, [5, 6, 7, 8] * 4, 64)]
    ctx.replies = list(replies)
    base = {**SETTINGS, "num_gpu_blocks_override": 200}
    copying = ctx.run({**base, "speculative_config": _checked(NGRAM)}, 2.0)
    ctx.run({**base, "speculative_config": _checked({**NGRAM, "disable_by_batch_size": 8})},
            2.0)
    assert list(ctx._drafts) == [drafting_key(_checked(NGRAM))]
    assert copying.figures["spec_acceptance_rate"] > 0.9
    ctx_fixed = SimContext(_profile(), {}, trace=trace, duration=20.0, acceptance=0.0,
                           model=tiny_checkpoints["llama"])
    fixed = ctx_fixed.run({**base, "speculative_config": _checked(NGRAM)}, 2.0)
    assert ctx_fixed.replies is None and not ctx_fixed._drafts
    assert fixed.figures.get("spec_acceptance_rate", 0.0) == 0.0


def test_model_replies_are_the_engines_seeded_samples(tiny_checkpoints, capfd):
    from tuner.sim.stream import SimRequest

    requests = [SimRequest(0.0, "chat", [5, 6, 7, 8, 9], 6),
                SimRequest(1.0, "chat", [9, 8, 7], 4)]
    first = model_replies(tiny_checkpoints["llama"], requests, seed=1)
    assert "Loading weights" not in capfd.readouterr().err   # the sweep's log stays clean
    again = model_replies(tiny_checkpoints["llama"], requests, seed=1)
    assert first == again
    assert [r.prompt_ids for r in first] == [q.prompt_ids for q in requests]
    # to max_tokens, as the simulated requests run (ignore_eos)
    assert [len(r.output_ids) for r in first] == [q.max_tokens for q in requests]
    llm = LLM(tiny_checkpoints["llama"])
    direct = llm.generate([{"prompt_token_ids": requests[1].prompt_ids}],
                          SamplingParams(max_tokens=4, seed=1 * 1_000_003 + 1, ignore_eos=True),
                          use_tqdm=False)[0]
    assert first[1].output_ids == list(direct.outputs[0].token_ids)
    # a request's own temperature (the code workload's 0): the greedy reply, any seed
    greedy = [SimRequest(0.0, "code", [5, 6, 7, 8, 9], 6, temperature=0.0)]
    reference = llm.generate([{"prompt_token_ids": greedy[0].prompt_ids}],
                             SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
                             use_tqdm=False)[0]
    for seed in (1, 2):
        assert model_replies(tiny_checkpoints["llama"], greedy, seed=seed)[0].output_ids == \
            list(reference.outputs[0].token_ids)
    assert first[0].output_ids != reference.outputs[0].token_ids   # sampled at 1.0


def test_a_services_counters_give_the_replays_model(tiny_checkpoints):
    """tuner/sim/drafts.from_counters, which the SLO planner builds from a service's
    Prometheus series: on the real engine's counters (n-gram, greedy) it draws and
    accepts what the replay of the same replies does, and its tokens per decode step are
    the engine's own (decode rows + accepted drafts) / decode rows."""
    from tuner.sim.drafts import from_counters

    llm = LLM(tiny_checkpoints["llama"], speculative_config=dict(NGRAM), block_size=16)
    replies = []
    for prompt in _prompts():
        params = SamplingParams(max_tokens=40, temperature=0.0)
        out = llm.generate([{"prompt_token_ids": prompt}], params, use_tqdm=False)[0]
        replies.append(Reply(prompt, list(out.outputs[0].token_ids), 40))
    stats = llm.llm_engine.get_stats()
    steps = sum(len(r.output_ids) for r in replies) - len(replies) \
        - stats.spec_num_accepted_tokens
    model = from_counters("ngram", 3, steps=steps, drafts=stats.spec_num_drafts,
                          draft_tokens=stats.spec_num_draft_tokens,
                          accepted_per_pos=list(stats.spec_num_accepted_tokens_per_pos))
    replayed = replay(_checked(NGRAM), replies)
    assert (model.steps, model.drafting, model.accepted) == \
        (replayed.steps, replayed.drafting, replayed.accepted)
    real = (steps + stats.spec_num_accepted_tokens) / steps
    assert model.tokens_per_step == pytest.approx(real, rel=0.03)


def test_counters_of_one_draft_length_are_the_replay_exactly():
    """The hand-traced n-gram case above (every draft 3 tokens), from its counters alone;
    then drafts of two lengths: offered in proportion to the lengths left."""
    from tuner.sim.drafts import from_counters

    spec = _checked({"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1,
                     "prompt_lookup_max": 1})
    cycle = [10, 11, 12, 13]
    replies = [Reply(cycle, cycle * 2, 64), Reply(cycle, [10, 11, 12, 99, 5, 6], 64),
               Reply(cycle, [10, 77], 64)]
    assert from_counters("ngram", 3, steps=6, drafts=4, draft_tokens=12,
                         accepted_per_pos=[3, 3, 2]) == replay(spec, replies)
    mixed = from_counters("suffix", 3, steps=40, drafts=10, draft_tokens=25,
                          accepted_per_pos=[8, 6, 2])
    assert mixed.length_counts == (0, 5, 5)          # 25 tokens: five of 2, five of 3
    assert mixed.offered == (10, 8, 3)               # 6 accepted at 2 x 5/10 go on to 3
    assert mixed.accepted == (8, 6, 2) and mixed.draft_share == 0.25
    none = from_counters("ngram", 3, steps=50, drafts=0, draft_tokens=0,
                         accepted_per_pos=[])
    assert none.tokens_per_step == 1.0 and none.offered == (0, 0, 0)


def test_simulated_gaps_are_per_step_and_tpot_per_token(hf_config):
    """A step's accepted drafts arrive together, as one chunk of a real stream: a simulated
    record has one gap per step that delivered tokens (none of zero length), and its TPOT
    is its decode time over its tokens after the first, the figure the real side scores
    (tuner/measure/scoring.tpot): the two sides read speculation alike."""
    from tuner.measure.scoring import meets_slo, tpot
    from tuner.sim.engine import sim_engine

    model = DraftModel("ngram", steps=1, drafting=1, length_counts=(0, 0, 1),
                       offered=(1, 1, 1), accepted=(1, 1, 1))   # every draft, all of it
    settings = {**SETTINGS, "num_gpu_blocks_override": 200, "max_num_batched_tokens": 128,
                "speculative_config": _checked(NGRAM)}
    engine, clock = sim_engine(_profile(), settings, hf_config=hf_config,
                               drafts=lambda s: model)
    result = simulate(_profile(), settings, TraceStream(_trace(), max_model_len=256),
                      duration=60.0, slos={}, hf_config=hf_config, engine=(engine, clock))
    records = [r for r in result.samples.records if r.get("ok")]
    assert len(records) == len(_trace())
    chunked = 0
    for r in records:
        assert all(g > 0 for g in r["itl"])
        assert len(r["itl"]) <= r["output_tokens"] - 1
        chunked += len(r["itl"]) < r["output_tokens"] - 1
        decode = r["e2e"] - r["ttft"]
        assert tpot(r) == pytest.approx(decode / (r["output_tokens"] - 1))
    assert chunked == len(records)      # each of them took drafted tokens in some step
    # a TPOT limit between the per-token time and the mean gap per step: met
    r = records[0]
    per_step = sum(r["itl"]) / len(r["itl"])
    assert meets_slo(r, {"tpot": (tpot(r) + per_step) / 2})
