"""OpenLoop: the open-loop arrival process the Locust users and the simulator share."""
import pytest

from loadtests.workloads.base import REVISIT_IDLE_SESSION, OpenLoop
from word_tokenizer import WordTokenizer


def _arrivals(idle_at, n=200):
    """n gaps and picks of one user's loop, with `idle_at(i)` sessions idle at arrival i."""
    loop, gaps, picks = OpenLoop(seed=5, user=2, rate=4.0), [], []
    for i in range(n):
        gaps.append(loop.gap())
        idle = list(range(idle_at(i)))
        picks.append(loop.pick(idle))
    return gaps, picks


def test_arrival_times_do_not_depend_on_which_sessions_are_idle():
    none_idle, _ = _arrivals(lambda i: 0)
    some_idle, picks = _arrivals(lambda i: i % 4)
    assert none_idle == some_idle
    assert any(p is not None for p in picks)   # the idle ones were used
    # and the choices too: where both had sessions idle, both continued one or neither
    _, always = _arrivals(lambda i: 3)
    both = [i for i in range(len(picks)) if i % 4]
    assert [picks[i] is None for i in both] == [always[i] is None for i in both]


def test_an_arrival_continues_an_idle_session_at_the_stated_share():
    _, picks = _arrivals(lambda i: 3, n=4000)
    share = sum(p is not None for p in picks) / len(picks)
    assert abs(share - REVISIT_IDLE_SESSION) < 0.03
    assert {p for p in picks if p is not None} == {0, 1, 2}   # any of the idle ones
    assert _arrivals(lambda i: 0, n=50)[1] == [None] * 50   # nothing idle: a new session


def test_the_gaps_are_poisson_at_the_rate_and_seeded():
    gaps, _ = _arrivals(lambda i: 0, n=20_000)
    assert abs(sum(gaps) / len(gaps) - 1 / 4.0) < 0.01
    assert OpenLoop(1, 0, 4.0).gap() != OpenLoop(2, 0, 4.0).gap()
    assert OpenLoop(1, 0, 4.0).gap() != OpenLoop(1, 1, 4.0).gap()
    with pytest.raises(ValueError, match="rate must be > 0"):
        OpenLoop(1, 0, 0.0)


def test_the_simulators_stream_arrives_alike_whether_replies_finish_or_not():
    from loadtests.workloads import get_workload
    from tuner.sim.stream import Renderer, WorkloadStream

    def run(reply: bool):
        stream = WorkloadStream(get_workload("chat"), rate=20.0, users=3, seed=4,
                                render=Renderer(WordTokenizer()), length_scale=0.1,
                                max_model_len=4096)
        times, continued = [], 0
        for _ in range(300):
            request = stream.pop()
            times.append(request.arrival)
            continued += len(request.prompt_ids) > 60   # a turn carrying a history
            if reply:
                stream.finished(request, output_tokens=8)
        return times, continued

    replied, quiet = run(True), run(False)
    assert replied[0] == quiet[0]
    assert replied[1] > quiet[1]   # finished replies were continued, in the same arrivals


def _waiting_over_time(name: str, arrivals: int = 12_000, lag: int = 24):
    """A workload's simulator stream whose replies finish `lag` arrivals after they were
    sent: the sessions waiting every 100 arrivals, and the stream at the end."""
    from loadtests.workloads import get_workload
    from tuner.sim.stream import Renderer, WorkloadStream

    stream = WorkloadStream(get_workload(name), rate=50.0, users=8, seed=1,
                            render=Renderer(WordTokenizer()), length_scale=0.2,
                            max_model_len=1 << 20)
    sent, waiting = [], []
    for i in range(arrivals):
        sent.append(stream.pop())
        if len(sent) > lag:
            stream.finished(sent.pop(0), output_tokens=12)
        if i % 100 == 0:
            waiting.append(sum(map(len, stream.idle)))
    return waiting, stream, len(sent)


@pytest.mark.parametrize("name, share", [
    ("chat", 0.75),      # 2-6 turns: 3 continuations of 4 requests
    ("agentic", 0.78),   # 2-5 tool calls and the answer: 3.5 of 4.5
    ("mixed", None)])
def test_multi_turn_workloads_reach_a_steady_state(name, share):
    """The sessions waiting for their next turn stop growing, and nearly every session
    runs all its turns: a finished session leaves the pool, and an arrival continues a
    waiting one often enough ((turns - 1) / turns < REVISIT_IDLE_SESSION). With a finished
    session parked again, or the share back at 0.7, the chat pool grows without end."""
    waiting, stream, in_flight = _waiting_over_time(name)
    half = len(waiting) // 2
    first, second = waiting[:half], waiting[half:]
    assert max(second) <= 12 * 8                  # at most a dozen per user
    assert sum(second) / len(second) <= 1.5 * sum(first) / len(first) + 2
    started = sum(stream.started)
    assert started > 1000
    unfinished = sum(map(len, stream.idle)) + in_flight
    assert unfinished / started < 0.05
    if share is not None:   # the share of arrivals that continue one: the workload's own
        assert abs(1 - started / stream.count - share) < 0.02
    assert REVISIT_IDLE_SESSION == 0.9   # the README's figure (tuner/README.md, Load)


def test_single_shot_workloads_leave_nothing_waiting():
    waiting, stream, _ = _waiting_over_time("summarize", arrivals=2000)
    assert max(waiting) == 0
    assert sum(stream.started) == 2000
