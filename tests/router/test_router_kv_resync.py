"""The follower's resync paths the other tests do not reach: a replay whose buffer has a
hole (it holds batches again, but not the first one missed) and a batch delivered twice."""
from __future__ import annotations

import asyncio
from typing import Any

from test_router_precise import E, buffered, follow, new_publisher, publish

from engine.router.kv_follower import KVEventFollower


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
            follower.index.apply("u", [["AllBlocksCleared"]])
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
            follower.index.apply("u", [["AllBlocksCleared"]])
            for seq in (1, 2, 2):  # 2 again: the same seq, not a clear
                await follower._on_batch("u", seq, batches[seq], replay)

        index, follower = asyncio.run(follow(publisher, script))
        assert index.blocks["u"] == {E[1], E[2]}
        assert "u" not in follower.resyncs and follower.last_seq["u"] == 2
    finally:
        publisher.close()
