"""Keeps the KV index (kv_index.py) current: for each backend `KVEventFollower` learns the
event endpoints (given, or from the engine's `GET /kv_events`), subscribes over ZeroMQ and
applies every batch in sequence order. A gap is filled from the replay socket; what replay
no longer holds (or a router that starts late) comes from a snapshot; an engine that
restarted (its sequence starts again) is cleared and resynced. A backend the pool no
longer offers leaves the index at once. Runs in the router's event loop (zmq.asyncio).
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from engine.kv_event_wire import AllBlocksCleared, decode_batch
from engine.kv_events import END_SEQ, SNAPSHOT_REQUEST
from paged_router.kv_index import KVIndex

if TYPE_CHECKING:
    from paged_router.metrics import RouterMetrics

logger = logging.getLogger("paged_router")


def connectable(endpoint: str, backend_url: str) -> str:
    """An engine's bound address (`tcp://*:5557`, `tcp://0.0.0.0:5557`) as the router
    reaches it: the backend URL's host in place of a wildcard host."""
    scheme, _, rest = endpoint.partition("://")
    host, _, port = rest.rpartition(":")
    if scheme == "tcp" and host in ("*", "0.0.0.0", "[::]", "::", ""):
        host = urlsplit(backend_url).hostname or "127.0.0.1"
        host = f"[{host}]" if ":" in host else host
        return f"tcp://{host}:{port}"
    return endpoint


class KVEventFollower:
    """One task per backend, following its KV events into `index`."""

    REPLAY_TIMEOUT = 2.0
    SYNC_GRACE = 5.0  # seconds a starting router waits for the engines' snapshots at most

    def __init__(self, index: KVIndex, *, endpoints: dict[str, tuple[str, str | None]] | None
                 = None, metrics: RouterMetrics | None = None,
                 on_block_size: Callable[[str, int], None] | None = None) -> None:
        import zmq.asyncio

        self.index, self.static = index, endpoints or {}
        self.metrics, self.on_block_size = metrics, on_block_size
        self.ctx = zmq.asyncio.Context.instance()
        self.tasks: dict[str, asyncio.Task] = {}
        self.last_seq: dict[str, int | None] = {}  # None: no replay; the next batch is a base
        self.resyncs: dict[str, list[str]] = {}  # url -> how it resynced, in order
        self.synced: set[str] = set()  # backends whose first snapshot is in the index
        self.started: float | None = None  # when track() was first called
        self._ready = False

    def ready(self) -> bool:
        """True once the backends followed so far (at least one) have their first snapshot
        in the index, or SYNC_GRACE seconds after the first track() (an engine without
        events must not keep the router out of service); then for good. Until then a
        starting router, or one that restarted, would place its first requests as new
        prefixes, by the ring. (Discovery may offer no backend at first: not ready yet.)"""
        if not self._ready and self.started is not None:
            self._ready = (bool(self.tasks) and self.tasks.keys() <= self.synced
                           or time.monotonic() - self.started > self.SYNC_GRACE)
        return self._ready

    def track(self, urls: Iterable[str]) -> None:
        """Follow exactly these backends: new ones start, gone ones leave the index now."""
        wanted = set(urls)
        if self.started is None:
            self.started = time.monotonic()
        for url in list(self.tasks):
            if url not in wanted:
                self.tasks.pop(url).cancel()
                self.index.drop(url)
                self.last_seq.pop(url, None)
                self._export(url)
        for url in wanted - self.tasks.keys():
            self.tasks[url] = asyncio.get_running_loop().create_task(self._follow(url))

    async def stop(self) -> None:
        tasks = list(self.tasks.values())
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        self.tasks.clear()

    async def _endpoints(self, url: str) -> tuple[str, str | None, str]:
        if url in self.static:
            pub, replay = self.static[url]
            return pub, replay, ""
        import httpx

        async with httpx.AsyncClient(timeout=5.0) as client:
            reply = await client.get(url + "/kv_events")
        if reply.status_code != 200:
            raise RuntimeError(f"{url}/kv_events answered {reply.status_code}: start the engine "
                               "with --kv-events-config '{\"enable_kv_cache_events\": true, "
                               "\"replay_endpoint\": \"tcp://*:5558\"}'")
        info = reply.json()
        if self.on_block_size is not None and info.get("block_size"):
            self.on_block_size(url, int(info["block_size"]))
        replay = info.get("replay_endpoint")
        return (connectable(info["endpoint"], url),
                connectable(replay, url) if replay else None, info.get("topic") or "")

    async def _follow(self, url: str) -> None:
        import zmq

        while True:  # until cancelled: a failure waits, clears this backend and starts over
            sub = replay = None
            try:
                pub_ep, replay_ep, topic = await self._endpoints(url)
                sub = self.ctx.socket(zmq.SUB)
                sub.setsockopt(zmq.LINGER, 0)
                sub.setsockopt_string(zmq.SUBSCRIBE, topic)
                sub.connect(pub_ep)
                if replay_ep:
                    replay = self.ctx.socket(zmq.DEALER)
                    replay.setsockopt(zmq.LINGER, 0)
                    replay.connect(replay_ep)
                await self._snapshot(url, replay)  # a router that starts late starts here
                self.synced.add(url)
                while True:
                    _, seq_bytes, payload = await sub.recv_multipart()
                    await self._on_batch(url, int.from_bytes(seq_bytes, "big"), payload, replay)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 - unreachable engine, bad reply: retry
                logger.warning("KV events of %s: %s; retrying", url, exc)
                self.index.clear(url)
                self._export(url)
                await asyncio.sleep(1.0)
            finally:
                for sock in (sub, replay):
                    if sock is not None:
                        sock.close(linger=0)

    async def _on_batch(self, url: str, seq: int, payload: bytes, replay: Any) -> None:
        last = self.last_seq[url]
        _, events = decode_batch(payload)
        clears = bool(events) and isinstance(events[0], AllBlocksCleared)
        if last is None:   # no replay socket: the index holds what arrives from here on
            self._apply(url, seq, events)
        elif seq == last + 1 or (clears and seq > last):
            self._apply(url, seq, events)  # in order, or a rebase: history no longer matters
        elif seq <= last:
            if seq < last or clears:  # the engine restarted: its sequence began again
                self._resynced(url, "restart")
                self.index.clear(url)   # at once: routing must not use the old blocks meanwhile
                if clears:
                    self._apply(url, seq, events)
                else:
                    await self._snapshot(url, replay)
                    if self.last_seq[url] is None:
                        self._apply(url, seq, events)
        else:  # a gap: replay what the buffer still holds, else a snapshot
            if not await self._replay(url, replay, last + 1, seq):
                await self._snapshot(url, replay)
            after = self.last_seq[url]
            if after is None or after + 1 == seq:
                self._apply(url, seq, events)

    def _apply(self, url: str, seq: int, events: list) -> None:
        self.index.apply(url, events)
        self.last_seq[url] = seq
        if self.metrics is not None:
            self.metrics.kv_events.labels(backend=url).inc(len(events))
        self._export(url)

    async def _ask(self, replay: Any, request: bytes) -> list[tuple[int, bytes]]:
        await replay.send_multipart([b"", request])
        out = []
        while True:
            _, seq, payload = await asyncio.wait_for(replay.recv_multipart(), self.REPLAY_TIMEOUT)
            if seq == END_SEQ:
                return out
            out.append((int.from_bytes(seq, "big"), payload))

    async def _replay(self, url: str, replay: Any, start: int, until: int) -> bool:
        """Applies batches start..until-1 from the replay buffer; False if any is missing."""
        if replay is None:
            return False
        for seq, payload in await self._ask(replay, start.to_bytes(8, "big")):
            if seq >= until:
                break
            if seq != self.last_seq[url] + 1:
                return False  # a hole: dropped by the engine or gone from its buffer
            self._apply(url, seq, decode_batch(payload)[1])
        if self.last_seq[url] + 1 == until:
            self._resynced(url, "replay")
            return True
        return False

    async def _snapshot(self, url: str, replay: Any) -> None:
        if replay is None:  # no replay socket: start from the next batch that arrives
            self.index.clear(url)
            self.last_seq[url] = None
            self._export(url)
            return
        (seq, payload), *_ = await self._ask(replay, SNAPSHOT_REQUEST)
        self.index.clear(url)
        self._apply(url, seq, decode_batch(payload)[1])
        self._resynced(url, "snapshot")

    def _resynced(self, url: str, how: str) -> None:
        self.resyncs.setdefault(url, []).append(how)
        if self.metrics is not None:
            self.metrics.kv_resyncs.labels(backend=url, how=how).inc()

    def _export(self, url: str) -> None:
        if self.metrics is not None:
            self.metrics.kv_index_blocks.labels(backend=url).set(self.index.size(url))
