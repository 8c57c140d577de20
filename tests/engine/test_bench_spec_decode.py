"""benchmarks/bench_spec_decode.py's workloads and columns (issue 37's table): the agentic
workload's conversations, the tokens-per-step arithmetic, and the suffix tree's memory
table (benchmarks/suffix_memory.py)."""
from __future__ import annotations

from benchmarks import suffix_memory
from benchmarks.bench_spec_decode import prompts, tokens_per_step
from benchmarks.suffix_memory import outputs
from loadtests.workloads.agentic import parse_call


def test_agentic_prompts_are_tool_calling_steps_with_earlier_calls_and_results():
    convs = prompts("agentic", 24, seed=3)
    assert convs == prompts("agentic", 24, seed=3)          # seeded
    assert len({str(c) for c in convs}) == 24                  # distinct per request
    assert {c[0]["content"] for c in convs} == {convs[0][0]["content"]}  # one system prompt
    assert "<tools>" in convs[0][0]["content"] and convs[0][0]["role"] == "system"
    # 0, 1 or 2 earlier steps: each adds the agent's call and the tool's result
    assert {len(c) for c in convs} == {2, 4, 6}
    for conv in convs:
        assert [m["role"] for m in conv] == ["system", "user"] + ["assistant", "user"] * (
            (len(conv) - 2) // 2)
        for call, result in zip(conv[2::2], conv[3::2]):
            assert parse_call(call["content"]) is not None
            assert result["content"].startswith("<tool_response>")


def test_the_other_workloads_are_single_user_messages():
    for workload in ("summarize", "code", "code-edit", "chat"):
        texts = prompts(workload, 3, seed=0)
        assert all(isinstance(t, str) for t in texts) and len(set(texts)) == 3


def test_tokens_per_step_counts_each_sequence_step_once():
    # 120 tokens of which 40 came from accepted drafts: 80 steps
    assert tokens_per_step([30, 90, 40, None], 120) == "1.50"
    assert tokens_per_step([0, 0, 0, None], 64) == "1.00"       # no speculation
    assert tokens_per_step([0, 0, 0, None], 0) == "–"           # nothing served


class _CharTokenizer:
    """One id per character: enough to count what the tree holds."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_the_outputs_are_tool_calls_in_sessions_with_a_final_answer():
    texts = ["".join(map(chr, ids)) for ids in outputs(_CharTokenizer(), 40)]
    calls = [t for t in texts if t.startswith("<tool_call>")]
    assert all(parse_call(t) is not None for t in calls)
    answers = len(texts) - len(calls)
    assert 40 // 6 <= answers <= 40 // 3       # one answer after every 2-5 calls


def test_the_memory_table_levels_off_at_the_cached_request_bound(capsys):
    suffix_memory.run(_CharTokenizer(), 60, checkpoints=(20, 40), max_cached=20)
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| ") and line[2].isdigit()]
    assert [int(r[0]) for r in rows] == [20, 40, 60]
    assert [int(r[1]) for r in rows] == [20, 20, 20]           # the FIFO's bound
    for added, cached, tokens, nodes, mib, per_token, _ in rows:
        assert 0 < int(nodes) <= 24 * int(tokens)
        assert abs(float(mib) * 2**20 / int(tokens) - int(per_token)) <= 0.05 * 2**20 / int(
            tokens) + 1


def test_bfloat16_counts_identical_outputs_where_float32_asserts_them(capsys):
    from benchmarks.bench_spec_decode import main

    common = ["--workloads", "summarize", "--concurrency", "1", "--k", "2", "--rounds", "1",
              "--max-tokens", "6", "--warmup", "0", "--requests", "2", "--threads", "1"]
    main(common + ["--dtype", "bfloat16"])
    out = capsys.readouterr().out
    assert "bfloat16, greedy" in out.splitlines()[0]
    tally = out.split("(greedy): ")[1].strip()
    counts = dict(part.rsplit(" ", 1) for part in tally.split("; "))
    assert set(counts) == {"summarize 1 off", "summarize 1 k=2"}
    # off is the round's first configuration: its outputs equal themselves
    assert counts["summarize 1 off"] == "2/2"
    assert int(counts["summarize 1 k=2"].split("/")[0]) <= 2
    main(common)                                    # float32: asserted, nothing counted
    assert "(greedy)" not in capsys.readouterr().out
