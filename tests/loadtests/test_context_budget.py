"""Multi-turn sessions keep their history inside the model's context (base.ContextBudget):
told max_model_len, and fed each prompt's tokens as the server counted them, chat and
agentic sessions end (chat) or answer (agentic) before a request the server would refuse."""
import random

import pytest

from loadtests.workloads import get_workload
from loadtests.workloads.base import ContextBudget


def _tokens(request) -> int:
    """A tokenizer of one token per word plus 3 per message (a chat template's markup)."""
    return sum(len(m["content"].split()) + 3 for m in request.body["messages"])


def _drive(name, *, context, scale, sessions=150, counted=True, unanswered=None):
    """Every request of `sessions` sessions: (turn, prompt tokens + max_tokens); agentic
    sessions that ended without their final answer are appended to `unanswered`."""
    spec, out = get_workload(name), []
    user = random.Random(7)
    for _ in range(sessions):
        session = spec.start_session(user, scale, context)
        turn = 0
        while (request := session.next_request()) is not None:
            n = _tokens(request)
            out.append((turn, n + request.body["max_tokens"]))
            reply = " ".join(["word"] * request.body["max_tokens"])   # as long as asked
            session.record_response(reply, n if counted else None)
            turn += 1
        if name == "agentic" and unanswered is not None and turn != len(session.calls) + 1:
            unanswered.append(session)
    return out


@pytest.mark.parametrize("name, scale, context", [("agentic", 0.2, 380), ("chat", 1.0, 900)])
def test_sessions_told_the_context_send_nothing_past_it(name, scale, context):
    free, unanswered = _drive(name, context=None, scale=scale), []
    told = _drive(name, context=context, scale=scale, unanswered=unanswered)
    assert sum(n > context for _, n in free) > 0.05 * len(free)   # the limit bites
    assert max(n for _, n in told) <= context
    assert not unanswered   # an agent keeps room for its answer (its longest step's)
    # not by ending everything early: the sessions still run several turns and fill most
    # of the context (agentic keeps room for its longest step and answer)
    assert len(told) >= 2.5 * 150 and max(n for _, n in told) >= 0.7 * context
    assert max(turn for turn, _ in told) >= 2


@pytest.mark.parametrize("name", ["agentic", "chat"])
def test_a_context_never_approached_leaves_the_stream_as_it_was(name):
    assert _drive(name, context=1 << 20, scale=0.5) == _drive(name, context=None, scale=0.5)


def test_without_counted_prompts_nothing_is_estimated():
    """A request that failed reports no tokens: with none ever counted the session cannot
    estimate its history and runs on its word limits alone, as without a context."""
    assert _drive("agentic", context=380, scale=0.2, counted=False) == _drive(
        "agentic", context=None, scale=0.2)


def test_the_budget_estimates_at_the_last_counted_prompts_tokens_per_character():
    budget = ContextBudget()
    assert budget.fits(10**9, 10**9)            # no context: everything fits
    budget.context = 1000
    assert budget.fits(10**9, 0)                # no prompt counted yet
    budget.sent(2000)
    budget.served(500)                          # 0.25 tokens per character
    limit = (1000 - 100) / (budget.MARGIN * 0.25)
    assert budget.fits(int(limit), 100) and not budget.fits(int(limit) + 2, 100)
    budget.sent(4000)
    budget.served(None)                         # a failed request: the ratio stays
    assert budget.fits(int(limit), 100) and not budget.fits(int(limit) + 2, 100)
    budget.served(2000)                         # 0.5 per character now
    assert not budget.fits(int(limit), 100)


def test_an_agent_whose_answer_cannot_fit_ends_unanswered():
    """The first request (no count yet) goes out; if its count shows that not even the
    final answer fits, the session ends instead of sending a request the server refuses."""
    session = get_workload("agentic").start_session(random.Random(3), 0.2, 150)
    first = session.next_request()
    session.record_response("not a call", _tokens(first))
    assert _tokens(first) > 150 - 26 and session.next_request() is None
