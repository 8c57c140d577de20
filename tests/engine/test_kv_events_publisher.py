"""The KV-event publisher's set-up and failure paths (engine/kv_events.py): which addresses
are bound and which connected, the configuration reaching its sockets and queues, the
counters' exposition, a malformed replay request, and a publisher thread that fails
(logged, sockets closed, the engine unaffected)."""
from __future__ import annotations

import logging
import time

import pytest
import zmq
from prometheus_client import CollectorRegistry, generate_latest

import engine.kv_events as kv_events
from engine.kv_events import END_SEQ, SNAPSHOT_REQUEST, KVEventRecorder, ZmqKVEventPublisher


class FakeSocket:
    def __init__(self) -> None:
        self.calls: list[tuple[str, str]] = []

    def bind(self, endpoint: str) -> None:
        self.calls.append(("bind", endpoint))

    def connect(self, endpoint: str) -> None:
        self.calls.append(("connect", endpoint))

    def getsockopt_string(self, option: int) -> str:
        assert option == zmq.LAST_ENDPOINT
        return "bound:" + self.calls[-1][1]


@pytest.mark.parametrize("endpoint, how", [
    ("tcp://*:5557", "bind"), ("tcp://127.0.0.1:*", "bind"), ("tcp://[::]:5557", "bind"),
    ("ipc:///tmp/kv-events", "bind"), ("inproc://kv", "bind"),
    ("tcp://10.0.0.7:5557", "connect"), ("tcp://router.ns.svc:5557", "connect")])
def test_a_wildcard_ipc_or_inproc_address_is_bound_any_other_connected(endpoint, how):
    """vLLM's rule: a `*` host or port, an IPv6 wildcard, ipc and inproc bind (the address
    bound is returned); a concrete remote address is connected to."""
    sock = FakeSocket()
    got = kv_events._bind(sock, endpoint, "endpoint")
    assert sock.calls == [(how, endpoint)]
    assert got == ("bound:" + endpoint if how == "bind" else endpoint)


def test_the_configuration_reaches_the_sockets_and_queues(monkeypatch):
    asked = []
    real_bind = kv_events._bind

    def bind(sock, endpoint, label):
        asked.append((label, endpoint))
        return real_bind(sock, f"inproc://kv-config-{len(asked)}", label)
    monkeypatch.setattr(kv_events, "_bind", bind)
    recorder = KVEventRecorder(block_size=4)
    defaults = ZmqKVEventPublisher({}, recorder)
    given = ZmqKVEventPublisher({"endpoint": "tcp://*:6001", "replay_endpoint": "tcp://*:6002",
                                 "hwm": 17, "max_queue_size": 5, "buffer_steps": 3,
                                 "topic": "kv"}, recorder)
    try:
        assert asked == [("endpoint", "tcp://*:5557"), ("endpoint", "tcp://*:6001"),
                         ("replay_endpoint", "tcp://*:6002")]   # no replay unless asked
        assert defaults._replay is None and defaults.replay_endpoint is None
        assert defaults._pub.get_hwm() == 100_000 and given._pub.get_hwm() == 17
        assert (defaults._queue.maxsize, given._queue.maxsize) == (100_000, 5)
        assert (defaults._buffer.maxlen, given._buffer.maxlen) == (10_000, 3)
        assert (defaults.topic, given.topic) == ("", "kv")
        assert defaults._pub.getsockopt(zmq.LINGER) == 0 == given._replay.getsockopt(zmq.LINGER)
    finally:
        defaults.close()
        given.close()


def test_the_counters_are_exposed_with_their_help():
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-help"}, recorder)
    try:
        registry = CollectorRegistry()
        registry.register(publisher.collector())
        text = generate_latest(registry).decode()
    finally:
        publisher.close()
    for line in ("# HELP paged:kv_events_batches_published_total KV event batches sent.",
                 "# HELP paged:kv_events_published_total KV events sent.",
                 "# HELP paged:kv_events_bytes_published_total KV event payload bytes sent.",
                 "# HELP paged:kv_events_batches_dropped_total KV event batches dropped "
                 "because the publisher's queue was full (subscribers resync).",
                 "paged:kv_events_batches_published_total 1.0",   # the start's clear
                 "paged:kv_events_batches_dropped_total 0.0"):
        assert line in text.splitlines(), line


def test_a_malformed_replay_request_is_logged_and_the_next_one_answered(caplog):
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-bad",
                                     "replay_endpoint": "inproc://kv-bad-replay"}, recorder)
    replay = zmq.Context.instance().socket(zmq.DEALER)
    replay.connect(publisher.replay_endpoint)
    try:
        with caplog.at_level(logging.WARNING, logger="engine.kv_events"):
            replay.send_multipart([b"just one frame"])   # two at the ROUTER
            replay.send_multipart([b"", SNAPSHOT_REQUEST])
            assert replay.poll(10_000)
            _, seq, _ = replay.recv_multipart()
            assert seq == (0).to_bytes(8, "big")          # the start's clear: seq 0
            assert replay.recv_multipart()[1] == END_SEQ
        assert "ignored a KV-event replay request of 2 frames" in caplog.messages
    finally:
        replay.close(linger=0)
        publisher.close()


def test_a_failing_publisher_thread_is_logged_and_closes_its_sockets(caplog):
    """The engine's own step never sees the failure: the thread logs it and ends, its
    sockets closed, and close() still returns."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-fail",
                                     "replay_endpoint": "inproc://kv-fail-replay"}, recorder)

    def broken(*args):
        raise RuntimeError("the encoder broke")
    publisher._send = broken
    with caplog.at_level(logging.ERROR, logger="engine.kv_events"):
        recorder.stored(b"a" * 16, None, [1, 2])
        publisher.flush()
        deadline = time.monotonic() + 10
        while publisher._thread.is_alive():
            assert time.monotonic() < deadline, "the publisher thread did not end"
            time.sleep(0.005)
    assert "the KV event publisher stopped" in caplog.messages
    assert publisher._pub.closed and publisher._replay.closed
    publisher.close()   # returns at once: nothing left to stop
