"""The follower's resync paths the other tests do not reach: a replay whose buffer has a
hole (it holds batches again, but not the first one missed) and a batch delivered twice."""
from __future__ import annotations

import asyncio
from typing import Any

from test_router_precise import E, buffered, follow, new_publisher, publish

from engine.kv_event_wire import AllBlocksCleared, BlockStored
from engine.kv_events import encode_batch
from paged_router.kv_follower import KVEventFollower


def test_a_replay_with_a_hole_falls_back_to_a_snapshot():
    """Buffer of 2: the follower saw batch 0, missed 1-3 and gets 4 live; replay from 1
    answers 3 and 4 only. Applying 3 after 0 would lose block 1 (stored in batch 2): the
    follower must see the hole and resync by snapshot."""
    recorder, publisher = new_publisher(buffer_steps=2)
    try:
        publish(recorder, publisher, [("+", 0)], [("+", 1)], [("-", 0)], [("+", 4)])
        batches = buffered(publisher, 4)
        assert sorted(batches) == [3, 4]

        async def script(follower: KVEventFollower, replay: Any) -> None:
            follower.last_seq["u"] = 0
            follower.index.apply("u", [AllBlocksCleared()])
            await follower._on_batch("u", 4, batches[4], replay)

        index, follower = asyncio.run(follow(publisher, script))
        assert index.blocks["u"] == {E[1], E[4]}
        assert follower.resyncs["u"] == ["snapshot"] and follower.last_seq["u"] == 4
    finally:
        publisher.close()


def test_a_batch_delivered_twice_is_ignored_without_a_resync():
    recorder, publisher = new_publisher()
    try:
        publish(recorder, publisher, [("+", 0), ("+", 1)], [("-", 0), ("+", 2)])
        batches = buffered(publisher, 2)

        async def script(follower: KVEventFollower, replay: Any) -> None:
            follower.last_seq["u"] = 0
            follower.index.apply("u", [AllBlocksCleared()])
            for seq in (1, 2, 2):  # 2 again: the same seq, not a clear
                await follower._on_batch("u", seq, batches[seq], replay)

        index, follower = asyncio.run(follow(publisher, script))
        assert index.blocks["u"] == {E[1], E[2]}
        assert "u" not in follower.resyncs and follower.last_seq["u"] == 2
    finally:
        publisher.close()


def test_a_follower_learns_the_endpoints_from_the_engine_and_exports_its_counters():
    """No endpoints given: GET /kv_events (the wildcard host replaced by the backend's)
    gives the sockets, the topic and the block size; a backend answering 404 is retried
    with the flag to set in the log and holds nothing. Counters per backend: events
    applied, resyncs by kind, blocks held."""
    from aiohttp import web

    from paged_router.kv_index import KVIndex
    from paged_router.metrics import RouterMetrics

    recorder, publisher = new_publisher(topic="kv")
    publish(recorder, publisher, [("+", 0), ("+", 1)])
    buffered(publisher, 1)  # sent: the snapshot the follower asks for holds both blocks
    info = publisher.info()
    info["endpoint"] = info["endpoint"].replace("127.0.0.1", "*")

    async def scenario() -> tuple:
        app = web.Application()
        app.router.add_get("/kv_events", lambda _: web.json_response(info))
        runner = web.AppRunner(app)
        await runner.setup()
        site = web.TCPSite(runner, "127.0.0.1", 0)
        await site.start()
        url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
        missing = "http://127.0.0.1:9"  # nothing listens: refused, retried
        sizes, metrics, index = {}, RouterMetrics(), KVIndex()
        follower = KVEventFollower(index, metrics=metrics,
                                   on_block_size=lambda u, n: sizes.update({u: n}))
        follower.SYNC_GRACE = 600.0   # not ready by the clock: only by the snapshots
        follower.track([url, missing])
        for _ in range(1000):
            if index.blocks.get(url) == {E[0], E[1]}:
                break
            await asyncio.sleep(0.01)
        ready = follower.ready()
        await follower.stop()
        await runner.cleanup()
        return url, sizes, metrics, index, follower, ready

    try:
        url, sizes, metrics, index, follower, ready = asyncio.run(scenario())
    finally:
        publisher.close()
    assert index.blocks[url] == {E[0], E[1]} and sizes == {url: 2}
    assert follower.resyncs[url] == ["snapshot"] and follower.synced == {url}
    assert not follower.tasks and not ready  # the unreachable backend never synced
    sample = metrics.registry.get_sample_value
    assert sample("paged_router_kv_events_total", {"backend": url}) == 3  # clear + 2 stores
    assert sample("paged_router_kv_resyncs_total", {"backend": url, "how": "snapshot"}) == 1
    assert sample("paged_router_kv_index_blocks", {"backend": url}) == 2


def test_wildcard_hosts_of_every_spelling_take_the_backends_host():
    from paged_router.kv_follower import connectable

    for bound in ("tcp://*:5557", "tcp://0.0.0.0:5557", "tcp://[::]:5557", "tcp://:::5557",
                  "tcp://:5557"):
        assert connectable(bound, "http://10.0.0.7:8000") == "tcp://10.0.0.7:5557", bound
    assert connectable("tcp://[::]:5557", "http://[fd00::1]:8000") == "tcp://[fd00::1]:5557"
    assert connectable("tcp://*:5557", "unix-socket") == "tcp://127.0.0.1:5557"
    assert connectable("ipc:///run/kv", "http://10.0.0.7:8000") == "ipc:///run/kv"


def test_a_rebase_after_a_gap_and_a_restart_announced_by_a_clear_need_no_replay():
    """A live batch that starts with AllBlocksCleared replaces the history: after a gap it
    is applied at once; at or below the last seq it is a restarted engine's first batch
    (cleared, then applied, no snapshot)."""
    from paged_router.kv_index import KVIndex

    async def scenario() -> tuple:
        follower = KVEventFollower(KVIndex())
        follower.last_seq["u"] = 1
        follower.index.store("u", [E[7]])
        rebase = [AllBlocksCleared(), BlockStored([E[2]], None, [], 2, None, "CPU")]
        await follower._on_batch("u", 5, encode_batch(0.0, rebase), None)  # 2-4 missed
        after_gap = (set(follower.index.blocks["u"]), follower.last_seq["u"],
                     list(follower.resyncs.get("u", [])))
        await follower._on_batch("u", 5, encode_batch(0.0, [AllBlocksCleared()]), None)
        return after_gap, (set(follower.index.blocks["u"]), follower.last_seq["u"],
                           follower.resyncs["u"])

    after_gap, after_restart = asyncio.run(scenario())
    assert after_gap == ({E[2]}, 5, [])
    assert after_restart == (set(), 5, ["restart"])
