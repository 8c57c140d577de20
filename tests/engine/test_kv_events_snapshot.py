"""A publisher's snapshot is the per-medium state: a property test.

Random store / remove / copy sequences over GPU, CPU and Disk, flushed in random steps
(some of them dropped by a full queue, so the next batch that fits is a rebase: the
clears), go through a real `ZmqKVEventPublisher`. Snapshots taken at random points over
its replay socket, each followed by the batches after its seq, must give exactly the index
of a follower that applied every published batch from seq 0; and that index must be what
the engine side recorded (the oracle: the recorder's own per-medium state).
"""
from __future__ import annotations

import itertools
import queue
import time
from typing import Any

import zmq
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from engine.kv_event_wire import AllBlocksCleared
from engine.block_hash import external_hash
from engine.kv_events import (END_SEQ, SNAPSHOT_REQUEST, KVEventRecorder, ZmqKVEventPublisher,
                              apply_events, decode_batch)
from paged_router.kv_index import KVIndex

MEDIA = ("GPU", "CPU", "Disk")
HASHES = [bytes([i + 1]) * 16 for i in range(6)]  # few, so that media overlap often
NAMES = itertools.count()

OPS = st.one_of(
    st.tuples(st.sampled_from(["store", "remove", "copy"]), st.integers(0, len(HASHES) - 1),
              st.sampled_from(MEDIA)),
    st.tuples(st.sampled_from(["flush", "drop", "snapshot"])))


class RefusingQueue(queue.Queue):
    """The publisher's queue, full on demand: `_put` drops the batch as on a full queue."""

    refuse = False

    def put_nowait(self, item: Any) -> None:
        if self.refuse:
            raise queue.Full
        super().put_nowait(item)


def ask(replay: Any, request: bytes) -> list[tuple[int, bytes]]:
    replay.send_multipart([b"", request])
    out = []
    while True:
        assert replay.poll(10_000), "the replay socket did not answer"
        _, seq, payload = replay.recv_multipart()
        if seq == END_SEQ:
            return out
        out.append((int.from_bytes(seq, "big"), payload))


def media_of(index: KVIndex) -> set[tuple[int, str]]:
    """(hash, medium) for every block the index holds of the one backend, "e"."""
    return {(h, medium) for h, by_url in index.holders.items()
            for medium in by_url.get("e", ())}


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "condition not reached"
        time.sleep(0.001)


def drive(recorder: KVEventRecorder, publisher: ZmqKVEventPublisher, replay: Any,
          ops: list[tuple]) -> list[tuple[int, bytes]]:
    """Runs `ops`; the snapshots taken on the way, then a last one."""
    snapshots = []
    for op in ops:
        if op[0] == "store":
            i, medium = op[1], op[2]
            recorder.stored(HASHES[i], HASHES[i - 1] if i else None, [i, i + 1], medium)
        elif op[0] == "remove":
            recorder.removed(HASHES[op[1]], op[2])
        elif op[0] == "copy":
            recorder.copied(HASHES[op[1]], op[2])
        elif op[0] == "snapshot":
            snapshots += ask(replay, SNAPSHOT_REQUEST)
        else:
            publisher._queue.refuse = op[0] == "drop"
            publisher.flush()
    publisher._queue.refuse = False
    publisher.flush()  # the rebase, if the last batch put was dropped
    wait_for(lambda: publisher.last_seq == publisher._next_seq - 1)
    return snapshots + ask(replay, SNAPSHOT_REQUEST)


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(ops=st.lists(OPS, max_size=40))
def test_a_follower_from_any_snapshot_ends_with_the_index_of_one_that_saw_everything(ops):
    note(f"ops: {ops}")
    name = f"inproc://kv-snapshot-{next(NAMES)}"
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": name, "replay_endpoint": name + "-replay"},
                                    recorder)
    publisher._queue = RefusingQueue()
    replay = zmq.Context.instance().socket(zmq.DEALER)
    replay.setsockopt(zmq.LINGER, 0)
    replay.connect(publisher.replay_endpoint)
    try:
        snapshots = drive(recorder, publisher, replay, ops)
        batches = ask(replay, (0).to_bytes(8, "big"))
    finally:
        replay.close(linger=0)
        publisher.close()
    truth = {medium: dict(held) for medium, held in
             [(recorder.medium, recorder.cached), *recorder.tiers.items()] if held}
    full = KVIndex()
    for seq, payload in batches:
        full.apply("e", decode_batch(payload)[1])
    assert media_of(full) == {(h, m) for m, held in truth.items() for h in held}
    for at, snapshot in snapshots:
        follower = KVIndex()
        follower.apply("e", decode_batch(snapshot)[1])
        for seq, payload in batches:
            if seq > at:
                follower.apply("e", decode_batch(payload)[1])
        assert follower.holders == full.holders, at
        assert follower.size("e") == full.size("e") == full.held_total == follower.held_total
    # the last snapshot is the state itself, parents and tokens included
    state: dict[str, Any] = {}
    apply_events(state, decode_batch(snapshots[-1][1])[1])
    assert {m: held for m, held in state.items() if held} == truth
    assert all(parent == (external_hash(HASHES[i - 1]) if i else None) and tokens == (i, i + 1)
               for held in truth.values() for h, (parent, tokens) in held.items()
               for i in [next(i for i, b in enumerate(HASHES) if external_hash(b) == h)])


def test_a_device_eviction_leaves_the_hosts_copy_in_the_snapshot_and_a_reload_is_kept():
    """The issue's two cases, spelled out: after [removed GPU h, stored CPU h] the
    snapshot has h on the host only (so a later `removed CPU h` empties the index), and
    after the device reloads h and the host evicts its copy, h is still on the device."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-two-cases",
                                     "replay_endpoint": "inproc://kv-two-cases-replay"},
                                    recorder)
    replay = zmq.Context.instance().socket(zmq.DEALER)
    replay.connect(publisher.replay_endpoint)
    h = external_hash(HASHES[0])

    def step() -> dict[str, Any]:
        publisher.flush()
        wait_for(lambda: publisher.last_seq == publisher._next_seq - 1)
        state: dict[str, Any] = {}
        (_, snapshot), = ask(replay, SNAPSHOT_REQUEST)
        apply_events(state, decode_batch(snapshot)[1])
        return {m: set(held) for m, held in state.items() if held}

    try:
        recorder.stored(HASHES[0], None, [1, 2])
        assert step() == {"GPU": {h}}
        recorder.removed(HASHES[0])
        recorder.copied(HASHES[0], "CPU")
        assert step() == {"CPU": {h}}
        recorder.copied(HASHES[0], "GPU")
        recorder.removed(HASHES[0], "CPU")
        assert step() == {"GPU": {h}}
    finally:
        replay.close(linger=0)
        publisher.close()


def test_the_rebase_after_a_dropped_batch_keeps_the_host_and_disk_copies():
    """A full queue drops a batch; the next batch that fits rebuilds every medium, not
    only the device's: a router following it keeps the blocks the tiers below hold."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-rebase"}, recorder)
    publisher._queue = RefusingQueue()
    a, b, c = (external_hash(h) for h in HASHES[:3])
    try:
        recorder.stored(HASHES[0], None, [0, 1])
        recorder.stored(HASHES[1], HASHES[0], [1, 2])
        recorder.removed(HASHES[0])          # evicted from the device ...
        recorder.copied(HASHES[0], "CPU")    # ... into the host tier
        recorder.copied(HASHES[1], "Disk")   # a copy on disk of a block still on the device
        publisher._queue.refuse = True
        publisher.flush()                    # dropped: the subscribers never see it
        assert publisher.batches_dropped == 1 and not recorder.pending
        recorder.stored(HASHES[2], None, [2, 3], "Disk")
        publisher._queue.refuse = False
        publisher.flush()                    # the rebase
        wait_for(lambda: publisher.last_seq == 2)
        (_, rebase), = [(s, p) for s, p in publisher._buffer if s == 2]
        events = decode_batch(rebase)[1]
        assert events[0] == AllBlocksCleared()
        state: dict[str, Any] = {}
        apply_events(state, events)
        assert state == {"GPU": {b: (a, (1, 2))}, "CPU": {a: (None, (0, 1))},
                         "Disk": {b: (a, (1, 2)), c: (None, (2, 3))}}
        index = KVIndex()
        index.apply("e", events)
        assert media_of(index) == {(b, "GPU"), (a, "CPU"), (b, "Disk"), (c, "Disk")}
    finally:
        publisher.close()
