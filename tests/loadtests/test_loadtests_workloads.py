"""Seeded workload generators: determinism, prefix sharing, length bounds, SLOs."""
import random
from collections import Counter

import pytest

from loadtests.workloads import WORKLOAD_NAMES, get_workload
from loadtests.workloads import chat, rag, summarize
from loadtests.workloads.base import WorkloadSpec


def _stream(name, seed, n=12, scale=1.0):
    spec, rng, out = get_workload(name), random.Random(seed), []
    session = None
    while len(out) < n:
        request = session.next_request() if session else None
        if request is None:
            session = spec.new_session(rng, scale)
            continue
        out.append(request)
        session.record_response(f"reply {len(out)}")
    return out


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_same_seed_same_requests_and_another_seed_differs(name):
    assert _stream(name, 3) == _stream(name, 3)
    assert _stream(name, 3) != _stream(name, 4)
    for request in _stream(name, 3):
        assert request.path in ("/v1/completions", "/v1/chat/completions")
        assert request.body["max_tokens"] >= 1
        assert request.kind in get_workload(name).slos


GREEDY = ("code", "agentic")   # an editor's completions and an agent's tool calls


@pytest.mark.parametrize("name", WORKLOAD_NAMES)
def test_code_and_agent_requests_are_greedy_the_others_sample_at_the_servers_default(name):
    for request in _stream(name, 5, n=40):
        if request.kind in GREEDY:
            assert request.body["temperature"] == 0.0, request
        else:
            assert "temperature" not in request.body, request


def test_chat_history_grows_and_the_system_prompt_is_shared_across_users():
    a = chat.Conversation(random.Random(1))
    first = a.next_request()
    a.record_response("an answer")
    second = a.next_request()
    assert second.body["messages"][:len(first.body["messages"])] == first.body["messages"]
    assert second.body["messages"][len(first.body["messages"])]["content"] == "an answer"
    b = chat.Conversation(random.Random(2)).next_request()
    assert b.body["messages"][0] == first.body["messages"][0]
    assert b.body["messages"][1] != first.body["messages"][1]


def test_chat_conversation_ends_within_its_turns():
    conversation, turns = chat.Conversation(random.Random(5)), 0
    while conversation.next_request() is not None:
        conversation.record_response("ok")
        turns += 1
    assert chat.TURNS[0] <= turns <= chat.TURNS[1]


def test_summarize_lengths_follow_the_documented_distribution_and_scale():
    rng = random.Random(0)
    for _ in range(20):
        body = summarize.new_session(rng).next_request().body
        doc_words = len(body["prompt"].split("\n\n")[0].split()) - 1  # minus "Document:"
        assert summarize.DOC_WORDS[0] <= doc_words <= summarize.DOC_WORDS[1]
        assert summarize.SUMMARY_TOKENS[0] <= body["max_tokens"] <= summarize.SUMMARY_TOKENS[1]
    small = summarize.new_session(random.Random(0), 0.1).next_request().body
    assert len(small["prompt"].split()) < summarize.DOC_WORDS[1] * 0.1 + 20


def test_rag_prepends_shared_documents_in_varying_combinations():
    docs = rag.corpus()
    rng, seen = random.Random(0), set()
    for _ in range(30):
        prompt = rag.new_session(rng).next_request().body["prompt"]
        # documents in the order they appear in the prompt
        used = tuple(i for _, i in sorted((prompt.index(d), i) for i, d in enumerate(docs)
                                          if d in prompt))
        assert rag.DOCS_PER_REQUEST[0] <= len(used) <= rag.DOCS_PER_REQUEST[1]
        assert prompt.startswith(docs[used[0]])  # the prompt opens with a whole document
        seen.add(used)
    assert len(seen) > 5


def test_mixed_draws_kinds_by_weight_and_keeps_each_kinds_slos():
    spec, rng = get_workload("mixed"), random.Random(0)
    kinds = Counter(spec.new_session(rng, 1.0).kind for _ in range(2000))
    assert 0.35 < kinds["chat"] / 2000 < 0.45 and 0.15 < kinds["code"] / 2000 < 0.25
    assert spec.slos["code"] == get_workload("code").slos["code"]


def test_unknown_workload_and_unknown_slo_are_errors():
    with pytest.raises(ValueError, match="choose one of"):
        get_workload("nope")
    with pytest.raises(ValueError, match="unknown SLO"):
        WorkloadSpec(name="x", description="", new_session=None, slos={"x": {"p99": 1.0}})
