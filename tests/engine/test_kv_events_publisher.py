"""The KV-event publisher's set-up and failure paths (engine/kv_events.py): which addresses
are bound and which connected, the configuration reaching its sockets and queues, the
counters' exposition, a malformed replay request, and a publisher thread that fails
(logged, sockets closed, the engine unaffected)."""
from __future__ import annotations

import logging
import subprocess
import sys
import time
from pathlib import Path

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
            replay.send_multipart([b"just one frame"])
            replay.send_multipart([b"no delimiter", SNAPSHOT_REQUEST])
            replay.send_multipart([b"", SNAPSHOT_REQUEST])
            assert replay.poll(10_000)
            _, seq, _ = replay.recv_multipart()
            assert seq == (0).to_bytes(8, "big")          # the start's clear: seq 0
            assert replay.recv_multipart()[1] == END_SEQ
        assert [m for m in caplog.messages if m.startswith("ignored")] == [
            "ignored a KV-event replay request of 1 frames (want an empty delimiter and the "
            "request)", "ignored a KV-event replay request of 2 frames (want an empty "
            "delimiter and the request)"]
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


def _frames(sock: zmq.Socket) -> list[bytes]:
    assert sock.poll(10_000), "no message within 10 s"
    return sock.recv_multipart()


def test_every_message_has_vllms_frames():
    """vLLM's wire layout, which its own consumers parse by position: a PUB message is
    [topic, 8-byte big-endian seq, payload]; every replay answer is [empty delimiter, 8-byte
    seq, payload], the snapshot's seq the last batch sent, and a replay ends with [empty
    delimiter, END_SEQ, empty payload]."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "inproc://kv-frames", "topic": "kv@frames",
                                     "replay_endpoint": "inproc://kv-frames-replay"}, recorder)
    ctx = zmq.Context.instance()
    sub, replay = ctx.socket(zmq.SUB), ctx.socket(zmq.DEALER)
    sub.setsockopt(zmq.SUBSCRIBE, b"")
    sub.connect(publisher.endpoint)
    replay.connect(publisher.replay_endpoint)
    try:
        deadline, block = time.monotonic() + 10, 0
        while not sub.poll(50):   # the subscription reaches the PUB after a moment
            assert time.monotonic() < deadline, "the subscriber got no batch"
            block += 1
            recorder.stored(block.to_bytes(16, "big"), None, [1, 2])
            publisher.flush()
        topic, seq, payload = sub.recv_multipart()
        assert topic == b"kv@frames" and len(seq) == 8 and int.from_bytes(seq, "big") >= 1
        assert kv_events.decode_batch(payload)[1]

        replay.send_multipart([b"", (1).to_bytes(8, "big")])
        answers = []
        while not answers or answers[-1][1] != END_SEQ:
            answers.append(_frames(replay))
        *batches, end = answers
        assert end == [b"", END_SEQ, b""]
        assert [int.from_bytes(b[1], "big") for b in batches] == list(
            range(1, publisher.last_seq + 1))
        assert all(len(b) == 3 and b[0] == b"" and len(b[1]) == 8 for b in batches)

        replay.send_multipart([b"", SNAPSHOT_REQUEST])
        delimiter, seq, payload = _frames(replay)
        assert (delimiter, seq) == (b"", publisher.last_seq.to_bytes(8, "big"))
        assert _frames(replay) == [b"", END_SEQ, b""]
    finally:
        sub.close(linger=0)
        replay.close(linger=0)
        publisher.close()


def test_an_engine_that_exits_without_closing_its_publisher_is_not_held_by_it():
    """The publisher's thread is a daemon: a process that never calls close() (an engine
    killed mid-step, a script) still exits."""
    code = ("from engine.kv_events import KVEventRecorder, ZmqKVEventPublisher\n"
            "ZmqKVEventPublisher({'endpoint': 'inproc://kv-exit'}, KVEventRecorder(2))\n"
            "print('built')\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=30, cwd=Path(__file__).resolve().parents[2])
    assert done.returncode == 0 and done.stdout == "built\n", done.stderr
