"""Loads from the KV tiers run off the step (engine/kv_offload/loads.py): a request whose
prefix is below the pool waits for its loads while other requests' steps run, joins the
steps once they are done, and never reads a block still being written. The load worker is
held on an event (a gate on the transfer's `load`) to show it without timing."""
from __future__ import annotations

import threading

import pytest
from test_kv_offload import GREEDY, block_gib, prompts, with_tail
from test_prefix_and_cow import _finish_step

from engine import LLM, LLMEngine
from engine.kv_medium import Medium
from engine.kv_offload.transfer import TransferWorker

WAIT = 30  # seconds: a bound on waiting for the worker, never a sleep


class Gate:
    """Wraps the transfer's load: the worker signals `entered`, then waits for `open`."""

    def __init__(self, io) -> None:
        self.entered, self.open, self.calls = threading.Event(), threading.Event(), 0
        self._load = io.load
        io.load = self.load

    def load(self, blocks, block_ids) -> None:
        self.calls += 1
        self.entered.set()
        assert self.open.wait(WAIT), "the test never opened the gate"
        self._load(blocks, block_ids)

    def wait_entered(self) -> None:
        assert self.entered.wait(WAIT), "the load worker never started the load"


@pytest.fixture(scope="module")
def oracle(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], block_size=16, num_gpu_blocks_override=64,
              max_model_len=128, enable_prefix_caching=False)
    return lambda prompt, params=GREEDY: llm.generate(
        [{"prompt_token_ids": prompt}], params)[0].outputs[0].token_ids


def warmed(path: str, pool_blocks: int = 14, **kw) -> tuple[LLMEngine, list[list[int]]]:
    """An engine whose first 3 prefixes (64 tokens) were evicted from the pool (to the host
    tier, or the disk)."""
    args = dict(model=path, block_size=16, num_gpu_blocks_override=pool_blocks,
                max_model_len=128, kv_offloading_size=block_gib(16, 40))
    args.update(kw)
    engine = LLMEngine.from_args(**args)
    first = [p["prompt_token_ids"] for p in prompts(seed=5, count=8, prefix_len=64)]
    for i, p in enumerate(first):
        engine.add_request(f"warm{i}", p, GREEDY)
        while engine.has_unfinished_requests():
            engine.step()
        engine.offload.drain()
    return engine, first


def run(engine: LLMEngine) -> dict:
    """Steps until no request is left, checking the invariants; finished outputs by id."""
    done = {}
    while engine.has_unfinished_requests():
        done.update((o.request_id, o) for o in engine.step() if o.finished)
        engine.check_no_leaks()
    return done


def test_other_requests_step_while_a_load_is_held_and_the_load_is_used_after(
        tiny_checkpoints, oracle):
    engine, first = warmed(tiny_checkpoints["llama"])
    gate = Gate(engine.offload.io)
    again = with_tail({"prompt_token_ids": first[0]}, 1)["prompt_token_ids"]
    other = prompts(seed=50, count=1, prefix_len=10)[0]["prompt_token_ids"]
    engine.add_request("again", again, GREEDY)
    engine.add_request("other", other, GREEDY)
    engine.step()
    gate.wait_entered()
    loading = list(engine.scheduler.loading[0].block_table)
    # a twin of the prefix, added while the first load is held: the blocks being written
    # are not in the prefix cache, so it cannot read them (it loads its own copy)
    twin = with_tail({"prompt_token_ids": first[0]}, 2)["prompt_token_ids"]
    engine.add_request("twin", twin, GREEDY)
    done_ids: set[str] = set()
    while "other" not in done_ids:
        done_ids |= {o.request_id for o in engine.step() if o.finished}
        engine.check_no_leaks()
        assert all(engine.kv.blocks[b].block_hash is None for b in loading)
    assert not gate.open.is_set() and gate.calls == 1
    assert {s.request_id for s in engine.scheduler.loading} == {"again", "twin"}
    assert engine.get_stats().num_requests_waiting == 2
    gate.open.set()
    done = run(engine)
    assert done["again"].outputs[0].token_ids == oracle(again)
    assert done["twin"].outputs[0].token_ids == oracle(twin)
    assert done["again"].num_cached_tokens == 64 and done["twin"].num_cached_tokens == 64
    assert engine.kv.stats().hits_by_medium[Medium.CPU] == 128
    assert engine.offload.stats.blocks_loaded[Medium.CPU] == 8


def test_the_admitting_step_computes_nothing_of_a_loading_request(tiny_checkpoints, oracle):
    """Admitted with its loads planned: no row in that step's batch; once they are done,
    a later step computes only its tail."""
    engine, first = warmed(tiny_checkpoints["llama"])
    again = with_tail({"prompt_token_ids": first[0]}, 7)["prompt_token_ids"]
    engine.add_request("again", again, GREEDY)
    batch = engine.scheduler.schedule()
    assert len(batch.blocks_to_load) == 4 and batch.num_tokens == 0 and not batch.seqs
    _finish_step(engine, batch)
    engine.offload.drain()
    batch = engine.scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == ["again"] and batch.num_tokens == 5
    out = _finish_step(engine, batch)
    while engine.has_unfinished_requests():
        out = next((o for o in engine.step() if o.finished), out)
    assert out.outputs[0].token_ids == oracle(again)


def test_abort_while_planned_queued_or_running_frees_everything(tiny_checkpoints, oracle):
    engine, first = warmed(tiny_checkpoints["llama"], pool_blocks=20)
    kv, stats = engine.kv, engine.offload.stats
    gate = Gate(engine.offload.io)
    tails = [with_tail({"prompt_token_ids": p}, 60 + i)["prompt_token_ids"]
             for i, p in enumerate(first[:3])]
    # planned: aborted between scheduling and the step's transfer
    engine.add_request("planned", tails[0], GREEDY)
    batch = engine.scheduler.schedule()
    planned = [b for _, b in batch.blocks_to_load]
    engine.abort_request("planned")
    assert all(kv.blocks[b].ref_count == 0 for b in planned)
    engine.offload.transfer(batch)
    engine.check_no_leaks()
    assert stats.loads_cancelled == 4 and engine.scheduler.loading == []
    # running (held at the gate) and queued behind it
    engine.add_request("running", tails[1], GREEDY)
    engine.add_request("queued", tails[2], GREEDY)
    engine.step()
    gate.wait_entered()
    held = {s.request_id: list(s.block_table) for s in engine.scheduler.loading}
    engine.abort_request("queued")  # the worker has not begun it: its blocks go now
    assert all(kv.blocks[b].ref_count == 0 for b in held["queued"])
    engine.abort_request("running")  # the worker writes its blocks: they stay its own
    assert all(kv.blocks[b].ref_count == 1 and kv.blocks[b].block_hash is None
               for b in held["running"])
    engine.check_no_leaks()
    assert stats.loads_cancelled == 8
    gate.open.set()
    engine.offload.drain()
    engine.step()  # polls the done load: discarded
    engine.check_no_leaks()
    assert gate.calls == 1, "the cancelled queued job was skipped"
    assert stats.loads_cancelled == 12 and stats.blocks_loaded[Medium.CPU] == 0
    assert engine.get_stats().num_used_blocks == 0
    assert all(kv.blocks[b].block_hash is None for b in held["running"])
    assert not engine.has_unfinished_requests() and not engine.scheduler.has_unfinished()
    # the prefix still loads afterwards, with the right tokens
    engine.add_request("after", tails[1], GREEDY)
    out = run(engine)["after"]
    assert out.num_cached_tokens == 64 and out.outputs[0].token_ids == oracle(tails[1])


def test_a_loading_request_preempted_by_a_running_one_comes_back_right(tiny_checkpoints,
                                                                      oracle):
    from engine import SamplingParams

    engine, first = warmed(tiny_checkpoints["llama"], pool_blocks=10)
    gate = Gate(engine.offload.io)
    long = SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)
    runner = prompts(seed=51, count=1, prefix_len=65)[0]["prompt_token_ids"]  # 70 tokens
    again = with_tail({"prompt_token_ids": first[0]}, 8)["prompt_token_ids"]
    engine.add_request("runner", runner, long)
    engine.step()
    engine.add_request("again", again, GREEDY)
    preempted = []
    while not preempted:  # the runner grows into the blocks the loading request holds
        batch = engine.scheduler.schedule()
        preempted = [s.request_id for s in batch.preempted]
        engine.offload.transfer(batch)
        if batch.seqs:
            _finish_step(engine, batch)
        engine.check_no_leaks()
    assert "again" in preempted and gate.calls == 1
    gate.open.set()
    done = run(engine)
    assert done["again"].outputs[0].token_ids == oracle(again)
    assert done["runner"].outputs[0].token_ids == oracle(runner, long)
    assert engine.offload.stats.loads_cancelled >= 4


def test_a_full_load_queue_recomputes_instead_of_waiting(tiny_checkpoints, oracle):
    engine, first = warmed(tiny_checkpoints["llama"], pool_blocks=24)
    engine.offload.load_worker.close()
    engine.offload.load_worker = TransferWorker(max_jobs=1, name="kv-load-test")
    gate = Gate(engine.offload.io)
    tails = [with_tail({"prompt_token_ids": p}, 70 + i)["prompt_token_ids"]
             for i, p in enumerate(first[:3])]
    engine.add_request("a", tails[0], GREEDY)
    engine.step()
    gate.wait_entered()  # a's job runs: the one queue slot is free again
    engine.add_request("b", tails[1], GREEDY)
    engine.step()  # b's job fills the queue
    engine.add_request("c", tails[2], GREEDY)
    # c's first three blocks were still in the pool after the warm-up; a's and b's blocks
    # evicted them, and their copies to the host tier may still be in flight (a lookup
    # skips an entry that is not ready): wait for the store worker, not the load worker
    engine.offload.worker.drain()
    hits = engine.kv.lookup_prefix(engine.scheduler.waiting[0])
    assert [getattr(h, "medium", "GPU") for h in hits] == [Medium.CPU] * 4
    batch = engine.scheduler.schedule()
    assert [s.request_id for s in batch.seqs] == ["c"] and batch.num_tokens == len(tails[2])
    assert not batch.blocks_to_load
    _finish_step(engine, batch)
    gate.open.set()
    done = run(engine)
    assert [done[r].outputs[0].token_ids for r in "abc"] == [oracle(t) for t in tails]
    assert [done[r].num_cached_tokens for r in "abc"] == [64, 64, 0]


def test_a_disk_file_found_bad_by_its_load_is_recomputed(tiny_checkpoints, oracle, tmp_path):
    """The lookup finds the files; the second one is corrupt by the time the worker reads
    it: the first block is used, the second and the rest are computed."""
    from engine.kv_offload.disk import HEADER

    engine, first = warmed(tiny_checkpoints["llama"], pool_blocks=10, kv_offloading_size=0,
                           kv_disk_dir=str(tmp_path), kv_disk_size=0.01)
    disk = engine.offload.disk
    read = disk.read
    calls = []

    def read_then_corrupt(block_hash):
        calls.append(block_hash)
        if len(calls) == 2:
            path = disk.path_for(block_hash)
            raw = path.read_bytes()
            path.write_bytes(raw[:HEADER.size] + bytes(b ^ 0x55 for b in raw[HEADER.size:]))
        return read(block_hash)

    disk.read = read_then_corrupt
    again = with_tail({"prompt_token_ids": first[0]}, 9)["prompt_token_ids"]
    engine.add_request("again", again, GREEDY)
    out = run(engine)["again"]
    assert len(calls) == 2, "the load stops at the bad file"
    assert out.outputs[0].token_ids == oracle(again)
    assert out.num_cached_tokens == 16 and disk.bad_files["corrupt"] == 1
    stats = engine.offload.stats
    assert stats.blocks_loaded[Medium.DISK] == 1 and stats.loads_failed == 3
    from engine.kv_offload.metrics import collector

    family = next(f for f in collector(engine.offload, "m").collect()
                  if f.name == "vllm:kv_offload_blocks_not_loaded")
    assert {s.labels["reason"]: s.value for s in family.samples} == {"cancelled": 0,
                                                                     "failed": 3}
    hits = engine.kv.stats()
    assert hits.hits_by_medium[Medium.DISK] == 16 and hits.prefix_hits == sum(
        hits.hits_by_medium.values())
