"""Structured outputs on the random tiny model: whatever the model prefers (and a logit_bias
pushing hard toward a forbidden token), every constrained completion matches its
constraint; unconstrained rows batched with constrained ones get the tokens they get alone."""
from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.structured_output import StructuredOutputsParams as SO

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 8},
        "age": {"type": "integer", "minimum": 0, "maximum": 120},
        "ok": {"type": "boolean"},
        "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
    },
    "required": ["name", "age", "ok", "tags"],
    "additionalProperties": False,
}
CHOICES = ["yes", "no", 'maybe "so"']


def _valid(kind: str, text: str) -> bool:
    if kind == "json":
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    if kind == "json_object":
        return isinstance(json.loads(text), dict)
    if kind == "regex":
        return re.fullmatch(r"[0-9]{3}-[a-z]{2,4}", text) is not None
    if kind == "choice":
        return text in CHOICES
    return re.fullmatch(r"\((a|bb|[c-e])(,(a|bb|[c-e])){0,3}\)", text) is not None


CASES = {
    "json": SO(json=SCHEMA),
    "json_object": SO(json_object=True),
    "regex": SO(regex=r"[0-9]{3}-[a-z]{2,4}"),
    "choice": SO(choice=CHOICES),
    "grammar": SO(grammar='root ::= "(" item ("," item){0,3} ")"\n'
                          'item ::= "a" | "bb" | [c-e]'),
}


@pytest.fixture(scope="module")
def llm():
    return LLM(num_gpu_blocks_override=256, max_model_len=512, seed=0, max_num_seqs=32)


def test_every_constrained_completion_is_valid(llm):
    tok = llm.get_tokenizer()
    forbidden = tok.encode("zzz")[0]  # fits none of the constraints at the start
    prompts = ["hello world", "the cache block page prefix"]
    params = []
    for kind, so in CASES.items():
        params.append(SamplingParams(n=3, temperature=0.8, seed=5, max_tokens=160,
                                     structured_outputs=so, logit_bias={forbidden: 50.0}))
        params.append(SamplingParams(temperature=0, max_tokens=160, structured_outputs=so))
    outs = llm.generate([prompts[i % 2] for i in range(len(params))], params)
    for (kind, _), pair in zip(CASES.items(), zip(outs[::2], outs[1::2])):
        for out in pair:
            for c in out.outputs:
                assert c.finish_reason == "stop", (kind, c.text)
                assert _valid(kind, c.text), (kind, c.text)
    assert not llm.llm_engine.output.structured._matchers  # retired with their sequences


def test_unconstrained_rows_are_unchanged_by_constrained_neighbours(llm):
    plain = [SamplingParams(temperature=0, max_tokens=12, ignore_eos=True),
             SamplingParams(temperature=1.0, seed=11, max_tokens=12, ignore_eos=True)]
    prompts = ["hello world", "explain the queue please"]
    alone = [o.outputs[0].token_ids for o in llm.generate(prompts, plain)]
    mixed = llm.generate(
        ["the model", prompts[0], "the cache", prompts[1]],
        [SamplingParams(temperature=0, max_tokens=12, structured_outputs=CASES["json"]),
         plain[0],
         SamplingParams(temperature=1.0, seed=3, max_tokens=12,
                        structured_outputs=CASES["regex"]),
         plain[1]])
    assert [mixed[1].outputs[0].token_ids, mixed[3].outputs[0].token_ids] == alone


def test_stop_strings_prefix_cache_and_compile_cache(llm):
    manager = llm.llm_engine.output.structured
    prompt = "the shared system prompt of every tenant " * 6  # full blocks to reuse
    p = SamplingParams(temperature=0, max_tokens=80, structured_outputs=CASES["json"],
                       stop=['"age"'])
    first = llm.generate([prompt], p)[0]
    compiled = manager.num_compiled
    second = llm.generate([prompt], p)[0]
    assert second.num_cached_tokens > 0 and manager.num_compiled == compiled
    assert first.outputs[0].text == second.outputs[0].text
    assert first.outputs[0].stop_reason == '"age"'
    assert first.outputs[0].text.startswith('{"name": "')


@pytest.mark.parametrize("so,kind", [
    (SO(json={"type": "objectx"}), "json"),
    (SO(json="{not json"), "json"),
    (SO(regex="(ab"), "regex"),
    (SO(grammar='root ::= "a" |'), "grammar"),
])
def test_invalid_constraint_is_a_value_error_naming_it(llm, so, kind):
    with pytest.raises(ValueError, match=f"structured_outputs.{kind}"):
        llm.generate(["hi"], SamplingParams(max_tokens=2, structured_outputs=so))


def test_params_need_exactly_one_constraint():
    with pytest.raises(ValueError, match="exactly one"):
        SO()
    with pytest.raises(ValueError, match="exactly one"):
        SO(regex="a", choice=["a"])
    with pytest.raises(ValueError, match="choice"):
        SO(choice=[])


def test_min_tokens_yields_to_a_grammar_that_is_done(llm):
    """min_tokens bans the stop tokens, but a finished choice allows nothing else: the
    grammar wins (no all -inf row, no NaN), the output is the choice."""
    out = llm.generate(["hello"], SamplingParams(
        temperature=0, max_tokens=20, min_tokens=10, logprobs=0,
        structured_outputs=SO(choice=["yes", "no"])))[0].outputs[0]
    assert out.text in ("yes", "no") and out.finish_reason == "stop"
    assert all(math.isfinite(lp[t]) for t, lp in zip(out.token_ids, out.logprobs))


def test_a_failed_step_leaves_no_matcher_behind(llm, monkeypatch):
    """A step that raises after the masks were filled (here: sampling, for one structured
    n=2 request at the end of its prompt, when its forks were just made) is redone request
    by request; the culprit fails alone, the other structured request is valid, and no
    matcher outlives its sequence."""
    from engine.sampler import Sampler

    original = Sampler.distribution

    def distribution(self, logits, seqs):
        if any(s.request_id == "bad" for s in seqs):
            raise RuntimeError("injected sampling fault")
        return original(self, logits, seqs)

    monkeypatch.setattr(Sampler, "distribution", distribution)
    engine = llm.llm_engine
    engine.add_request("bad", "hello", SamplingParams(n=2, temperature=1.0, max_tokens=20,
                                                      structured_outputs=CASES["choice"]))
    engine.add_request("good", "the cache", SamplingParams(
        n=2, temperature=1.0, seed=1, max_tokens=40, structured_outputs=CASES["regex"]))
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    assert finals["bad"].error and not finals["good"].error
    assert all(_valid("regex", c.text) for c in finals["good"].outputs)
    assert engine.output.structured.num_matchers == 0
