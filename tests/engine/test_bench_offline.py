"""benchmarks/bench_offline.py (the engine against transformers' peers) runs for real, and
the engine facts its decode rate reads."""
from benchmarks import bench_offline


def test_bench_offline_smoke_every_peer_does_the_requested_work(tmp_path, capsys):
    """A real, tiny run of benchmarks/bench_offline.py: every peer, three interleaved
    runs each, on one device and dtype; each counts exactly the tokens that were requested."""
    import json

    out = tmp_path / "bench.json"
    assert bench_offline.main([
        "--model", "builtin://default", "--num-requests", "6", "--max-model-len", "64",
        "--prompt-median", "12", "--output-median", "6", "--static-batch", "2", "--repeats",
        "3", "--prefill-shape", "4x8", "--json", str(out)]) == 0
    table = capsys.readouterr().out
    result = json.loads(out.read_text())
    peers = result["peers"]
    assert set(peers) == {"paged", "generate", "cb", "ceiling"}
    assert {(p["device"], p["dtype"]) for p in peers.values()} == {("cpu", "float32")}
    for key in ("paged", "generate", "cb"):
        runs = peers[key]["runs"]
        assert len(runs) == 3
        assert [r["generated"] for r in runs] == [result["requested_tokens"]] * 3, key
    # contiguous preallocation, read back from the StaticCache: batch x max_model_len slots
    assert {r["kv_slots"] for r in peers["generate"]["runs"]} == {2 * 64}
    assert {r["kv_slots"] for r in peers["paged"]["runs"]} == {2 * 64}
    # the ceiling decodes a static batch as large as the engine's peak concurrency
    concurrency = peers["paged"]["runs"][0]["concurrency"]
    assert concurrency > 2 and {r["concurrency"] for r in peers["ceiling"]["runs"]} == {
        concurrency}
    # the prefill comparison: the same 4 x 8 tokens through the engine and one forward
    assert result["prefill"]["shape"] == [4, 8]
    assert result["prefill"]["paged"]["steps"] == 1  # 32 tokens: one step of the engine
    assert result["prefill"]["paged"]["tok_s"] > 0 and result["prefill"]["ceiling"]["tok_s"] > 0
    assert "| prefill tok/s, 4 fresh prompts x 8 tokens" in table
    for name in ("paged (this engine)", "transformers generate, StaticCache",
                 "transformers generate_batch", "ceiling: transformers batched decode"):
        assert f"| {name} | cpu, float32 |" in table


def test_the_engine_reports_each_steps_shape_for_the_decode_rate():
    """`last_step_shape` is (sequences, tokens): a prefill step has more tokens than
    sequences, a decode step one token per sequence (the bench's decode filter)."""
    from engine import LLM, SamplingParams

    llm = LLM(model=None, max_num_batched_tokens=64, max_num_seqs=8)
    engine = llm.llm_engine
    engine.add_request("a", [5, 6, 7, 8, 9], SamplingParams(max_tokens=3, ignore_eos=True))
    engine.add_request("b", [5, 6, 7], SamplingParams(max_tokens=3, ignore_eos=True))
    shapes = []
    while engine.has_unfinished_requests():
        engine.step()
        shapes.append(engine.last_step_shape)
    assert shapes[0] == (2, 8)  # both prompts in one step
    assert shapes[1:] == [(2, 2), (2, 2)]


def test_the_paged_peer_times_only_pure_decode_steps_near_its_peak_batch():
    """4 prompts in one prefill step, then 5 steps that each decode all 4: the decode rate
    near the peak counts those 5 steps and their 20 tokens only."""
    from engine.model_loader import resolve_model_path
    from benchmarks.bench_peers import PagedPeer

    peer = PagedPeer(resolve_model_path("builtin://default"), num_blocks=64, block_size=16,
                     max_model_len=64, max_num_seqs=8, device="cpu", dtype="float32")
    run = peer.run([(list(range(5, 13)), 6)] * 3 + [(list(range(20, 28)), 6)])
    assert run["generated"] == 24 and run["concurrency"] == 4
    assert run["decode_peak_steps"] == 5 and run["decode_peak_tok_s"] > 0
    # ragged outputs: the steps after the short ones finish are below 90 % of the peak
    run = peer.run([(list(range(5, 13)), 2)] * 2 + [(list(range(5, 13)), 6)] * 2)
    assert run["concurrency"] == 4 and run["decode_peak_steps"] == 1
