"""KV cache events: a real ZeroMQ subscriber against an engine with a tiny KV pool.

The oracle is the KV cache manager itself (what its prefix cache holds after each step)
and the definition of the block hashes (engine/block_hash.py over the requests' tokens);
the wire format is checked by decoding every payload with vLLM's own msgspec types (as
examples/online_serving/kv_events_subscriber.py declares them).
"""
from __future__ import annotations

import itertools
import threading
import time
from typing import Any

import msgspec
import pytest
import zmq

from engine import LLMEngine, SamplingParams
from engine import kv_event_wire as wire
from engine.block_hash import external_hash, full_block_hashes
from engine.kv_events import (END_SEQ, SNAPSHOT_REQUEST, KVEventRecorder, ZmqKVEventPublisher,
                              apply_events, decode_batch)

BLOCK = 4
EVENTS = {"enable_kv_cache_events": True, "endpoint": "tcp://127.0.0.1:*",
          "replay_endpoint": "tcp://127.0.0.1:*", "topic": "kv-events"}


# vLLM's types, as its subscriber example declares them
class EventBatch(msgspec.Struct, array_like=True, omit_defaults=True, gc=False):
    ts: float
    events: list[Any]


class KVCacheEvent(msgspec.Struct, array_like=True, omit_defaults=True, gc=False, tag=True):
    pass


class BlockStored(KVCacheEvent):
    block_hashes: list[int]
    parent_block_hash: int | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None
    medium: str | None


class BlockRemoved(KVCacheEvent):
    block_hashes: list[int]
    medium: str | None


class AllBlocksCleared(KVCacheEvent):
    pass


class KVEventBatch(EventBatch):
    events: list[BlockStored | BlockRemoved | AllBlocksCleared]


VLLM_DECODER = msgspec.msgpack.Decoder(type=KVEventBatch)
REQUEST_IDS = itertools.count()


class Subscriber:
    """SUB on the publisher plus a DEALER on its replay socket (vLLM's protocol)."""

    def __init__(self, info: dict[str, Any]) -> None:
        self.ctx = zmq.Context.instance()
        self.sub = self.ctx.socket(zmq.SUB)
        self.sub.setsockopt_string(zmq.SUBSCRIBE, info["topic"])
        # PUB drops what it sends before a subscriber's subscription reaches it: wait for
        # the connection's handshake, after which the SUB sends its subscription at once
        monitor = self.sub.get_monitor_socket(zmq.EVENT_HANDSHAKE_SUCCEEDED)
        self.sub.connect(info["endpoint"])
        assert monitor.poll(10_000), "the SUB socket did not connect"
        self.sub.disable_monitor()
        monitor.close(linger=0)
        self.replay = self.ctx.socket(zmq.DEALER)
        self.replay.connect(info["replay_endpoint"])
        self.batches: dict[int, bytes] = {}  # seq -> payload, as received live

    def drain(self, until_seq: int, timeout_ms: int = 10_000) -> list[int]:
        """Live batches until `until_seq` arrived; the seqs in arrival order."""
        seqs = []
        while until_seq not in self.batches:
            assert self.sub.poll(timeout_ms), f"no batch {until_seq} within {timeout_ms} ms"
            topic, seq, payload = self.sub.recv_multipart()
            assert topic == b"kv-events"
            seqs.append(int.from_bytes(seq, "big"))
            self.batches[seqs[-1]] = payload
        return seqs

    def ask(self, request: bytes) -> list[tuple[int, bytes]]:
        self.replay.send_multipart([b"", request])
        out = []
        while True:
            assert self.replay.poll(10_000), "the replay socket did not answer"
            _, seq, payload = self.replay.recv_multipart()
            if seq == END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), payload))

    def close(self) -> None:
        self.sub.close(linger=0)
        self.replay.close(linger=0)


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.005)


def cache_contents(engine: LLMEngine) -> set[int]:
    return {external_hash(h) for h in engine.kv._hash_to_block}


def run(engine: LLMEngine, prompts: list[list[int]], max_tokens: int = 3,
        together: int = 1) -> list[list[int]]:
    """`together` prompts at a time (one: the tiny pool evicts between them); the tokens
    each request computed into its KV blocks."""
    computed = []
    for start in range(0, len(prompts), together):
        ids_of = {}
        for i, ids in enumerate(prompts[start:start + together]):
            request_id = f"r{next(REQUEST_IDS)}"
            ids_of[request_id] = ids
            engine.add_request(request_id, ids, SamplingParams(
                temperature=0.0, max_tokens=max_tokens, ignore_eos=True))
        while engine.has_unfinished_requests():
            for out in engine.step():
                if out.finished:  # the last sampled token is not in the KV cache
                    computed.append(ids_of[out.request_id] + list(out.outputs[0].token_ids)[:-1])
    return computed


@pytest.fixture(scope="module")
def engine(tiny_checkpoints):
    e = LLMEngine.from_args(model=tiny_checkpoints["llama"], block_size=BLOCK,
                            num_gpu_blocks_override=24, max_model_len=64,
                            kv_events_config=EVENTS)
    yield e
    e.kv_events.close()


def test_subscriber_sees_the_cache_state_under_eviction_and_replay_fills_what_it_missed(engine):
    info = engine.kv_events.info()
    assert info["block_size"] == BLOCK and info["medium"] == "GPU"
    late = Subscriber(info)  # connects now; batch 0 (and maybe more) went out before
    prompts = [[(7 * p + t) % 97 + 3 for t in range(22 + p)] for p in range(8)]
    prompts += [prompts[0][:14] + [5, 6, 7, 8, 9, 10]]  # shares 3 blocks with the first
    evictions = engine.kv.evictions
    computed = run(engine, prompts)
    # two at once, the second sharing its first block with a cached one: one step stores
    # blocks of both, and a run of stored blocks has a gap where a block was cached already
    computed += run(engine, [[60 + t for t in range(17)], prompts[-1][:4] + [80] * 13],
                    together=2)
    assert engine.kv.evictions > evictions  # the pool (24 blocks) is far smaller than this
    engine.step()  # nothing to do: no batch, nothing left pending
    last = engine.kv_events._next_seq - 1
    seqs = late.drain(last)
    assert seqs == sorted(seqs) and len(set(seqs)) == len(seqs)  # strictly increasing
    assert seqs == list(range(seqs[0], last + 1))  # no gaps: nothing was dropped
    # replay from 0 returns every batch, the ones the late subscriber missed included
    replayed = late.ask((0).to_bytes(8, "big"))
    assert [s for s, _ in replayed] == list(range(last + 1))
    assert all(late.batches[s] == p for s, p in replayed if s in late.batches)
    # applying them in order gives exactly what the manager's prefix cache holds
    state: dict[int, Any] = {}
    stored: dict[int, tuple] = {}
    for _, payload in replayed:
        batch = VLLM_DECODER.decode(payload)  # vLLM's types read every batch
        for event in batch.events:
            if isinstance(event, BlockStored):
                assert event.block_size == BLOCK and event.medium == "GPU"
                assert len(event.token_ids) == BLOCK * len(event.block_hashes)
                parent = event.parent_block_hash
                for i, h in enumerate(event.block_hashes):
                    stored[h] = (parent, tuple(event.token_ids[i * BLOCK:(i + 1) * BLOCK]))
                    parent = h
            elif isinstance(event, BlockRemoved):
                assert event.medium == "GPU"
        apply_events(state, decode_batch(payload)[1])
    assert set(state) == {"GPU"} and set(state["GPU"]) == cache_contents(engine)
    assert isinstance(VLLM_DECODER.decode(replayed[0][1]).events[0], AllBlocksCleared)
    # every stored block is a full block of some request's computed tokens, with its
    # parent and tokens as the hash definition says; and every such block was stored
    expected = {}
    for ids in computed:
        parent = None
        for i, h in enumerate(full_block_hashes(ids, BLOCK)):
            expected[external_hash(h)] = (parent, tuple(ids[i * BLOCK:(i + 1) * BLOCK]))
            parent = external_hash(h)
    assert stored == expected
    late.close()


def test_snapshot_rebuilds_the_cache_state_for_a_subscriber_that_starts_late(engine):
    run(engine, [[11 + t % 50 for t in range(30)], [12 + t % 40 for t in range(26)]])
    sub = Subscriber(engine.kv_events.info())
    last = engine.kv_events._next_seq - 1
    # the publisher thread sent everything up to `last` once a replay from there answers
    wait_for(lambda: [s for s, _ in sub.ask(last.to_bytes(8, "big"))] == [last])
    (seq, payload), = sub.ask(SNAPSHOT_REQUEST)
    assert seq == last
    ts, events = decode_batch(payload)
    assert events[0] == wire.AllBlocksCleared()
    state: dict[int, Any] = {}
    apply_events(state, events)
    assert set(state) == {"GPU"} and set(state["GPU"]) == cache_contents(engine)
    assert state["GPU"]
    VLLM_DECODER.decode(payload)
    sub.close()


def test_a_full_queue_drops_counts_and_then_rebases_every_subscriber():
    recorder = KVEventRecorder(block_size=2)
    armed, gate, sending = threading.Event(), threading.Event(), threading.Event()

    class Slow(ZmqKVEventPublisher):
        def _send(self, *args: Any) -> None:
            if armed.is_set():   # not batch 0, which the constructor sends itself
                sending.set()
                gate.wait(10)
            super()._send(*args)

    publisher = Slow({**EVENTS, "max_queue_size": 1}, recorder)
    sub = Subscriber(publisher.info())
    try:
        # PUB drops what it sends before the subscription reaches it: probe batches (a
        # block stored and removed: no state) until one arrives
        n = 0
        while n == 0 or not sub.sub.poll(100):
            assert n < 100, "the subscription never reached the publisher"
            recorder.stored(b"w" * 16, None, [7, 8])
            recorder.removed(b"w" * 16)
            publisher.flush()
            n += 1
        sub.drain(n)
        armed.set()
        recorder.stored(b"a" * 16, None, [1, 2])
        publisher.flush()                    # batch n+1: the thread takes it and holds it
        assert sending.wait(10)              # ... so the queue is empty
        recorder.stored(b"b" * 16, b"a" * 16, [3, 4])
        recorder.removed(b"a" * 16)
        publisher.flush()                    # batch n+2 waits in the queue
        assert publisher.batches_dropped == 0
        recorder.stored(b"c" * 16, None, [5, 6])
        publisher.flush()                    # batch n+3: dropped
        assert publisher.batches_dropped == 1
        publisher.flush()                    # batch n+4, a rebase: still full, dropped too
        assert publisher.batches_dropped == 2
        gate.set()
        # the thread sent batches n+1 and n+2: the queue has room
        since = (n + 1).to_bytes(8, "big")
        wait_for(lambda: n + 2 in [s for s, _ in sub.ask(since)])
        publisher.flush()                    # batch n+5: the rebase
        seqs = sub.drain(n + 5)
        assert n + 3 not in sub.batches and n + 4 not in sub.batches  # the gap subscribers see
        _, rebase = decode_batch(sub.batches[n + 5])
        assert rebase[0] == wire.AllBlocksCleared()
        state: dict[int, Any] = {}
        apply_events(state, rebase)
        assert state == {"GPU": {external_hash(b"b" * 16): (external_hash(b"a" * 16), (3, 4)),
                                 external_hash(b"c" * 16): (None, (5, 6))}}
        assert seqs == [n + 1, n + 2, n + 5]
        # the replay buffer has the hole too; the snapshot is the rebased state
        assert [s for s, _ in sub.ask(since)] == [n + 1, n + 2, n + 5]
        (_, snap), = sub.ask(SNAPSHOT_REQUEST)
        snap_state: dict[int, Any] = {}
        apply_events(snap_state, decode_batch(snap)[1])
        assert snap_state == state
    finally:
        gate.set()
        sub.close()
        publisher.close()


def test_the_settings_row_checks_the_config_and_names_what_to_change(tiny_checkpoints):
    from engine.config import EngineConfig

    with pytest.raises(ValueError, match="kv_events_config has no key 'port'"):
        EngineConfig(kv_events_config={"enable_kv_cache_events": True, "port": 5557})
    with pytest.raises(ValueError, match="kv_events_config.publisher must be one of zmq, null"):
        EngineConfig(kv_events_config={"enable_kv_cache_events": True, "publisher": "kafka"})
    config = EngineConfig(kv_events_config={"enable_kv_cache_events": True})
    assert config.kv_events_config["endpoint"] == "tcp://*:5557"
    assert config.kv_events_config["replay_endpoint"] is None
