"""The KV-event publisher's edges (engine/kv_events.py) without an engine: batches in the
map layout of newer vLLM releases, digest-bytes hashes, the recorder's merging of runs,
the counters it exports, a replay request of the wrong shape, an endpoint that cannot be
bound, and `make_publisher`'s switches."""
from __future__ import annotations

import time

import msgpack
import pytest
import zmq

from engine.kv_event_wire import AllBlocksCleared, BlockRemoved, BlockStored
from engine.block_hash import external_hash
from engine.kv_events import (END_SEQ, KVEventRecorder, ZmqKVEventPublisher, apply_events,
                              decode_batch, encode_batch, make_publisher)


def test_the_map_layout_of_newer_releases_decodes_to_the_same_events():
    payload = msgpack.packb({"ts": 2.5, "events": [
        {"type": "BlockStored", "block_hashes": [b"\x00" * 7 + b"\x09" + b"x" * 24],
         "parent_block_hash": None, "token_ids": [1, 2], "block_size": 2, "medium": "CPU"},
        {"type": "BlockStored", "block_hashes": [5]},
        {"type": "BlockRemoved", "block_hashes": [5], "medium": "GPU"},
        {"type": "AllBlocksCleared"}]})
    ts, events = decode_batch(payload)
    assert ts == 2.5
    assert events == [BlockStored([b"\x00" * 7 + b"\x09" + b"x" * 24], None, [1, 2], 2,
                       None, "CPU"),
                      BlockStored([5], None, [], 0, None, None),
                      BlockRemoved([5], "GPU"), AllBlocksCleared()]
    state: dict = {}
    apply_events(state, events[:3])
    assert state == {"CPU": {9: (None, (1, 2))}, "GPU": {}}
    assert decode_batch(msgpack.packb({"events": []})) == (0.0, [])
    # the array layout, with map-shaped events inside, as some releases mix them
    mixed = msgpack.packb([1.0, [{"type": "BlockRemoved", "block_hashes": [3]}]])
    assert decode_batch(mixed) == (1.0, [BlockRemoved([3], None)])


def test_apply_events_chains_parents_and_splits_tokens_by_block_size():
    state: dict = {}
    apply_events(state, [BlockStored([1, 2, 3], 7, [1, 2, 3, 4, 5, 6], 2, None, "GPU"),
                         BlockStored([4, 5], None, [9, 8], None, None, "GPU")])  # no size: 1
    assert state == {"GPU": {1: (7, (1, 2)), 2: (1, (3, 4)), 3: (2, (5, 6)), 4: (None, (9,)),
                             5: (4, (8,))}}
    apply_events(state, [BlockRemoved([2, 9], "CPU"), BlockRemoved([2, 4, 5], "GPU")])
    assert state == {"GPU": {1: (7, (1, 2)), 3: (2, (5, 6))}}


def test_the_recorder_merges_chained_stores_and_removals_of_one_medium():
    r = KVEventRecorder(block_size=2)
    a, b, c = b"a" * 16, b"b" * 16, b"c" * 16
    ea, eb, ec = (external_hash(h) for h in (a, b, c))
    r.stored(a, None, [1, 2])
    r.stored(b, a, [3, 4])            # chains on a: one event
    r.stored(c, None, [5, 6])         # a new root: a new event
    r.copied(b, "CPU")                # another medium: a new event
    r.copied(b"z" * 16, "CPU")        # unknown block: nothing
    r.removed(a)
    r.removed(c)                      # merged with the removal of a
    r.removed(b, "CPU")               # another medium
    assert r.take() == [BlockStored([ea, eb], None, [1, 2, 3, 4], 2, None, "GPU"),
                        BlockStored([ec], None, [5, 6], 2, None, "GPU"),
                        BlockStored([eb], ea, [3, 4], 2, None, "CPU"),
                        BlockRemoved([ea, ec], "GPU"), BlockRemoved([eb], "CPU")]
    assert r.take() == [] and r.cached == {eb: (ea, (3, 4))} and r.tiers == {"CPU": {}}
    r.removed(b)
    r.copied(b, "Disk")               # removed this step, still known: copied with its info
    assert r.take()[-1] == BlockStored([eb], ea, [3, 4], 2, None, "Disk")
    r.copied(b, "CPU")                # from the disk tier's copy, a step later
    assert r.take() == [BlockStored([eb], ea, [3, 4], 2, None, "CPU")]


def test_counters_replay_shapes_and_closing_twice():
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-wire",
                                     "replay_endpoint": "inproc://kv-wire-replay",
                                     "topic": "t"}, recorder)
    replay = zmq.Context.instance().socket(zmq.DEALER)
    replay.connect(publisher.replay_endpoint)
    try:
        recorder.stored(b"a" * 16, None, [1, 2])
        publisher.flush()
        publisher.flush()             # nothing pending: no batch
        deadline = time.monotonic() + 10
        while publisher.last_seq < 1:  # the publisher thread sent batch 1 (and buffered it)
            assert time.monotonic() < deadline, "batch 1 was never sent"
            time.sleep(0.001)
        replay.send_multipart([b"", b"x", b"y"])  # four frames at the ROUTER: ignored
        replay.send_multipart([b"", (1).to_bytes(8, "big")])
        assert replay.poll(10_000)
        _, seq, payload = replay.recv_multipart()
        assert seq == (1).to_bytes(8, "big") and isinstance(decode_batch(payload)[1][0], BlockStored)
        assert replay.recv_multipart()[1] == END_SEQ
        replay.send_multipart([b"", b"12345"])  # neither a seq nor "snapshot": just the end
        assert replay.poll(10_000) and replay.recv_multipart()[1] == END_SEQ
        sizes = [len(encode_batch(0.0, [AllBlocksCleared()]))]
        assert publisher._next_seq == 2 and publisher.last_seq == 1
        counters = {m.name: m.samples[0].value for m in publisher.collector().collect()}
        assert counters == {"paged:kv_events_batches_published": 2,
                            "paged:kv_events_published": 2,
                            "paged:kv_events_bytes_published": publisher.bytes_published,
                            "paged:kv_events_batches_dropped": 0}
        assert publisher.bytes_published == sizes[0] + len(payload)
        info = publisher.info()
        assert info == {"publisher": "zmq", "endpoint": "inproc://kv-wire",
                        "replay_endpoint": "inproc://kv-wire-replay", "topic": "t",
                        "block_size": 2, "medium": "GPU",
                        "hash": "engine.block_hash.external_hash", "last_seq": 1}
    finally:
        replay.close(linger=0)
        publisher.close()
    publisher.close()                 # a second close does nothing
    assert not publisher._thread.is_alive()


def test_an_endpoint_that_cannot_be_bound_names_the_setting():
    recorder = KVEventRecorder(block_size=2)
    first = ZmqKVEventPublisher({"endpoint": "inproc://kv-taken"}, recorder)
    try:
        with pytest.raises(ValueError, match=r"kv_events_config.endpoint 'inproc://kv-taken': "
                                             r".*choose a free port or another address"):
            ZmqKVEventPublisher({"endpoint": "inproc://kv-taken"}, recorder)
        with pytest.raises(ValueError, match="kv_events_config.replay_endpoint"):
            ZmqKVEventPublisher({"endpoint": "inproc://kv-free",
                                 "replay_endpoint": "inproc://kv-taken"}, recorder)
    finally:
        first.close()


def test_make_publisher_is_off_unless_enabled_and_wires_the_recorder():
    class Manager:
        block_size, events = 4, None

    kv = Manager()
    assert make_publisher(None, kv) is None
    assert make_publisher({"enable_kv_cache_events": False}, kv) is None
    assert make_publisher({"enable_kv_cache_events": True, "publisher": "null"}, kv) is None
    assert kv.events is None
    publisher = make_publisher({"enable_kv_cache_events": True,
                                "endpoint": "inproc://kv-made"}, kv)
    try:
        assert kv.events is publisher.recorder and kv.events.block_size == 4
        assert publisher.replay_endpoint is None and publisher.topic == ""
    finally:
        publisher.close()


def test_the_typed_events_are_vllms_bytes_and_decode_by_name():
    """engine/kv_event_wire.py: the structs encode to exactly the tagged arrays vLLM sends
    (fields in its order), an older publisher's shorter arrays decode with the defaults,
    and an event type this reader does not know is skipped."""
    events = [AllBlocksCleared(), BlockStored([1, 2**63 + 5], b"\x01" * 8, [1, 2, 3], 16, None,
                                              "GPU"), BlockRemoved([7], "CPU")]
    vllm = msgpack.packb([1.5, [["AllBlocksCleared"],
                                ["BlockStored", [1, 2**63 + 5], b"\x01" * 8, [1, 2, 3], 16,
                                 None, "GPU"], ["BlockRemoved", [7], "CPU"]]])
    assert encode_batch(1.5, events) == vllm and decode_batch(vllm) == (1.5, events)
    older = msgpack.packb([2.0, [["BlockStored", [1], None, [], 16], ["Future", 1],
                                 ["BlockRemoved", [1]]]])
    ts, got = decode_batch(older)
    assert got == [BlockStored([1], None, [], 16), BlockRemoved([1])]
    assert (got[0].where, got[1].where, got[0].medium) == ("GPU", "GPU", None)
