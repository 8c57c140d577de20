"""A load whose every request fails is a failed trial with the server's reason, not a
measured goodput of 0 (which the search would rank beside slow settings and the
confirmation would compare as if measured); a load with some failures is still measured."""
import pytest

from fake_openai_server import FakeOpenAIServer
from tuner.measure.loadgen import LoadSpec
from tuner.measure.runner import Infeasible
from tuner.measure.trial import measure

pytestmark = pytest.mark.timeout(120)
LOAD = LoadSpec(workload="chat", duration=3, users=2, length_scale=0.1)


def test_every_request_failing_is_infeasible_with_the_servers_error(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.005, fail_every=1) as server:
        with pytest.raises(Infeasible, match=r"every request failed \(\d+ of \d+ with an "
                                             r"error\): HTTP 5"):
            measure(server.url, LOAD, {"chat": {"ttft": 1.0}}, workdir=tmp_path,
                    warmup_requests=0)
        assert len(server.requests) >= 2


def test_some_failures_are_measured_as_not_good(tmp_path):
    with FakeOpenAIServer(ttft=0.01, itl=0.005, fail_every=2) as server:
        figures = measure(server.url, LOAD, {"chat": {"ttft": 1.0}}, workdir=tmp_path,
                          warmup_requests=0)
    assert figures["failed"] >= 1 and figures["completed"] >= 1
    assert 0 < figures["goodput"]


def test_a_server_too_slow_to_finish_any_request_still_scores_zero(tmp_path):
    # nothing finishes inside the window, nothing is refused: a measured goodput of 0
    with FakeOpenAIServer(ttft=5.0, itl=0.005) as server:
        figures = measure(server.url, LOAD, {"chat": {"ttft": 1.0}}, workdir=tmp_path,
                          warmup_requests=0)
        assert server.requests
    assert figures["goodput"] == 0 and figures["completed"] == 0
