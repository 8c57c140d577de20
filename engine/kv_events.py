"""KV cache events: what enters and leaves each engine's prefix cache, published over ZeroMQ.

vLLM's wire format (`--kv-events-config`, vllm/distributed/kv_events.py), so a subscriber
written for vLLM reads ours:

- PUB socket (`endpoint`): multipart `(topic, seq, payload)`; `seq` an 8-byte big-endian
  counter, +1 per batch; `payload` a msgpack `KVEventBatch` in msgspec's array-like
  layout: `[ts, [event, ...]]`, each event a tagged array:
  `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id, medium]`,
  `["BlockRemoved", block_hashes, medium]`, `["AllBlocksCleared"]`. A BlockStored run
  chains: `block_hashes[i]`'s parent is `block_hashes[i-1]`, the first's is
  `parent_block_hash`; `token_ids` are the blocks' tokens concatenated. Hashes are
  `engine.block_hash.external_hash` (unsigned 64-bit); `medium` is vLLM's name of the tier:
  "GPU" (the device pool), "CPU" (the host tier), "Disk" (the disk tier: stores only, since
  the engines sharing its directory remove each other's files unseen).
- ROUTER socket (`replay_endpoint`): a request `(b"", start_seq)` is answered with
  `(b"", seq, payload)` for every buffered batch with seq >= start_seq (the last
  `buffer_steps`), then `(b"", -1, b"")`. Ours also answers the request `(b"",
  b"snapshot")` with one batch, `[AllBlocksCleared, BlockStored...]` of everything cached
  as of the seq it carries, then the end marker: for a subscriber that starts late or lost
  more than the buffer holds.

The events are typed structs (engine/kv_event_wire.py: BlockStored, BlockRemoved,
AllBlocksCleared, with the codec); everything here and in the router reads them by name.

The engine thread only appends to a list (the KV cache manager calls `stored`/`removed`)
and, once per step, puts the step's events on a bounded queue without waiting (`flush`).
A thread drains the queue: encodes, sends, keeps the replay buffer and its own copy of
what each medium holds for snapshots (a block can be on the device, the host and the disk
at once, and leaves each on its own). A full queue drops the batch, counts it and consumes its
seq (subscribers see the gap); the next batch that fits is a rebase,
`[AllBlocksCleared, BlockStored...]` of the whole cache, so every copy is right again.
The first batch (seq 0) is `[AllBlocksCleared]`: a restarted engine starts empty.
"""
from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from collections.abc import Iterable, Sequence
from typing import Any

from engine.block_hash import event_hash, external_hash
from engine.kv_event_wire import (AllBlocksCleared, BlockRemoved, BlockStored, Event,
                                  all_blocks_cleared, block_removed, block_stored,
                                  decode_batch, encode_batch)
from engine.kv_medium import Medium

__all__ = ["END_SEQ", "SNAPSHOT_REQUEST", "KVEventRecorder", "ZmqKVEventPublisher",
           "apply_events", "block_removed", "block_stored", "all_blocks_cleared",
           "decode_batch", "encode_batch", "make_publisher", "snapshot_events"]

logger = logging.getLogger("engine.kv_events")

END_SEQ = (-1).to_bytes(8, "big", signed=True)
SNAPSHOT_REQUEST = b"snapshot"

Held = dict[int, tuple[int | None, tuple[int, ...]]]  # one medium's {hash: (parent, tokens)}


def apply_events(state: dict[str, Held], events: Iterable[Event]) -> None:
    """Replays events on {medium: {hash: (parent, token_ids)}}, what each tier holds: a
    block leaves only the medium its removal names (a device eviction leaves the host's
    copy), and AllBlocksCleared empties every medium."""
    for event in events:
        if isinstance(event, BlockStored):
            held = state.setdefault(event.where, {})
            # an event without a block size (an older publisher's) holds one token per block
            parent, tokens, size = event.parent_block_hash, event.token_ids, event.block_size or 1
            for i, h in enumerate(event.block_hashes):
                h = event_hash(h)
                held[h] = (None if parent is None else event_hash(parent),
                           tuple(tokens[i * size:(i + 1) * size]))
                parent = h
        elif isinstance(event, BlockRemoved):
            held = state.get(event.where, {})
            for h in event.block_hashes:
                held.pop(event_hash(h), None)
        elif isinstance(event, AllBlocksCleared):
            state.clear()


def snapshot_events(state: dict[str, Held], block_size: int) -> list[Event]:
    """`[AllBlocksCleared, BlockStored per block and medium]`: a batch that rebuilds
    `state` ({medium: {hash: (parent, tokens)}}) from nothing."""
    return [all_blocks_cleared()] + [
        block_stored([h], parent, list(tokens), block_size, medium)
        for medium, held in state.items() for h, (parent, tokens) in held.items()]


class KVEventRecorder:
    """The engine thread's side: collects one step's events (the KV cache manager calls
    `stored` and `removed`; the KV tiers `copied` and `removed` with their medium), merging
    chained stores and consecutive removals of one medium, and keeps {hash: (parent,
    tokens)} of what each medium holds, for a rebase after a dropped batch."""

    def __init__(self, block_size: int, medium: str = Medium.GPU) -> None:
        self.block_size, self.medium = block_size, medium
        self.pending: list[Event] = []
        self.cached: Held = {}  # `medium`'s
        self.tiers: dict[str, Held] = {}  # the other media's
        self._gone: Held = {}  # removed this step

    def _held(self, medium: str | None) -> Held:
        return self.cached if medium in (None, self.medium) else self.tiers.setdefault(medium, {})

    def stored(self, block_hash: bytes, parent: bytes | None, token_ids: Sequence[int],
               medium: str | None = None) -> None:
        h, p = external_hash(block_hash), None if parent is None else external_hash(parent)
        self._stored(h, p, tuple(token_ids), medium or self.medium)

    def _stored(self, h: int, p: int | None, tokens: tuple[int, ...], medium: str) -> None:
        self._held(medium)[h] = (p, tokens)
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockStored) and last.block_hashes[-1] == p \
                and last.medium == medium:
            last.block_hashes.append(h)
            last.token_ids.extend(tokens)
        else:
            self.pending.append(block_stored([h], p, list(tokens), self.block_size, medium))

    def copied(self, block_hash: bytes, medium: str) -> None:
        """The block (known to some medium, or removed this step) is now in `medium` too."""
        h = external_hash(block_hash)
        info = self.cached.get(h) or self._gone.get(h) or next(
            (held[h] for held in self.tiers.values() if h in held), None)
        if info is not None:
            self._stored(h, info[0], info[1], medium)

    def removed(self, block_hash: bytes, medium: str | None = None) -> None:
        medium = medium or self.medium
        h = external_hash(block_hash)
        info = self._held(medium).pop(h, None)
        if info is not None:
            self._gone[h] = info
        last = self.pending[-1] if self.pending else None
        if isinstance(last, BlockRemoved) and last.medium == medium:
            last.block_hashes.append(h)
        else:
            self.pending.append(block_removed([h], medium))

    def take(self) -> list[Event]:
        events, self.pending = self.pending, []
        self._gone = {}
        return events

    def rebase(self) -> list[Event]:
        """`[AllBlocksCleared, BlockStored...]` of every medium (the device's and the
        tiers'): after a dropped batch, what subscribers need to be right again."""
        self.pending, self._gone = [], {}
        return snapshot_events({self.medium: self.cached, **self.tiers}, self.block_size)


def _bind(sock: Any, endpoint: str, label: str) -> str:
    """Binds (a `*` host or port, ipc, inproc: vLLM's rule) or connects; the address bound."""
    import zmq

    try:
        if "*" in endpoint or "::" in endpoint or endpoint.startswith(("ipc://", "inproc://")):
            sock.bind(endpoint)
            return sock.getsockopt_string(zmq.LAST_ENDPOINT)
        sock.connect(endpoint)
        return endpoint
    except zmq.ZMQError as exc:
        raise ValueError(f"kv_events_config.{label} {endpoint!r}: {exc}; choose a free port "
                         "or another address") from None


class ZmqKVEventPublisher:
    """PUB + replay ROUTER sockets served by one thread (see the module's docstring)."""

    def __init__(self, config: dict[str, Any], recorder: KVEventRecorder) -> None:
        import zmq

        self.recorder = recorder
        self.topic = config.get("topic") or ""
        self._ctx = zmq.Context.instance()
        self._pub = self._ctx.socket(zmq.PUB)
        self._pub.set_hwm(config.get("hwm", 100_000))
        self._pub.setsockopt(zmq.LINGER, 0)
        self.endpoint = _bind(self._pub, config.get("endpoint") or "tcp://*:5557", "endpoint")
        self._replay = None
        self.replay_endpoint = None
        if config.get("replay_endpoint"):
            self._replay = self._ctx.socket(zmq.ROUTER)
            self._replay.setsockopt(zmq.LINGER, 0)
            self.replay_endpoint = _bind(self._replay, config["replay_endpoint"],
                                         "replay_endpoint")
        self._queue: queue.Queue = queue.Queue(maxsize=config.get("max_queue_size", 100_000))
        self._buffer: deque[tuple[int, bytes]] = deque(maxlen=config.get("buffer_steps", 10_000))
        self._mirror: dict[str, Held] = {}  # per medium, as sent: what snapshots rebuild
        self._needs_rebase = False  # engine thread: a batch was dropped
        self.batches_dropped = 0
        self.batches_published = self.events_published = self.bytes_published = 0
        self._running = True
        self._next_seq = 1  # engine thread; batch 0, sent here, says this engine starts empty
        self._send(0, time.time(), [all_blocks_cleared()])
        self._thread = threading.Thread(target=self._serve, daemon=True, name="kv-events")
        self._thread.start()

    # ---- engine thread ------------------------------------------------------------------
    def flush(self) -> None:
        """Publishes the step's events; never waits (a full queue drops and counts them)."""
        if self._needs_rebase:
            self._put(self.recorder.rebase())
        elif self.recorder.pending:
            self._put(self.recorder.take())

    def _put(self, events: list[Event]) -> None:
        seq, self._next_seq = self._next_seq, self._next_seq + 1
        try:
            self._queue.put_nowait((seq, time.time(), events))
            self._needs_rebase = False
        except queue.Full:
            self.batches_dropped += 1
            self._needs_rebase = True

    def close(self) -> None:
        if not self._running:
            return
        self._running = False
        try:
            self._queue.put(None, timeout=1.0)
        except queue.Full:
            pass
        self._thread.join(timeout=5.0)

    def info(self) -> dict[str, Any]:
        """What the engine's `/kv_events` route advertises."""
        return {"publisher": "zmq", "endpoint": self.endpoint,
                "replay_endpoint": self.replay_endpoint, "topic": self.topic,
                "block_size": self.recorder.block_size, "medium": self.recorder.medium,
                "hash": "engine.block_hash.external_hash", "last_seq": self.last_seq}

    def collector(self) -> Any:
        """A Prometheus collector of the publisher's counters."""
        from prometheus_client.core import CounterMetricFamily

        publisher = self

        class Collector:
            def collect(self) -> Iterable[Any]:
                for name, doc, value in (
                        ("paged:kv_events_batches_published", "KV event batches sent.",
                         publisher.batches_published),
                        ("paged:kv_events_published", "KV events sent.",
                         publisher.events_published),
                        ("paged:kv_events_bytes_published", "KV event payload bytes sent.",
                         publisher.bytes_published),
                        ("paged:kv_events_batches_dropped", "KV event batches dropped "
                         "because the publisher's queue was full (subscribers resync).",
                         publisher.batches_dropped)):
                    yield CounterMetricFamily(name, doc, value=value)

        return Collector()

    # ---- publisher thread -----------------------------------------------------------------
    def _serve(self) -> None:
        try:
            while True:
                if self._replay is not None:
                    while self._replay.poll(0):
                        self._answer_replay()
                try:
                    item = self._queue.get(timeout=0.02)
                except queue.Empty:
                    if not self._running:
                        break
                    continue
                if item is None:
                    break
                self._send(*item)
        except Exception:  # noqa: BLE001 - the engine keeps serving without events
            logger.exception("the KV event publisher stopped")
        finally:
            self._pub.close(linger=0)
            if self._replay is not None:
                self._replay.close(linger=0)

    def _send(self, seq: int, ts: float, events: list[Event]) -> None:
        payload = encode_batch(ts, events)
        self._pub.send_multipart((self.topic.encode(), seq.to_bytes(8, "big"), payload))
        self._buffer.append((seq, payload))
        apply_events(self._mirror, events)
        self.last_seq = seq  # the last batch sent (publisher thread; 0 by the constructor)
        self.batches_published += 1
        self.events_published += len(events)
        self.bytes_published += len(payload)

    def _answer_replay(self) -> None:
        frames = self._replay.recv_multipart()
        if len(frames) != 3 or frames[1]:
            logger.warning("ignored a KV-event replay request of %d frames (want an empty "
                           "delimiter and the request)", len(frames) - 1)
            return
        client, _, request = frames
        if request == SNAPSHOT_REQUEST:
            payload = encode_batch(time.time(), snapshot_events(
                self._mirror, self.recorder.block_size))
            self._replay.send_multipart((client, b"", self.last_seq.to_bytes(8, "big"), payload))
        elif len(request) == 8:
            start = int.from_bytes(request, "big")
            for seq, payload in self._buffer:
                if seq >= start:
                    self._replay.send_multipart((client, b"", seq.to_bytes(8, "big"), payload))
        self._replay.send_multipart((client, b"", END_SEQ, b""))


def make_publisher(config: dict[str, Any] | None, kv: Any) -> ZmqKVEventPublisher | None:
    """The publisher `kv_events_config` asks for, wired to the KV cache manager `kv`
    (None when events are off)."""
    if not config or not config.get("enable_kv_cache_events") or config.get("publisher") == "null":
        return None
    recorder = KVEventRecorder(kv.block_size)
    publisher = ZmqKVEventPublisher(config, recorder)
    kv.events = recorder
    return publisher
