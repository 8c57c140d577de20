"""The follower on live batches (router/paged_router/kv_follower.py): through `track()`, the
sockets `GET /kv_events` names (its topic subscribed), batches published after the
snapshot reach the index; an engine without a replay socket is followed from the next
batch it sends (after a gap or a restart too: the index holds what arrived since); a
refused backend is retried with the flag to set in the log; readiness comes from the
snapshots; leaving and stopping leave nothing behind."""
from __future__ import annotations

import asyncio
import logging
from typing import Any

from test_router_precise import E, buffered, new_publisher, publish

from engine.kv_events import KVEventRecorder, ZmqKVEventPublisher
from paged_router.kv_follower import KVEventFollower
from paged_router.kv_index import KVIndex
from paged_router.metrics import RouterMetrics


async def _until(check, what: str, timeout: float = 20.0) -> None:
    loop = asyncio.get_running_loop()
    deadline = loop.time() + timeout
    while not check():
        assert loop.time() < deadline, f"timed out waiting for {what}"
        await asyncio.sleep(0.01)


async def _serve_info(info: dict, host: str = "127.0.0.1") -> tuple[Any, str]:
    """An engine's GET /kv_events (aiohttp), as the follower discovers the sockets."""
    from aiohttp import web

    app = web.Application()

    async def answer(_: Any) -> Any:
        return web.json_response(info)
    app.router.add_get("/kv_events", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, host, 0)
    await site.start()
    return runner, f"http://{host}:{site._server.sockets[0].getsockname()[1]}"


HOST = "127.0.0.2"   # a loopback address that is not the wildcard's fallback (127.0.0.1)


def test_batches_published_after_the_snapshot_reach_the_index(caplog):
    """Discovered sockets (wildcard hosts, topic "kv", no block-size callback) bound on
    the backend's own address only, the snapshot, then live stores and a removal; a
    refused backend beside it is retried, each time with the flag to set."""
    recorder, publisher = new_publisher(topic="kv", endpoint=f"tcp://{HOST}:*",
                                        replay_endpoint=f"tcp://{HOST}:*")
    publish(recorder, publisher, [("+", 0)])
    buffered(publisher, 1)
    info = publisher.info()
    for key in ("endpoint", "replay_endpoint"):   # as the engine binds them: tcp://*:PORT
        info[key] = info[key].replace(HOST, "*")
    missing = "http://127.0.0.1:9"

    async def scenario() -> tuple:
        runner, url = await _serve_info(info, HOST)
        index, metrics = KVIndex(), RouterMetrics()
        follower = KVEventFollower(index, metrics=metrics)
        follower.SYNC_GRACE = 600.0
        try:
            follower.track([url])
            await _until(lambda: url in follower.synced, "the snapshot")
            assert follower.ready()   # every followed backend has its snapshot: ready now
            await asyncio.sleep(0.3)   # the SUB socket's subscription reaches the PUB
            publish(recorder, publisher, [("+", 1), ("+", 2)], [("-", 0)])
            await _until(lambda: index.blocks.get(url) == {E[1], E[2]}, "the live batches")
            live = dict(follower.last_seq)
            follower.track([url, missing])
            await _until(lambda: sum("KV events of http://127.0.0.1:9" in r.getMessage()
                                     for r in caplog.records) >= 2, "a retry", timeout=30)
            return url, index, follower, live, metrics
        finally:
            await follower.stop()
            await runner.cleanup()

    try:
        with caplog.at_level(logging.WARNING, logger="paged_router"):
            url, index, follower, live, metrics = asyncio.run(scenario())
    finally:
        publisher.close()
    assert live == {url: publisher.last_seq}   # every batch applied, in order, by the PUB
    assert follower.resyncs[url] == ["snapshot"]   # no gap: nothing replayed
    warnings = [r.getMessage() for r in caplog.records if missing in r.getMessage()]
    assert len(warnings) >= 2 and all(w.startswith(f"KV events of {missing}: ") and w.endswith("; retrying")
               for w in warnings)
    assert metrics.registry.get_sample_value("paged_router_kv_index_blocks",
                                             {"backend": url}) == 2


def test_a_404_names_the_flag_that_turns_the_events_on(caplog):
    async def scenario() -> str:
        from aiohttp import web

        app = web.Application()
        runner = web.AppRunner(app)   # no route: GET /kv_events answers 404
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        follower = KVEventFollower(KVIndex())
        follower.track([url])
        try:
            await _until(lambda: any("answered 404" in r.getMessage()
                                     for r in caplog.records), "the 404")
        finally:
            await follower.stop()
            await runner.cleanup()
        return url

    with caplog.at_level(logging.WARNING, logger="paged_router"):
        url = asyncio.run(scenario())
    (message,) = {r.getMessage() for r in caplog.records if "answered 404" in r.getMessage()}
    assert message == (f"KV events of {url}: {url}/kv_events answered 404: start the engine "
                       "with --kv-events-config '{\"enable_kv_cache_events\": true, "
                       "\"replay_endpoint\": \"tcp://*:5558\"}'; retrying")


def test_without_a_replay_socket_the_index_holds_what_arrived_since():
    """An engine publishing without replay_endpoint: the follower starts from the first
    batch it receives (not from an empty index it can never fill), and after a gap or a
    restart from the batch that shows it."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": "tcp://127.0.0.1:*"}, recorder)
    try:
        publish(recorder, publisher, [("+", 0)], [("+", 1)], [("+", 2)], [("-", 1)],
                [("+", 3)])
        batches = buffered(publisher, 5)   # seq 0: the engine's start (all cleared)
        assert publisher.replay_endpoint is None

        async def scenario() -> tuple:
            follower = KVEventFollower(KVIndex())
            await follower._snapshot("u", None)   # what _follow does with no replay socket
            seen = [follower.last_seq["u"]]
            await follower._on_batch("u", 2, batches[2], None)   # 1 was sent before it came
            seen.append(set(follower.index.blocks["u"]))
            await follower._on_batch("u", 3, batches[3], None)   # in order
            seen.append(set(follower.index.blocks["u"]))
            await follower._on_batch("u", 5, batches[5], None)   # 4 missed: a gap
            seen.append(set(follower.index.blocks["u"]))
            await follower._on_batch("u", 1, batches[1], None)   # below: a restart
            seen.append(set(follower.index.blocks["u"]))
            return follower, seen

        follower, seen = asyncio.run(scenario())
    finally:
        publisher.close()
    assert seen == [None, {E[1]}, {E[1], E[2]}, {E[3]}, {E[0]}]
    assert follower.last_seq["u"] == 1 and follower.resyncs["u"] == ["restart"]


def test_a_discovered_engine_without_replay_or_topic_is_followed_live():
    """GET /kv_events names no replay socket and no topic: the follower subscribes to
    everything and indexes what arrives from its first batch on."""
    recorder = KVEventRecorder(block_size=2)
    publisher = ZmqKVEventPublisher({"endpoint": f"tcp://{HOST}:*"}, recorder)
    info = publisher.info()
    info.update(endpoint=info["endpoint"].replace(HOST, "*"), topic=None)

    async def scenario() -> tuple:
        runner, url = await _serve_info(info, HOST)
        follower = KVEventFollower(KVIndex())
        try:
            follower.track([url])
            await _until(lambda: url in follower.synced, "the (empty) start")
            await asyncio.sleep(0.3)   # the subscription reaches the PUB
            publish(recorder, publisher, [("+", 0), ("+", 1)], [("-", 0)])
            await _until(lambda: follower.index.blocks.get(url) == {E[1]}, "the live batches")
            return url, dict(follower.last_seq), follower.resyncs
        finally:
            await follower.stop()
            await runner.cleanup()

    try:
        url, last, resyncs = asyncio.run(scenario())
    finally:
        publisher.close()
    assert last == {url: publisher.last_seq} and resyncs == {}


def test_leaving_and_stopping_leave_nothing_behind():
    """A backend dropped at once (its task not yet run) and one dropped after it synced:
    no sequence, no blocks, a zero gauge; stop() waits for every task to end."""
    recorder, publisher = new_publisher()
    publish(recorder, publisher, [("+", 0), ("+", 1)])
    buffered(publisher, 1)

    async def scenario() -> tuple:
        runner, url = await _serve_info(publisher.info())
        metrics = RouterMetrics()
        follower = KVEventFollower(KVIndex(), metrics=metrics)
        try:
            follower.track(["http://127.0.0.1:9"])
            follower.track([])   # before its task ran: nothing to pop, no error
            follower.track([url])
            await _until(lambda: url in follower.synced, "the snapshot")
            gauge = metrics.registry.get_sample_value("paged_router_kv_index_blocks",
                                                      {"backend": url})
            task = follower.tasks[url]
            follower.track([])
            after = (dict(follower.last_seq), follower.index.size(url),
                     metrics.registry.get_sample_value("paged_router_kv_index_blocks",
                                                       {"backend": url}))
            follower.track([url])
            tasks = list(follower.tasks.values())
            await follower.stop()
            ended = all(t.done() for t in tasks)   # stop() waited for them
            return gauge, after, task, tasks, follower, ended
        finally:
            await runner.cleanup()

    try:
        gauge, after, task, tasks, follower, ended = asyncio.run(scenario())
    finally:
        publisher.close()
    assert gauge == 2 and after == ({}, 0, 0)
    assert task.cancelled()
    assert tasks and ended and not follower.tasks
