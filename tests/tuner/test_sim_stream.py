"""The simulator's request stream (tuner/sim/stream.py): what a finished reply adds to its
session's history."""
import random

import pytest

from loadtests.workloads import get_workload
from tuner.sim.stream import Renderer, SimRequest, WorkloadStream
from word_tokenizer import WordTokenizer


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
    for _ in range(20):
        stream.idle[0].clear()     # each arrival a new session
        first = stream.pop()
        stream.finished(first, output_tokens)
        if not stream.idle[0]:      # that was its last turn
            continue
        session, following = stream.idle[0][-1]   # it waits with its next turn
        assert session is first.session
        reply = [m for m in following.body["messages"] if m["role"] == "assistant"][-1]
        lengths.append(len(tokenizer.encode(reply["content"], add_special_tokens=False)))
    assert len(lengths) >= 10
    mean = sum(lengths) / len(lengths)
    assert 0.75 * output_tokens - 1 <= mean <= 1.25 * output_tokens + 2
    # the figure it rests on: this tokenizer's tokens per word of the workloads' words
    assert 1.5 < render.tokens_per_word < 4.0


def _turns(rate: float, finish_order, requests: int = 120) -> dict:
    """(user, its k-th session, turn) -> the prompt's token ids, for a stream whose
    requests finish in batches in `finish_order` (a function of the batch)."""
    render = Renderer(_tokenizer())
    stream = WorkloadStream(get_workload("chat"), rate=rate, users=2, render=render, seed=5,
                            max_model_len=4096)
    seen: dict = {}
    keys: dict = {}         # id(session) -> (user, k)
    started = [0, 0]
    sessions = []           # kept alive, so that no id is reused
    batch: list[SimRequest] = []
    for _ in range(requests):
        request = stream.pop()
        if id(request.session) not in keys:
            keys[id(request.session)] = (request.user, started[request.user])
            started[request.user] += 1
            sessions.append(request.session)
        user, k = keys[id(request.session)]
        turn = sum(m["role"] == "user" for m in request.session.messages)
        seen[(user, k, turn)] = request.prompt_ids
        batch.append(request)
        if len(batch) == 3:
            for done in finish_order(batch):
                stream.finished(done, 16)
            batch = []
    return seen


def test_a_sessions_turns_are_the_same_whatever_the_rate_and_the_finishing_order():
    """An open loop interleaves a user's sessions in the order the server's speed decides;
    a session's j-th turn still reads the same prompt (its own generator: its user's words
    and its replies), so the Renderer renders each once for every probe and setting of a
    sweep, and two settings are measured on the same conversations."""
    slow = _turns(1.0, lambda batch: batch)
    fast = _turns(40.0, lambda batch: batch[::-1])
    common = set(slow) & set(fast)
    assert len(common) >= 40 and any(turn > 1 for _, _, turn in common)
    assert all(slow[key] == fast[key] for key in common)


def test_a_users_kth_session_does_not_depend_on_the_turns_drawn_before_it():
    """WorkloadSpec.start_session, which the Locust users call too: the k-th session of a
    user is the same conversation however many turns its earlier sessions took."""
    spec = get_workload("chat")

    def second_session(turns_of_first: int) -> list:
        rng = random.Random(11)
        first = spec.start_session(rng, 1.0)
        for _ in range(turns_of_first):
            if first.next_request() is not None:
                first.record_response("a reply")
        second = spec.start_session(rng, 1.0)
        return [second.next_request().body for _ in range(2)]

    assert second_session(0) == second_session(3)


def test_a_history_past_the_models_length_is_refused_as_the_server_refuses_it():
    """A request past max_model_len: the server answers 400 (engine/entrypoints/
    serving.length_refusal), and the simulator refuses the same requests, unserved and
    unshortened, where it used to cut the prompt and serve it; the conversation goes on
    with an empty reply, as the load client records one. (A conversation plans its later
    turns inside the context from its counted prompts, test_context_budget.py; its first
    turn, and every turn after a refused one, has no count to plan by.)"""
    from engine.entrypoints.serving import length_refusal

    limit = 440   # chat's first turns' prompts + max_tokens here: about 350-480 words
    stream = WorkloadStream(get_workload("chat"), rate=5.0, users=2, seed=2,
                            render=Renderer(WordTokenizer()), max_model_len=limit)
    refused = served = 0
    for _ in range(400):
        request = stream.pop()
        verdict = length_refusal(len(request.prompt_ids), request.max_tokens, limit)
        assert (request.refused is not None) == (verdict is not None)
        if request.refused:
            refused += 1
            assert "max_model_len" in request.refused
            assert len(request.prompt_ids) + request.max_tokens > limit   # not cut
            stream.finished(request, 0)
        else:
            served += 1
            stream.finished(request, 12)
    assert refused > 100 and served > 100   # both kinds, mixed in one stream


def test_the_simulator_scores_a_refused_request_as_failed_without_serving_it():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    from tuner.sim.simulate import simulate
    from test_sim_settle import PROFILE

    def run(limit):
        stream = WorkloadStream(get_workload("chat"), rate=4.0, users=2, seed=2,
                                render=Renderer(WordTokenizer()), max_model_len=limit)
        return simulate(PROFILE, dict(max_num_seqs=64, cpu_memory_gib=0.5), stream,
                        duration=40.0, slos={"chat": {"ttft": 5.0, "tpot": 0.5}},
                        hf_config=AutoConfig.from_pretrained(resolve_model_path(None)))

    short, roomy = run(420), run(1 << 16)
    failed = [r for r in short.samples.records if (r.get("error") or "").startswith("HTTP 400")]
    assert failed and all(not r["ok"] and r["output_tokens"] == 0 for r in failed)
    assert not [r for r in roomy.samples.records if "HTTP 400" in (r.get("error") or "")]
    assert short.figures["slo_attainment"] < roomy.figures["slo_attainment"]
    assert len(short.samples.records) == len(roomy.samples.records)   # the same arrivals


def test_agents_on_the_embedded_model_answer_inside_its_context():
    """The embedded model's tokenizer spends ~3.5 tokens a word: at the tuner's CPU length
    scale (0.25) an agentic history outgrew its 2,048 tokens from the fourth step on, and
    a steady stream's late steps were refused (HTTP 400). The stream tells its sessions
    max_model_len and each served prompt's count, so the agents answer inside it."""
    def requests(max_model_len):
        stream = WorkloadStream(get_workload("agentic"), rate=8.0, users=4, seed=1,
                                render=Renderer(_tokenizer()), length_scale=0.25,
                                max_model_len=max_model_len)
        out = []
        for _ in range(300):
            request = stream.pop()
            out.append(request)
            stream.finished(request, 0 if request.refused else request.max_tokens)
        return out

    told = requests(2048)
    assert not [r for r in told if r.refused]
    assert max(len(r.prompt_ids) + r.max_tokens for r in told) <= 2048
    # the budget is what keeps them inside: with room to spare, the same sessions pass it
    roomy = requests(1 << 16)
    assert sum(len(r.prompt_ids) + r.max_tokens > 2048 for r in roomy) >= 10
