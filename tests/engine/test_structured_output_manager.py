"""The structured-output manager itself (engine/structured_output/manager.py), on the
default model's tokenizer and real xgrammar: grammars compiled once and evicted least
recently used first, a schema given as JSON text, strict schemas, the error's message,
masks over a vocabulary padded past the tokenizer, the model's own stop tokens, and one
matcher per sequence, rebuilt by replaying its output."""
from __future__ import annotations

import pytest
import torch
import xgrammar

from engine.sampling_params import SamplingParams
from engine.sequence import Sequence
from engine.structured_output import StructuredOutputsParams as SO
from engine.structured_output.manager import StructuredOutputManager, _message


@pytest.fixture(scope="module")
def tokenizer():
    from transformers import AutoTokenizer

    from engine.builtin_models import DEFAULT_MODEL, ensure_builtin
    return AutoTokenizer.from_pretrained(ensure_builtin(DEFAULT_MODEL))


def manager(tokenizer, *, pad: int = 0, eos: frozenset[int] | None = None,
            cached: int = 256) -> StructuredOutputManager:
    return StructuredOutputManager(
        tokenizer, vocab_size=len(tokenizer) + pad, max_cached_grammars=cached,
        eos_token_ids=eos if eos is not None else frozenset({tokenizer.eos_token_id}))


def seq(params: SO, output: list[int] = (), rid: str = "r") -> Sequence:
    s = Sequence(request_id=rid, token_ids=[1, 2, *output], num_prompt_tokens=2,
                 params=SamplingParams(max_tokens=64, structured_outputs=params))
    return s


def allowed(m: StructuredOutputManager, s: Sequence) -> set[int]:
    logits = torch.zeros(1, m.vocab_size)
    m.apply_masks(logits, [s])
    return set(torch.nonzero(logits[0] == 0).flatten().tolist())


def test_the_message_is_xgrammars_first_line_without_its_location():
    assert _message(RuntimeError("[12:00:00] /src/grammar.cc:42: Unexpected token\nmore")) \
        == "Unexpected token"
    assert _message(ValueError("")) == "ValueError"
    assert _message(ValueError("\n  \nsecond")) == "second"
    assert _message(RuntimeError("x" * 500)) == "x" * 300


def test_grammars_are_compiled_once_and_the_least_recently_used_goes_first(tokenizer):
    m = manager(tokenizer, cached=2)
    a, b, c = SO(regex="a+"), SO(regex="b+"), SO(regex="c+")
    first = m.compile(a)
    assert m.compile(SO(regex="a+")) is first and m.num_compiled == 1
    m.compile(b)
    m.compile(a)          # a used last: b is the least recently used
    m.compile(c)          # three grammars for two places: b goes
    assert m.num_compiled == 3
    m.compile(a)
    assert m.num_compiled == 3          # still cached
    m.compile(b)
    assert m.num_compiled == 4          # compiled again


def test_a_schema_given_as_json_text_is_the_schema(tokenizer):
    m = manager(tokenizer)
    text = '{"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}'
    for params in (SO(json=text), SO(json={"type": "object", "required": ["n"],
                                           "properties": {"n": {"type": "integer"}}})):
        matcher = xgrammar.GrammarMatcher(m.compile(params))
        assert matcher.accept_string('{"n": 4')   # compact: xgrammar's ', ' and ': '
        assert not xgrammar.GrammarMatcher(m.compile(params)).accept_string('{"m"')


def test_schemas_are_strict_no_property_the_schema_does_not_name(tokenizer):
    m = manager(tokenizer)
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    matcher = xgrammar.GrammarMatcher(m.compile(SO(json=schema)))
    assert matcher.accept_string('{"n": 1')
    assert not matcher.accept_string(', "extra": 2')


def test_an_invalid_constraint_names_the_field_and_xgrammars_reason(tokenizer):
    m = manager(tokenizer)
    with pytest.raises(ValueError) as info:
        m.compile(SO(regex="(unclosed"))
    message = str(info.value)
    assert message.startswith("structured_outputs.regex is invalid: ")
    reason = message.removeprefix("structured_outputs.regex is invalid: ")
    assert reason and reason != "None" and ".cc:" not in reason
    assert m.num_compiled == 0


def test_padded_vocabulary_ids_are_forbidden_and_the_models_stop_tokens_end(tokenizer):
    """A model's vocabulary is often padded past the tokenizer's (ids no text maps to):
    the mask forbids them. Once the grammar is complete only the model's own stop tokens
    (here one the tokenizer does not call EOS) are left."""
    stop = tokenizer.convert_tokens_to_ids(tokenizer.tokenize("!")[0])
    m = manager(tokenizer, pad=64, eos=frozenset({stop}))
    done = tokenizer.encode("yes", add_special_tokens=False)
    at_start = allowed(m, seq(SO(choice=["yes", "no"])))
    assert at_start and max(at_start) < len(tokenizer)          # no padded id
    assert allowed(m, seq(SO(choice=["yes", "no"]), done, rid="done")) == {stop}


def test_one_matcher_per_sequence_rebuilt_by_replaying_its_output(tokenizer, monkeypatch):
    built = []

    class Counting(xgrammar.GrammarMatcher):
        def __init__(self, *args, **kwargs):
            built.append(args)
            super().__init__(*args, **kwargs)
    monkeypatch.setattr(xgrammar, "GrammarMatcher", Counting)
    m = manager(tokenizer)
    ids = tokenizer.encode("123", add_special_tokens=False)
    s = seq(SO(regex="[0-9]{3}x"))
    for token in ids:             # steps: a mask, then the committed token
        allowed(m, s)
        m.accept(s, token)
        s.token_ids.append(token)
    assert len(built) == 1 and m.num_matchers == 1
    after_digits = allowed(m, s)
    # a sequence that already has output (a preempted one, recomputed) gets a matcher
    # that has seen it: the same mask as the one that followed it step by step
    again = seq(SO(regex="[0-9]{3}x"), ids, rid="again")
    assert allowed(m, again) == after_digits and len(built) == 2
    assert tokenizer.encode("x", add_special_tokens=False)[0] in after_digits
    m.forget(s)
    m.forget(again)
    assert m.num_matchers == 0


def test_the_256_most_recently_used_grammars_stay_compiled(tokenizer):
    m = StructuredOutputManager(tokenizer, vocab_size=len(tokenizer),
                                eos_token_ids=frozenset({tokenizer.eos_token_id}))
    assert m.max_cached_grammars == 256   # engine/entrypoints/README.md says so


def test_a_token_the_grammar_refuses_is_an_error_naming_it(tokenizer):
    m = manager(tokenizer)
    s = seq(SO(regex="[0-9]+"))
    letter = tokenizer.encode("x", add_special_tokens=False)[0]
    allowed(m, s)
    with pytest.raises(RuntimeError, match=rf"^token {letter} does not fit the request's "
                                           r"grammar$"):
        m.accept(s, letter)
