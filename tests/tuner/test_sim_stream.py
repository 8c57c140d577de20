"""The simulator's request stream (tuner/sim/stream.py): what a finished reply adds to its
session's history."""
import random

import pytest

from loadtests.workloads import get_workload
from tuner.sim.stream import Renderer, SimRequest, WorkloadStream


def _tokenizer():
    from transformers import AutoTokenizer

    from engine.model_loader import resolve_model_path
    return AutoTokenizer.from_pretrained(resolve_model_path(None))


@pytest.mark.parametrize("output_tokens", [16, 48])
def test_a_reply_lengthens_the_history_by_about_the_tokens_it_was_written_in(output_tokens):
    """The next turn reads the reply back: n tokens of reply are about n tokens of history
    (not the 2.5 n that n x 3/4 of the workloads' words cost the embedded tokenizer)."""
    tokenizer = _tokenizer()
    render = Renderer(tokenizer)
    stream = WorkloadStream(get_workload("chat"), rate=1.0, users=1, render=render, seed=3,
                            max_model_len=4096)
    lengths = []
    for number in range(1, 21):
        session = get_workload("chat").new_session(random.Random(number), 1.0)
        first = session.next_request()
        stream.finished(SimRequest(0.0, first.kind, render(first), 16, 0, session, number),
                        output_tokens)
        following = session.next_request()
        if following is None:
            continue
        reply = [m for m in following.body["messages"] if m["role"] == "assistant"][-1]
        lengths.append(len(tokenizer.encode(reply["content"], add_special_tokens=False)))
    assert len(lengths) >= 10
    mean = sum(lengths) / len(lengths)
    assert 0.75 * output_tokens - 1 <= mean <= 1.25 * output_tokens + 2
    # the figure it rests on: this tokenizer's tokens per word of the workloads' words
    assert 1.5 < render.tokens_per_word < 4.0
