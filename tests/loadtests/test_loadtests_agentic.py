"""The agentic workload: seeded tool-calling sessions whose history carries every call and
tool result, calls that follow the tools' JSON schema, and a final answer."""
import json
import random

from loadtests.workloads import WORKLOAD_NAMES, get_workload
from loadtests.workloads import agentic
from word_tokenizer import WordTokenizer


def _run(seed, reply=lambda request: "not a tool call"):
    session, requests = agentic.AgentSession(random.Random(seed)), []
    while (request := session.next_request()) is not None:
        requests.append(request)
        session.record_response(reply(request))
    return session, requests


def _call_in(message):
    text = message["content"]
    assert text.startswith("<tool_call>\n") and text.endswith("\n</tool_call>")
    return json.loads(text[len("<tool_call>\n"):-len("\n</tool_call>")])


def test_listed_and_its_slos_and_chat_endpoint():
    assert "agentic" in WORKLOAD_NAMES
    spec = get_workload("agentic")
    assert spec is agentic.WORKLOAD and set(spec.slos) == {"agentic"}
    assert set(spec.slos["agentic"]) == {"ttft", "tpot", "e2e"}
    _, requests = _run(0)
    assert all(r.path == "/v1/chat/completions" and r.kind == "agentic" for r in requests)


def test_sessions_are_deterministic_per_seed():
    assert _run(3)[1] == _run(3)[1]
    assert _run(3)[1] != _run(4)[1]


def test_each_turn_carries_the_history_the_calls_and_the_tool_results():
    session, requests = _run(1)
    assert len(requests) == session.steps + 1 and agentic.STEPS[0] <= session.steps <= \
        agentic.STEPS[1]
    system = requests[0].body["messages"][0]
    assert system["role"] == "system" and "<tools>" in system["content"]
    for t in agentic.TOOLS:  # every tool's schema is in the system prompt
        assert json.dumps(t["function"], sort_keys=True) in system["content"]
    for step, (before, after) in enumerate(zip(requests, requests[1:])):
        old, new = before.body["messages"], after.body["messages"]
        assert new[:len(old)] == old and len(new) == len(old) + 2
        assert new[-2]["role"] == "assistant" and _call_in(new[-2]) == session.calls[step]
        result = new[-1]
        assert result["role"] == "user" and result["content"].startswith("<tool_response>")
        payload = json.loads(result["content"].split("\n")[1])
        assert payload["tool"] == session.calls[step]["name"] and payload["content"]
    for request in requests[:-1]:
        assert agentic.CALL_TOKENS[0] <= request.body["max_tokens"] <= agentic.CALL_TOKENS[1]
    assert agentic.ANSWER_TOKENS[0] <= requests[-1].body["max_tokens"] <= \
        agentic.ANSWER_TOKENS[1]


def test_calls_follow_the_schema_across_sessions_and_use_every_tool():
    required = {t["function"]["name"]: t["function"]["parameters"] for t in agentic.TOOLS}
    used = set()
    for seed in range(30):
        for call in _run(seed)[0].calls:
            params = required[call["name"]]
            assert sorted(call["arguments"]) == sorted(params["required"])
            for key, value in call["arguments"].items():
                kind = params["properties"][key]["type"]
                assert type(value) is {"string": str, "integer": int}[kind]
            used.add(call["name"])
    assert used == set(required)


def test_a_valid_call_from_the_model_is_kept_and_an_invalid_one_replaced():
    mine = {"name": "get_ticket", "arguments": {"ticket_id": 42}}
    session, _ = _run(2, reply=lambda r: agentic.call_text(mine))
    assert session.calls == [mine] * session.steps
    for bad in ('{"name": "get_ticket", "arguments": {"ticket_id": "42"}}',
                '{"name": "rm_rf", "arguments": {}}',
                '{"name": "read_file", "arguments": {"path": "a", "extra": 1}}',
                '{"name": "get_ticket", "arguments": {"ticket_id": true}}', "<tool_call>{"):
        assert agentic.parse_call(bad) is None
    assert agentic.parse_call(json.dumps(mine)) == mine
    # the seeded stream does not depend on what the model replied
    tokens = [r.body["max_tokens"] for r in _run(2)[1]]
    assert tokens == [r.body["max_tokens"] for r in _run(2, lambda r: agentic.call_text(mine))[1]]


def test_a_long_history_ends_in_the_final_answer_and_lengths_scale(monkeypatch):
    monkeypatch.setattr(agentic, "MAX_HISTORY_WORDS", 1)
    session, requests = _run(1)
    assert len(requests) == 1 and session.calls == []  # straight to the answer
    monkeypatch.undo()
    small = agentic.AgentSession(random.Random(1), 0.1).next_request().body["messages"]
    full = agentic.AgentSession(random.Random(1)).next_request().body["messages"]
    assert len(small[0]["content"]) < len(full[0]["content"])
    assert len(small[1]["content"].split()) <= agentic.TASK_WORDS[1] * 0.1 + 2


def test_locust_runs_agent_loops_against_a_server(tmp_path):
    from fake_openai_server import FakeOpenAIServer
    from tuner.measure.loadgen import LoadSpec, run_load
    from tuner.measure.scoring import load_samples

    with FakeOpenAIServer(ttft=0.005, itl=0.001) as server:
        path = run_load(LoadSpec(workload="agentic", duration=2, users=2, length_scale=0.1,
                                 seed=1), url=server.url, workdir=tmp_path)
        bodies = list(server.requests)
    ok = [r for r in load_samples(path).records if r["ok"]]
    assert ok and all(r["kind"] == "agentic" for r in ok)
    # the server's text is no call: the agent's own calls and their results are the history
    # (a final answer is never resent: the session ends with it)
    later = [m for b in bodies for m in b["messages"][2:]]
    assert later and all(agentic.parse_call(m["content"]) for m in later
                         if m["role"] == "assistant")
    assert any(m["content"].startswith("<tool_response>") for m in later)


def test_the_simulators_stream_runs_agent_loops_to_their_answers():
    from tuner.sim.stream import Renderer, WorkloadStream

    stream = WorkloadStream(get_workload("agentic"), rate=20.0, users=2, seed=4,
                            render=Renderer(WordTokenizer()), length_scale=0.2,
                            max_model_len=8192)
    sessions = {}
    for _ in range(200):
        request = stream.pop()
        assert request.kind == "agentic" and request.max_tokens >= 1
        sessions.setdefault(id(request.session), request.session)
        stream.finished(request, output_tokens=request.max_tokens)
    # the simulated replies are words, no calls: the sessions' own calls carry them on
    calls = [c for s in sessions.values() for c in s.calls]
    assert calls and all(agentic.follows_schema(c) for c in calls)
    assert any(s.next_request() is None for s in sessions.values())  # some reached the end


def test_locust_agents_keep_inside_the_servers_context(tmp_path):
    """The Locust user reads max_model_len from /v1/models and feeds each reply's
    usage.prompt_tokens back to its session: against a server that refuses a prompt and
    max_tokens past 380 tokens, agents answer before it; told nothing, they are refused."""
    from fake_openai_server import FakeOpenAIServer
    from tuner.measure.loadgen import LoadSpec, run_load
    from tuner.measure.scoring import load_samples

    def run(report, workdir):
        with FakeOpenAIServer(ttft=0.002, itl=0.001, max_model_len=380,
                              report_max_model_len=report) as server:
            path = run_load(LoadSpec(workload="agentic", duration=2, users=2,
                                     length_scale=0.2, seed=1), url=server.url,
                            workdir=workdir)
            records = load_samples(path).records
            return server.refused, [r for r in records if r["ok"]], server.requests

    (tmp_path / "told").mkdir(), (tmp_path / "blind").mkdir()
    refused, ok, bodies = run(True, tmp_path / "told")
    assert refused == 0 and len(ok) >= 20
    # the agents still worked several steps (a history with two tool results and more)
    assert max(sum(m["role"] == "user" for m in b["messages"]) for b in bodies) >= 3
    refused_blind, _, _ = run(False, tmp_path / "blind")
    assert refused_blind > 0
