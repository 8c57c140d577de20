"""OpenLoop: the open-loop arrival process the Locust users and the simulator share."""
import pytest

from loadtests.workloads.base import REVISIT_IDLE_SESSION, OpenLoop


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


class _Tokenizer:
    def encode(self, text, **_):
        return [len(w) for w in text.split()]

    def apply_chat_template(self, messages, **_):
        return [len(w) for m in messages for w in m["content"].split()]


def test_the_simulators_stream_arrives_alike_whether_replies_finish_or_not():
    from loadtests.workloads import get_workload
    from tuner.sim.stream import Renderer, WorkloadStream

    def run(reply: bool):
        stream = WorkloadStream(get_workload("chat"), rate=20.0, users=3, seed=4,
                                render=Renderer(_Tokenizer()), length_scale=0.1,
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
