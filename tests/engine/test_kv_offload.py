"""The host tier under the device pool (engine/kv_offload/): blocks the pool evicts are
copied to host memory and loaded back instead of recomputed, with greedy output equal to
the engine without tiers (itself equal to transformers: test_greedy_parity.py)."""
from __future__ import annotations

import random

import pytest
from test_prefix_and_cow import _finish_step  # the second half of a step the test scheduled

from engine import LLM, LLMEngine, SamplingParams
from engine.config import EngineConfig
from engine.kv_event_wire import BlockRemoved, BlockStored
from engine.kv_medium import Medium

GREEDY = SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True)


def block_gib(block_size: int, blocks: int) -> float:
    """GiB of `blocks` blocks of the tiny checkpoints (2 layers, 2 KV heads of 16, fp32)."""
    return blocks * 2 * 2 * block_size * 2 * 16 * 4 / 2**30


def prompts(seed: int, count: int, prefix_len: int, tail: int = 5) -> list[dict]:
    rng = random.Random(seed)
    return [{"prompt_token_ids": [rng.randrange(3, 250) for _ in range(prefix_len + tail)]}
            for _ in range(count)]


def with_tail(prompt: dict, seed: int) -> dict:
    """The same prefix (all but the last 5 tokens) with another tail."""
    rng = random.Random(seed)
    return {"prompt_token_ids": prompt["prompt_token_ids"][:-5] +
            [rng.randrange(3, 250) for _ in range(5)]}


def tokens(outputs) -> list[list[int]]:
    return [o.outputs[0].token_ids for o in outputs]


def run_phases(llm: LLM, phases: list[list[dict]]) -> list[list[int]]:
    """Each phase one generate call; the tiers' copies finish between phases."""
    out = []
    for phase in phases:
        out += tokens(llm.generate(phase, GREEDY))
        if llm.llm_engine.offload is not None:
            llm.llm_engine.offload.drain()
        llm.llm_engine.check_no_leaks()
    return out


@pytest.fixture(scope="module")
def oracle(tiny_checkpoints):
    """Greedy continuations with no prefix caching at all (the plain recompute)."""
    llm = LLM(model=tiny_checkpoints["llama"], block_size=16, num_gpu_blocks_override=64,
              max_model_len=128, enable_prefix_caching=False)
    return lambda phases: run_phases(llm, phases)


def tiered(path: str, block_size: int, pool_blocks: int, host_blocks: int, **kw) -> LLM:
    args = dict(model=path, block_size=block_size, num_gpu_blocks_override=pool_blocks,
                max_model_len=128, kv_offloading_size=block_gib(block_size, host_blocks))
    args.update(kw)
    return LLM(**args)


@pytest.mark.parametrize("block_size", [1, 16])
def test_evicted_prefixes_load_from_host_with_identical_greedy_output(
        tiny_checkpoints, oracle, block_size):
    # 6 prefixes of 48 tokens; the pool holds about two requests, the host tier the rest
    first = prompts(seed=block_size, count=6, prefix_len=48)
    again = [with_tail(p, i) for i, p in enumerate(first)]
    phases = [[p] for p in first] + [again[:3], again[3:]]
    pool = 128 // block_size + 2
    llm = tiered(tiny_checkpoints["llama"], block_size, pool, host_blocks=6 * 48 // block_size)
    assert run_phases(llm, phases) == oracle(phases)
    kv = llm.llm_engine.kv.stats()
    stats = llm.llm_engine.offload.stats
    assert stats.blocks_stored[Medium.CPU] > 0 and stats.blocks_loaded[Medium.CPU] > 0
    assert kv.hits_by_medium[Medium.CPU] >= 3 * 48 // block_size * block_size, \
        "the first prefixes were evicted from the pool and must come back from the host tier"
    assert kv.prefix_hits == sum(kv.hits_by_medium.values())


def test_without_the_host_tier_the_same_run_recomputes(tiny_checkpoints):
    """The counterpart: the pool alone has lost those prefixes (so the hits above are the
    host tier's doing)."""
    first = prompts(seed=16, count=6, prefix_len=48)
    llm = LLM(model=tiny_checkpoints["llama"], block_size=16, num_gpu_blocks_override=10,
              max_model_len=128)
    run_phases(llm, [[p] for p in first] + [[with_tail(p, i) for i, p in enumerate(first[:3])]])
    assert llm.llm_engine.kv.stats().prefix_hits == 0


def test_preemption_and_a_mixed_batch_match_the_oracle(tiny_checkpoints, oracle):
    """Many concurrent requests on a small pool: preemption, and admissions whose prefixes
    come from the pool, the host tier and nowhere, in one generate call."""
    first = prompts(seed=3, count=8, prefix_len=42)  # 47 tokens: the 8 new ones cross a block
    # the most recent prefixes first: they are still in the pool
    mixed = [with_tail(p, 10 + i) for i, p in enumerate(first[::-1])] + prompts(seed=4, count=4,
                                                                         prefix_len=42)
    phases = [first[:4], first[4:], mixed]
    llm = tiered(tiny_checkpoints["llama"], 16, pool_blocks=12, host_blocks=40,
                 max_num_seqs=6, max_num_batched_tokens=64)
    scheduler, overlapped = llm.llm_engine.scheduler, []
    schedule = scheduler.schedule

    def recording():  # steps that ran some requests while others' loads were in flight
        batch = schedule()
        overlapped.append(bool(batch.seqs and scheduler.loading))
        return batch

    scheduler.schedule = recording
    assert run_phases(llm, phases) == oracle(phases)
    assert any(overlapped), "loads should have been in flight beside running requests"
    engine = llm.llm_engine
    assert engine.scheduler.num_preemptions > 0, "the small pool should have forced preemption"
    hits = engine.kv.stats().hits_by_medium
    assert hits[Medium.CPU] > 0 and hits[Medium.GPU] > 0


# abort, preemption and failure while blocks load, and loads off the step:
# test_kv_offload_async.py


def test_invariants_hold_across_tiers_after_every_step(tiny_checkpoints):
    engine = LLMEngine.from_args(model=tiny_checkpoints["mistral"], block_size=1,
                                 num_gpu_blocks_override=140, max_model_len=128,
                                 kv_offloading_size=block_gib(1, 1000), max_num_seqs=4,
                                 max_num_batched_tokens=32)
    for i, p in enumerate(prompts(seed=8, count=16, prefix_len=40) * 2):
        engine.add_request(str(i), p["prompt_token_ids"], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
        engine.check_no_leaks()
        assert engine.offload.host.used_bytes <= engine.offload.host.capacity_bytes
    assert engine.offload.stats.blocks_loaded[Medium.CPU] > 0


def test_events_name_each_tier_with_vllms_medium(tiny_checkpoints):
    from engine.kv_events import KVEventRecorder

    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=16,
                                 num_gpu_blocks_override=10, max_model_len=128,
                                 kv_offloading_size=block_gib(16, 4))
    recorder = KVEventRecorder(16)
    engine.kv.events = recorder
    events = []
    for i, p in enumerate(prompts(seed=9, count=4, prefix_len=64)):
        engine.add_request(str(i), p["prompt_token_ids"], GREEDY)
        while engine.has_unfinished_requests():
            engine.step()
            events += recorder.take()
        engine.offload.drain()
    by = {(type(e).__name__, e.medium) for e in events}
    assert {("BlockStored", "GPU"), ("BlockRemoved", "GPU"), ("BlockStored", "CPU"),
            ("BlockRemoved", "CPU")} <= by
    cpu = {h for e in events if isinstance(e, BlockStored) and e.medium == "CPU"
           for h in e.block_hashes}
    gpu_removed = {h for e in events if isinstance(e, BlockRemoved) and e.medium == "GPU"
                   for h in e.block_hashes}
    assert cpu <= gpu_removed, "the host tier stores only what the pool evicted"
    assert (Medium.CPU, Medium.DISK) == ("CPU", "Disk")  # vllm/v1/kv_offload/mediums.py


def test_the_cpu_transfer_round_trips_blocks_and_the_cuda_one_fills_the_interface():
    import torch

    from engine.kv_offload.transfer import CPUTransfer, CUDATransfer, KVTransfer, make_transfer

    pool = torch.randn(2, 3, 6, 4, 2, 8)  # [2, layers, blocks, block_size, kv_heads, head_dim]
    io = make_transfer(pool)
    assert isinstance(io, CPUTransfer) and io.block_bytes == 2 * 3 * 4 * 2 * 8 * 4
    before = pool.clone()
    copies = io.split(io.gather([4, 1]))
    pool[:, :, [4, 1]] = 0  # the step reuses the blocks after the snapshot
    assert torch.equal(copies[0], before[:, :, 4]) and torch.equal(copies[1], before[:, :, 1])
    io.load(copies, [0, 5])
    assert torch.equal(pool[:, :, 0], before[:, :, 4])
    assert torch.equal(pool[:, :, 5], before[:, :, 1])
    assert issubclass(CUDATransfer, KVTransfer) and not CUDATransfer.__abstractmethods__


@pytest.mark.skipif(not __import__("torch").cuda.is_available(), reason="needs CUDA")
def test_the_cuda_transfer_round_trips_blocks_through_pinned_memory():
    """scripts/gpu_check.sh runs this: snapshot on the side stream, the pool overwritten by
    the compute stream right after, the worker's copies intact; loads on the load worker,
    on their own stream after the compute stream's queued writes to the same blocks, done
    when `load` returns."""
    import torch

    from engine.kv_offload.transfer import CUDATransfer, TransferWorker, make_transfer

    pool = torch.randn(2, 3, 64, 16, 2, 64, device="cuda", dtype=torch.bfloat16)
    io = make_transfer(pool)
    assert isinstance(io, CUDATransfer)
    before = pool.clone()
    snapshot = io.gather([40, 3, 17])
    pool[:, :, [40, 3, 17]] = 0  # the step's writes, queued after the gather
    worker, copies = TransferWorker(), []
    worker.submit(lambda: copies.extend(io.split(snapshot)))
    worker.drain()
    assert all(c.is_pinned() for c in copies)
    pool[:, :, [0, 1, 2]] = 7  # an earlier step's writes to the blocks the load fills
    worker.submit(lambda: io.load(copies, [0, 1, 2]))
    worker.drain()
    for dst, src in zip([0, 1, 2], [40, 3, 17]):
        assert torch.equal(pool[:, :, dst], before[:, :, src])
    worker.close()


@pytest.mark.parametrize("kwargs, message", [
    (dict(kv_offloading_size=-1), "kv_offloading_size must be a number >= 0"),
    (dict(kv_offloading_backend="lmcache"), "kv_offloading_backend must be one of native"),
    (dict(kv_disk_dir="/tmp/kv"), "kv_disk_dir needs kv_disk_size"),
    (dict(kv_disk_size=1.0), "kv_disk_size needs kv_disk_dir"),
])
def test_bad_tier_settings_name_the_setting(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_bad_tier_flags_name_the_flag(capsys):
    from engine.entrypoints.cli import build_parser, engine_kwargs

    with pytest.raises(SystemExit):
        build_parser().parse_args(["serve", "--kv-offloading-size", "lots"])
    assert "argument --kv-offloading-size: must be a number >= 0" in capsys.readouterr().err
    with pytest.raises(SystemExit, match="--kv-disk-dir needs --kv-disk-size"):
        engine_kwargs(build_parser().parse_args(["serve", "--kv-disk-dir", "/tmp/kv"]))
    help_text = build_parser().format_help() + _serve_help()
    for flag in ("--kv-offloading-size", "--kv-offloading-backend", "--kv-disk-dir",
                 "--kv-disk-size"):
        assert flag in help_text


def _serve_help() -> str:
    from engine.entrypoints.cli import build_parser

    parser = build_parser()
    sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    return sub.choices["serve"].format_help()


def test_a_disk_dir_that_cannot_be_written_is_refused(tiny_checkpoints, tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    with pytest.raises(ValueError, match="kv_disk_dir .* is not a writable directory"):
        LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=16, max_model_len=128,
            kv_disk_dir=str(blocker / "kv"), kv_disk_size=0.01)


def test_a_loaded_block_is_cached_in_the_pool_and_announced_there(tiny_checkpoints):
    """Once loaded, a block is the pool's: the next request with that prefix hits it on the
    device (not in the host tier again), and the KV events say the device holds it (what
    the events report the device caching is exactly what the pool caches)."""
    from engine.kv_events import KVEventRecorder, external_hash

    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=16,
                                 num_gpu_blocks_override=10, max_model_len=128,
                                 kv_offloading_size=block_gib(16, 20))
    recorder = KVEventRecorder(16)
    engine.kv.events = recorder

    def run(request_id: str, prompt: dict) -> dict[str, int]:
        engine.add_request(request_id, prompt["prompt_token_ids"], GREEDY)
        while engine.has_unfinished_requests():
            engine.step()
        engine.offload.drain()
        return dict(engine.kv.stats().hits_by_medium)

    first = prompts(seed=5, count=3, prefix_len=64)
    for i, p in enumerate(first):  # each evicts the one before into the host tier
        warm = run(f"warm{i}", p)
    loaded = run("again", with_tail(first[0], 1))
    assert loaded[Medium.CPU] > warm[Medium.CPU], "the prefix should load from the host tier"
    assert engine.offload.stats.blocks_loaded[Medium.CPU] > 0
    cached = {external_hash(b.block_hash) for b in engine.kv.blocks if b.block_hash is not None}
    assert set(recorder.cached) == cached
    final = run("again2", with_tail(first[0], 2))
    assert final[Medium.CPU] == loaded[Medium.CPU]
    assert final[Medium.GPU] - loaded[Medium.GPU] == 64


def test_tier_invariants_catch_a_queued_store_of_a_block_still_cached_as_itself(
        tiny_checkpoints):
    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=16,
                                 num_gpu_blocks_override=10, max_model_len=128,
                                 kv_offloading_size=block_gib(16, 4))
    engine.add_request("a", prompts(seed=9, count=1, prefix_len=64)[0]["prompt_token_ids"], GREEDY)
    while engine.has_unfinished_requests():
        engine.step()
    cached = next(b for b in engine.kv.blocks if b.block_hash is not None)
    engine.kv.check_invariants([])
    engine.offload.evicted(cached.block_id, b"another hash")  # given new content: fine
    engine.kv.check_invariants([])
    engine.offload.evicted(cached.block_id, cached.block_hash)
    with pytest.raises(AssertionError, match="queued for the host tier but still cached"):
        engine.kv.check_invariants([])
    engine.offload.take_stores()


def test_the_byte_counters_are_blocks_times_the_block_size(tiny_checkpoints):
    """vllm:kv_offload_total_bytes: GPU_to_CPU and CPU_to_GPU are the blocks stored and
    loaded times one block's bytes (2 layers x K and V x 16 tokens x 2 heads x 16 x fp32)."""
    from engine.kv_offload.metrics import collector

    first = prompts(seed=5, count=3, prefix_len=64)
    llm = tiered(tiny_checkpoints["llama"], 16, pool_blocks=10, host_blocks=20)
    run_phases(llm, [[p] for p in first] + [[with_tail(first[0], 3)]])
    stats = llm.llm_engine.offload.stats
    assert stats.blocks_stored[Medium.CPU] > 0 and stats.blocks_loaded[Medium.CPU] > 0
    families = {f.name: f for f in collector(llm.llm_engine.offload, "m").collect()}
    moved = {s.labels["transfer_type"]: s.value for s in families["vllm:kv_offload_total_bytes"].samples}
    block = 2 * 2 * 16 * 2 * 16 * 4
    assert moved["GPU_to_CPU"] == stats.blocks_stored[Medium.CPU] * block
    assert moved["CPU_to_GPU"] == stats.blocks_loaded[Medium.CPU] * block


def test_invariants_hold_while_blocks_load_and_catch_a_loading_block_in_the_cache(
        tiny_checkpoints):
    """Between scheduling and the end of its load, each loading block is held by its
    request and its load job and is not in the prefix cache; one found cached is caught."""
    engine = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=16,
                                 num_gpu_blocks_override=10, max_model_len=128,
                                 kv_offloading_size=block_gib(16, 20))
    first = prompts(seed=5, count=3, prefix_len=64)
    for i, p in enumerate(first):
        engine.add_request(f"warm{i}", p["prompt_token_ids"], GREEDY)
        while engine.has_unfinished_requests():
            engine.step()
        engine.offload.drain()
    engine.add_request("again", with_tail(first[0], 4)["prompt_token_ids"], GREEDY)
    batch = engine.scheduler.schedule()
    assert batch.blocks_to_load
    engine.check_no_leaks()
    hit, block_id = batch.blocks_to_load[0]
    kv = engine.kv
    assert kv.blocks[block_id].ref_count == 2
    kv.blocks[block_id].block_hash, kv._hash_to_block[b"early"] = b"early", block_id
    with pytest.raises(AssertionError, match="in the prefix cache while its load"):
        engine.check_no_leaks()
    kv.blocks[block_id].block_hash = None
    del kv._hash_to_block[b"early"]
    engine.check_no_leaks()
    _finish_step(engine, batch)
    while engine.has_unfinished_requests():
        engine.step()
    engine.check_no_leaks()
