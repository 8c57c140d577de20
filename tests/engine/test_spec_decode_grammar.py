"""Speculative decoding with structured outputs, and the grammar's mask in mixed batches.

A grammar's mask follows its matcher, which only sampled tokens advance, so a constrained
row gets no drafts (engine/scheduler.py); unconstrained rows in the same steps still do.
The prompts repeat what the grammars produce, so that a proposer finds drafts for every
row. And the mask of each constrained row lands on that row: constrained rows before,
between and after unconstrained ones all end valid, finished by their grammar.
"""
from __future__ import annotations

import json
import re

import jsonschema
import pytest

from engine import LLM, SamplingParams
from engine.structured_output import StructuredOutputsParams as SO

SCHEMA = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 6},
                                           "n": {"type": "integer", "minimum": 0,
                                                 "maximum": 99}},
          "required": ["name", "n"], "additionalProperties": False}
REGEX = r"[0-9]{3}-[a-z]{2,4}"
CHOICES = ["cache block", "page table", "prefix"]
CONSTRAINED = {  # kind -> (constraint, a prompt repeating what it produces)
    "regex": (SO(regex=REGEX), "codes: 123-ab 123-ab 456-cd 123-ab 456-cd"),
    "choice": (SO(choice=CHOICES), "cache block page table prefix cache block page table"),
    "json_schema": (SO(json=SCHEMA), '{"name": "ab", "n": 1} {"name": "ab", "n": 1} '
                                     '{"name": "ab", "n": 1}'),
}
PLAIN = "the model cache block page the model cache block page the model cache block page"
# every proposer the engine offers runs the same checks ("method" in --speculative-config)
PROPOSERS = {"ngram": {"method": "ngram", "num_speculative_tokens": 3,
                       "prompt_lookup_max": 3, "prompt_lookup_min": 1}}


def valid(kind: str, text: str) -> bool:
    if kind == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
        return True
    if kind == "regex":
        return re.fullmatch(REGEX, text) is not None
    return text in CHOICES


def drafted_requests(llm: LLM) -> dict[str, int]:
    """Records, per request id, how many draft tokens its rows carried (the scheduler's
    batches, as the step executes them)."""
    scheduler = llm.llm_engine.scheduler
    schedule, drafted = scheduler.schedule, {}

    def recording_schedule():
        batch = schedule()
        for seq, drafts in zip(batch.seqs, batch.draft_token_ids or ()):
            drafted[seq.request_id] = drafted.get(seq.request_id, 0) + len(drafts)
        return batch

    scheduler.schedule = recording_schedule
    return drafted


@pytest.mark.parametrize("method", sorted(PROPOSERS))
def test_constrained_rows_get_no_drafts_and_stay_valid_under_speculation(method):
    llm = LLM(num_gpu_blocks_override=256, max_model_len=256, seed=0, max_num_seqs=16,
              speculative_config=PROPOSERS[method])
    drafted = drafted_requests(llm)
    prompts, params, kinds = [], [], []
    for kind, (so, prompt) in CONSTRAINED.items():
        for temperature in (0.0, 0.9):
            prompts.append(prompt)
            params.append(SamplingParams(temperature=temperature, seed=7, max_tokens=48,
                                         structured_outputs=so))
            kinds.append(kind)
        prompts.append(PLAIN)  # an unconstrained row after each pair of constrained ones
        params.append(SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
        kinds.append(None)
    outs = llm.generate(prompts, params)
    for kind, out in zip(kinds, outs):
        c = out.outputs[0]
        assert c.finish_reason == ("length" if kind is None else "stop"), (kind, c.text)
        if kind is None:
            assert drafted[out.request_id] > 0, "an unconstrained row should be drafted"
        else:
            assert valid(kind, c.text), (kind, c.text)
            assert drafted.get(out.request_id, 0) == 0, (kind, "a constrained row drafted")


def test_each_constrained_row_gets_its_own_mask_around_unconstrained_rows():
    """Rows: constrained, plain, constrained, plain, constrained, constrained. A mask
    written to another row (the k-th constrained row's mask at batch row k, say) leaves
    some constrained row unmasked or masked by another grammar: its output is invalid."""
    llm = LLM(num_gpu_blocks_override=256, max_model_len=256, seed=0, max_num_seqs=16)
    order = ["json_schema", None, "regex", None, "choice", "regex"]
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True) if kind is None
              else SamplingParams(temperature=0.8, seed=i, max_tokens=48,
                                  structured_outputs=CONSTRAINED[kind][0])
              for i, kind in enumerate(order)]
    prompts = [f"row {i}: the model cache block page" for i in range(len(order))]
    outs = llm.generate(prompts, params)
    plain = llm.generate([prompts[1], prompts[3]], [params[1], params[3]])
    for kind, out in zip(order, outs):
        c = out.outputs[0]
        if kind is not None:
            assert c.finish_reason == "stop" and valid(kind, c.text), (kind, c.text)
    assert [outs[1].outputs[0].token_ids, outs[3].outputs[0].token_ids] == [
        o.outputs[0].token_ids for o in plain]
