"""The step-time profile: fitting recovers known coefficients, the form is chosen by
held-out error, and a profile from another identity or no profile at all is refused."""
from __future__ import annotations

import dataclasses
import json
import random

import re

import pytest

from engine.step_shape import StepShape
from tuner.sim.profile import FORMS, Fit, Identity, Memory, Profile, fit


def _shapes(n: int, seed: int = 0) -> list[StepShape]:
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        pt = rng.choice([0, 0, rng.randint(1, 1024)])
        ds = rng.randint(0, 48)
        dc = ds * rng.randint(16, 1500)
        dq = rng.choice([0, 0, ds, ds // 2])      # rows verifying drafts, 1-4 drafts each
        out.append(StepShape(prefill_tokens=pt, prefill_attention=pt * rng.randint(pt, 2048),
                             prefill_seqs=int(pt > 0), decode_seqs=ds, decode_context=dc,
                             draft_tokens=dq * rng.randint(1, 4), draft_seqs=dq,
                             blocks_read=rng.randint(1, 200)))
    return out


TRUE = {"intercept": 0.004, "prefill_tokens": 1.5e-4, "prefill_attention": 3e-8,
        "decode_seqs": 6e-4, "decode_context": 3e-6, "draft_tokens": 2e-4, "draft_seqs": 3e-4}


def _time(shape: StepShape, coef=TRUE) -> float:
    return coef["intercept"] + sum(c * getattr(shape, k) for k, c in coef.items()
                                   if k != "intercept")


def test_fit_recovers_known_coefficients_and_picks_their_form():
    rng = random.Random(1)
    shapes = _shapes(400)
    seconds = [_time(s) * rng.uniform(0.97, 1.03) for s in shapes]  # 3 % noise
    result = fit(shapes, seconds)
    assert result.form == "attention"
    for name, value in TRUE.items():
        assert result.coefficients[name] == pytest.approx(value, rel=0.1, abs=2e-5), name
    assert result.heldout_error < 0.03
    # the forms without the attention terms cannot explain these steps
    assert result.errors["tokens"] > 3 * result.errors["attention"]
    shape = _shapes(1, seed=9)[0]
    assert result.predict(shape) == pytest.approx(_time(shape), rel=0.05)


def test_fit_picks_the_simpler_form_when_time_depends_on_tokens_only():
    shapes = _shapes(200, seed=3)
    seconds = [0.01 + 2e-4 * s.num_tokens for s in shapes]
    result = fit(shapes, seconds)
    assert result.form == "tokens"
    assert result.coefficients["num_tokens"] == pytest.approx(2e-4, rel=1e-6)


def test_steps_without_drafts_charge_a_draft_token_as_a_prefill_token():
    """A live fit of a service that never speculated (the capacity sweep's pilot of the
    defaults) cannot time a draft token; it is charged as a prefill token, never nothing
    (SmolLM2's agentic sweep: a free verification made suffix:16 with 16 sequences the
    simulator's best at 2.05 req/s, which measured below 0.92 against the defaults' 1.56).
    Steps that did verify drafts time them as they are."""
    rng = random.Random(2)
    plain = [dataclasses.replace(s, draft_tokens=0) for s in _shapes(300, seed=4)]
    result = fit(plain, [_time(s) * rng.uniform(0.98, 1.02) for s in plain])
    assert "draft_tokens" in result.coefficients and result.form != "tokens"
    assert result.coefficients["draft_tokens"] == result.coefficients["prefill_tokens"] > 0
    spec = StepShape(decode_seqs=16, decode_context=16 * 500, draft_tokens=16 * 16,
                     blocks_read=200)
    assert result.predict(spec) > result.predict(dataclasses.replace(spec, draft_tokens=0))
    timed = fit(_shapes(400), [_time(s) * rng.uniform(0.97, 1.03) for s in _shapes(400)])
    assert timed.coefficients["draft_tokens"] == pytest.approx(TRUE["draft_tokens"], rel=0.1)


def test_a_draft_token_never_costs_less_than_a_prefill_token(tmp_path):
    """Timed drafts cheaper than prompt tokens are priced as prompt tokens (one more query
    row of the forward each); a profile saved with free drafts (a calibration cached before
    the rule) is priced on load."""
    rng = random.Random(3)
    shapes = _shapes(400)
    cheap = {**TRUE, "draft_tokens": 2e-5}
    seconds = [sum(c * (1.0 if k == "intercept" else getattr(s, k)) for k, c in cheap.items())
               * rng.uniform(0.99, 1.01) for s in shapes]
    result = fit(shapes, seconds)
    assert result.coefficients["draft_tokens"] == result.coefficients["prefill_tokens"]
    assert result.coefficients["prefill_tokens"] == pytest.approx(1.5e-4, rel=0.1)
    profile = Profile(Identity("m", "f", "hw", "t", 1),
                      Fit("rows", {"intercept": 0.07, "prefill_tokens": 3e-3,
                                   "decode_seqs": 4e-3, "draft_tokens": 0.0}, 0.1),
                      Memory(0, 1e6, 1000, 0, 0, 2048, 100), num_steps=10)
    profile.save(tmp_path / "p.json")
    loaded = Profile.load(tmp_path / "p.json")
    assert loaded.fit.coefficients == {**profile.fit.coefficients, "draft_tokens": 3e-3}
    tokens = dataclasses.replace(profile, fit=Fit("tokens", {"intercept": 0.01,
                                                             "num_tokens": 2e-4}, 0.1))
    tokens.save(tmp_path / "t.json")   # no draft term of its own: left as it is
    assert Profile.load(tmp_path / "t.json").fit.coefficients == tokens.fit.coefficients


def test_fit_weighs_each_step_by_its_relative_error():
    """A few long prefills with a 10 % error of their own do not bend the per-row terms of
    many short decodes: the fit minimises relative error (what picks the form), so the
    decodes' law is recovered; an absolute fit would shift it toward the prefills."""
    law = {"intercept": 0.004, "prefill_tokens": 1e-4, "decode_seqs": 2e-4,
           "lookup_seqs": 1.5e-4}
    shapes = [StepShape(decode_seqs=n, lookup_seqs=n * (i % 2)) for i in range(40)
              for n in (1, 4, 16)]
    seconds = [_time(s, law) for s in shapes]
    prefills = [StepShape(prefill_tokens=t, prefill_seqs=1) for t in (2048, 1024, 1536, 1800)]
    shapes += prefills
    seconds += [_time(s, law) * f for s, f in zip(prefills, (1.1, 0.9, 1.1, 0.9))]
    result = fit(shapes, seconds, forms={"rows": ("prefill_tokens", "decode_seqs",
                                                  "lookup_seqs")})
    for name in ("intercept", "decode_seqs", "lookup_seqs"):
        assert result.coefficients[name] == pytest.approx(law[name], rel=0.02), name


def test_fit_keeps_coefficients_non_negative():
    shapes = _shapes(200, seed=4)
    # time falls with decode context (nonsense): the fit must not learn a negative cost
    seconds = [0.02 + 1e-4 * s.prefill_tokens - 1e-7 * s.decode_context for s in shapes]
    result = fit(shapes, seconds, forms={"attention": FORMS["attention"]})
    assert all(v >= 0 for v in result.coefficients.values())


def test_fit_refuses_too_few_steps_and_mismatched_lengths():
    with pytest.raises(ValueError, match="too few"):
        fit(_shapes(5), [0.01] * 5)
    with pytest.raises(ValueError, match="3 step shapes but 2"):
        fit(_shapes(3), [0.01] * 2)


def _profile(threads: int = 1, model: str = "builtin://default") -> Profile:
    return Profile(Identity(model, "f" * 64, "cpu x2", "2.13.0", threads),
                   Fit("tokens", {"intercept": 0.01, "num_tokens": 1e-4}, 0.05),
                   Memory(0.0, 1e7, 4096, 0.0, 2e4, 2048, 609), 100)


def test_profile_round_trips_and_refuses_another_identity(tmp_path):
    path = tmp_path / "p.json"
    _profile().save(path)
    loaded = Profile.load(path, expect=_profile().identity)
    assert loaded == _profile()
    with pytest.raises(ValueError, match=r"threads 1 \(this run: 2\).*tuner profile"):
        Profile.load(path, expect=_profile(threads=2).identity)
    other = Identity("other", "0" * 64, "cpu x2", "2.13.0", 1)
    with pytest.raises(ValueError, match="fingerprint"):
        Profile.load(path, expect=other)


def test_profile_load_names_a_bad_file(tmp_path):
    with pytest.raises(ValueError, match="missing.json"):
        Profile.load(tmp_path / "missing.json")
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"identity": {}}))
    with pytest.raises(ValueError, match="not a profile written by"):
        Profile.load(bad)


def test_memory_sizes_the_pool_as_the_engine_arithmetic_does():
    from engine.kv_capacity import num_kv_blocks

    m = Memory(0.0, 12_856_320.0, 4096, 1000.0, 20_000.0, 2048, 609)
    got = m.num_blocks(block_size=16, fraction=0.9, max_num_batched_tokens=2048,
                       max_num_seqs=48, cpu_memory_gib=0.5)
    # a profile without the logits' bytes per sequence: float32 rows of the vocabulary
    assert got == num_kv_blocks(device_bytes=0.5 * 2**30, fraction=0.9,
                                weight_bytes=12_856_320.0,
                                activation_bytes=1000.0 + 20_000.0 * 2048 + 48 * 609 * 4,
                                block_bytes=16 * 4096)
    gpu = Memory(80 * 2**30, 1e9, 4096, 0.0, 0.0, 2048, 609, activation_per_seq=0.0)
    assert gpu.num_blocks(block_size=16, fraction=0.5, max_num_batched_tokens=1,
                          max_num_seqs=256, cpu_memory_gib=0.5) == \
        int((40 * 2**30 - 1e9) // (16 * 4096))
    # the engine profiles min(max_num_seqs, max_num_batched_tokens) sequences
    big = Memory(0.0, 0.0, 4096, 0.0, 0.0, 2048, 50_000, activation_per_seq=3e5)
    assert big.activations(max_num_batched_tokens=100, max_num_seqs=256) == 100 * 3e5
    assert big.activations(max_num_batched_tokens=2048, max_num_seqs=40) == 40 * 3e5


def test_a_sequences_logits_are_its_output_row_and_the_float32_copy():
    """The runner returns float32 logits: a float32 model's row is that copy already."""
    import torch

    from tuner.sim.calibrate import logits_bytes_per_seq

    assert logits_bytes_per_seq(49_152, torch.float32) == 49_152 * 4
    assert logits_bytes_per_seq(49_152, torch.bfloat16) == 49_152 * (2 + 4)


def test_step_shape_counts_prefill_decode_and_drafts():
    from engine.sampling_params import SamplingParams
    from engine.scheduler import ScheduledBatch
    from engine.sequence import Sequence

    p = SamplingParams(max_tokens=8)
    prefill = Sequence("a", list(range(100)), 100, p, block_table=[0] * 7)
    prefill.num_computed_tokens = 32      # a chunk of 48 after 32 computed
    decode = Sequence("b", list(range(41)), 40, p, block_table=[1] * 3)
    decode.num_computed_tokens = 40       # one token after a 40-token prompt
    spec = Sequence("c", list(range(61)), 50, p, block_table=[2] * 4)
    spec.num_computed_tokens = 60         # one token + 3 drafts
    batch = ScheduledBatch(seqs=[prefill, decode, spec], num_new_tokens=[48, 1, 4],
                           draft_token_ids=[[], [], [7, 8, 9]])
    assert StepShape.of(batch) == StepShape(
        prefill_tokens=48, prefill_attention=48 * 80, prefill_seqs=1, decode_seqs=2,
        decode_context=41 + 64, draft_tokens=3, blocks_read=14, draft_seqs=1,
        served_rows_squared=(1 + 2) ** 2)


def test_the_calibration_times_steps_that_verify_drafts_at_several_widths(monkeypatch):
    """The calibration's steps (the real engine, the embedded model, a short run) include
    decode steps verifying 1, 3 and 8 drafts per row at 1-16 rows and steps whose rows an
    n-gram proposer looked up in vain (at the first of its block sizes only), so that every
    term of the richest form, the draft terms included, is told apart: a known law over the
    calibration's own shapes is recovered term by term. Its cache name carries the
    calibration's version (a profile cached without the draft phase is not reused). It times
the host KV tier's copies too."""
    from tuner.sim import calibrate

    seen = {}

    def capture(shapes, seconds, forms=FORMS):
        seen["shapes"] = shapes
        return fit(shapes, seconds, forms)

    monkeypatch.setattr(calibrate, "fit", capture)
    lines = []
    profile = calibrate.run_calibration(None, block_sizes=(16, 32), scale=0.1,
                                        log=lines.append)
    # the host KV tier's copies timed on the engine's own pool (tuner/sim/tiers.py)
    memory = profile.memory
    assert 0 < memory.store_seconds_per_byte < 1e-6 and 0 < memory.load_seconds_per_byte < 1e-6
    first = int(re.match(r"block_size 16: (\d+) steps timed", lines[0]).group(1))
    assert "draft and lookup phases" in lines[0] and "draft" not in lines[1]
    shapes = seen["shapes"][:first - calibrate.WARMUP_STEPS]
    # the speculative phases run at the first block size only (their terms are per row and
    # per draft; SmolLM2 spends about a minute per block size on them)
    second = seen["shapes"][first - calibrate.WARMUP_STEPS:]
    assert second and not any(s.draft_seqs or s.lookup_seqs for s in second)
    widths = {(s.draft_seqs, s.draft_tokens // s.draft_seqs) for s in shapes
              if s.draft_seqs and not s.prefill_tokens and s.draft_tokens % s.draft_seqs == 0}
    assert {k for _, k in widths} >= {1, 3, 8} and {n for n, _ in widths} >= {1, 4, 16}
    # rows whose n-gram lookup found nothing, alone in their step, at 1 to 16 rows
    looked = {s.lookup_seqs for s in shapes if s.lookup_seqs == s.decode_seqs}
    assert {1, 4, 16} <= looked
    assert all(s.draft_seqs + s.lookup_seqs <= s.decode_seqs for s in shapes)
    law = {"intercept": 0.003, "prefill_tokens": 9e-5, "prefill_attention": 4e-8,
           "prefill_seqs": 5e-4, "decode_seqs": 1.2e-4, "decode_context": 1.3e-6,
           "draft_tokens": 1e-4, "draft_seqs": 2.3e-4, "lookup_seqs": 1.5e-4,
           "blocks_read": 2e-5}
    recovered = fit(seen["shapes"], [_time(s, law) for s in seen["shapes"]],
                    forms={"attention+blocks": FORMS["attention+blocks"]})
    for name, value in law.items():
        assert recovered.coefficients[name] == pytest.approx(value, rel=1e-3), name
    ident = _profile().identity
    assert calibrate.cached_path(ident).name == f"{ident.key()}-cal{calibrate.CALIBRATION}.json"
