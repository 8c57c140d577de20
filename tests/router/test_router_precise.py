"""The precise policy and its KV index on their own: scoring by held blocks, the bounded
load (the shared conformance check), and the follower's resync paths against a real
ZeroMQ publisher (gap -> replay, gap the buffer lost -> snapshot, restart -> clear)."""
from __future__ import annotations

import asyncio
import time
from typing import Any

import pytest
from test_router_bounded_load import check_placements

from engine.kv_event_wire import AllBlocksCleared, BlockRemoved, BlockStored
from engine.block_hash import external_hash
from engine.kv_events import KVEventRecorder, ZmqKVEventPublisher
from paged_router.hashing import ring_point
from paged_router.kv_follower import KVEventFollower, connectable
from paged_router.kv_index import KVIndex
from paged_router.policies import (PrecisePolicy, RouteRequest, load_bound,
                                    precise_hit_load_factor)
from paged_router.pool import Backend


def pool(n: int = 3) -> list[Backend]:
    return [Backend(f"http://127.0.0.{i + 2}:8000") for i in range(n)]


def test_index_counts_the_leading_blocks_each_backend_holds():
    index = KVIndex()
    index.apply("a", [BlockStored([1, 2, 3], None, [], 16, None, "GPU")])
    index.apply("b", [BlockStored([1, 2], None, [], 16, None, "GPU"),
                      BlockStored([9], None, [], 16, None, "GPU")])
    assert index.prefix_blocks([1, 2, 3, 4], ["a", "b", "c"]) == {"a": 3, "b": 2, "c": 0}
    # hashes are chained, so holding hash i means holding the prefix up to block i
    assert index.prefix_blocks([1, 9], ["a", "b"]) == {"a": 1, "b": 2}
    index.apply("a", [BlockRemoved([2], "GPU")])
    assert index.prefix_blocks([1, 2, 3], ["a", "b"]) == {"a": 1, "b": 2}
    index.apply("b", [AllBlocksCleared()])
    assert index.prefix_blocks([1, 2, 3], ["a", "b"]) == {"a": 1, "b": 0}
    assert index.size("b") == 0 and 9 not in index.holders
    index.drop("a")
    assert index.holders == {} and "a" not in index.blocks


def test_a_backend_holds_a_block_while_any_of_its_tiers_does():
    """With KV tiers a block moves between media: stored on the host tier (CPU) when the
    device evicts it, back on the device when loaded. Removing one medium's copy leaves
    the others (an event without a medium is the device's)."""
    index = KVIndex()
    index.apply("a", [BlockStored([1, 2], None, [], 16, None, "GPU"),
                      BlockStored([1, 2], None, [], 16, None, "CPU"),
                      BlockStored([3], None, [], 16, None, None)])
    index.apply("a", [BlockRemoved([1, 2], "GPU")])  # evicted from the device only
    assert index.prefix_blocks([1, 2, 3], ["a"]) == {"a": 3}
    index.apply("a", [BlockRemoved([2], "CPU"), BlockRemoved([3], "GPU")])
    assert index.prefix_blocks([1, 2, 3], ["a"]) == {"a": 1} and index.size("a") == 1
    index.apply("a", [BlockRemoved([1], "Disk")])  # a tier that never held it
    assert index.prefix_blocks([1], ["a"]) == {"a": 1}
    index.apply("a", [BlockRemoved([1], "CPU")])
    assert index.holders == {} and index.size("a") == 0


@pytest.mark.parametrize("order", [(0, 1, 2), (2, 1, 0), (1, 2, 0)])
def test_of_equal_runs_the_device_beats_the_host_tier_beats_disk(order):
    """The tiers below the device serve a prefix too, but loading it is slower than
    holding it: of equal leading runs, the most on the device first, then the host tier;
    a longer run still wins, wherever it lies. Mixed with a backend that holds nothing."""
    backends = pool(4)
    gpu, cpu, disk = (backends[i] for i in order)
    policy = PrecisePolicy()
    request = RouteRequest([31, 32, 33])
    for backend, medium in ((disk, "Disk"), (cpu, "CPU"), (gpu, "GPU")):
        policy.index.apply(backend.url, [BlockStored([31, 32], None, [], 16, None, medium)])
    assert policy.choose(request, backends).order[0] is gpu
    policy.index.apply(gpu.url, [BlockRemoved([32], "GPU")])  # its run is one block now
    assert policy.choose(request, backends).order[0] is cpu
    # one block on the device and one on the host beats two on the host tier
    policy.index.apply(gpu.url, [BlockStored([32], None, [], 16, None, "CPU")])
    assert policy.choose(request, backends).order[0] is gpu
    policy.index.apply(gpu.url, [AllBlocksCleared()])
    policy.index.apply(cpu.url, [AllBlocksCleared()])
    assert policy.choose(request, backends).order[0] is disk
    # a longer run on disk beats a shorter one on the device
    policy.index.apply(disk.url, [BlockStored([33], None, [], 16, None, "Disk")])
    policy.index.apply(gpu.url, [BlockStored([31, 32], None, [], 16, None, "GPU")])
    choice = policy.choose(request, backends)
    assert choice.order[0] is disk and choice.hit_chunks == 3


def test_precise_sends_a_request_to_the_backend_holding_most_of_its_prefix():
    backends = pool()
    a, b, c = backends
    policy = PrecisePolicy()
    request = RouteRequest([11, 12, 13, 14])
    owner = policy.choose(request, backends)
    assert owner.decision in ("hash", "balance") and owner.hit_chunks == 0
    holder = next(x for x in backends if x is not owner.order[0])
    policy.index.store(holder.url, [11, 12])
    other = next(x for x in backends if x not in (holder, owner.order[0]))
    policy.index.store(other.url, [11])
    choice = policy.choose(request, backends)
    assert choice.order[0] is holder and choice.decision == "prefix_hit"
    assert choice.hit_chunks == 2
    # the holder evicts (a BlockRemoved): it no longer counts; the one-block holder does
    policy.index.remove(holder.url, [11, 12])
    choice = policy.choose(request, backends)
    assert choice.order[0] is other and choice.hit_chunks == 1
    # a full holder (at the hit bound) yields to the next holder, then to the ring
    tight = PrecisePolicy(load_factor=0.0, hit_load_factor=0.0, index=policy.index)
    policy.index.store(holder.url, [11, 12])
    holder.in_flight = 2                      # mean 1: tight bound 1, hit bound 1+1: full
    assert tight.choose(request, backends).order[0] is other
    holder.in_flight = other.in_flight = 4    # mean 3: tight bound 3, hit bound 4: both full
    choice = tight.choose(request, backends)
    assert choice.order[0] is owner.order[0] and choice.decision == "hash"
    assert choice.order[0].in_flight + 1 <= load_bound(backends, 0.0)


def test_at_low_load_a_holder_with_a_request_in_flight_takes_the_next_one_too():
    # the precise policy's lost hits in the routing benchmark at 2 req/s (its decision log):
    # 4 replicas, the hot prefix's holder has one request in flight, the others none. The
    # mean with the new request is 2/4, so ceil(1.25 * 0.5) and ceil(2 * 0.5) are both 1
    # and the holder counted as full: the request went to a replica that had to prefill it
    backends = pool(4)
    policy = PrecisePolicy(hit_load_factor=1.0)  # the prefix policy's default too
    request = RouteRequest([21, 22, 23, 24])
    ring_pick = policy.choose(request, backends).order[0]
    holder = next(b for b in backends if b is not ring_pick)
    policy.index.store(holder.url, [21, 22, 23])
    holder.in_flight = 1
    choice = policy.choose(request, backends)
    assert choice.order[0] is holder and choice.decision == "prefix_hit"
    assert choice.detail["bound"] == 1 and choice.detail["hit_bound"] == 2
    # a new prefix gets no such slack: one whose ring owner is that backend goes elsewhere
    fresh = next(RouteRequest([h]) for h in (ring_point(f"fresh {k}") for k in range(1000))
                 if policy.ring.walk(h)[0] == holder.url)
    choice = policy.choose(fresh, backends)
    assert choice.order[0] is not holder and choice.decision == "overflow"
    # with two in flight the holder is full (mean 3/4: hit bound max(ceil(1.5), 1 + 1) = 2)
    holder.in_flight = 2
    choice = policy.choose(request, backends)
    assert choice.order[0] is not holder and choice.decision in ("hash", "overflow")


class IndexedPrecise(PrecisePolicy):
    """The index fed as if each request's blocks were cached where it went, and a few
    blocks evicted now and then (the engines' events, without engines)."""

    def record(self, request: RouteRequest, backend: Backend) -> None:
        self.index.store(backend.url, request.hashes)
        if len(self.index.blocks[backend.url]) > 40:
            self.index.remove(backend.url, sorted(self.index.blocks[backend.url])[:10])


def test_by_default_a_holder_may_take_more_from_four_backends_up():
    """Without --hit-load-factor, precise's holders get 2.0 with four backends or more and
    1.0 below (precise_hit_load_factor): the routing benchmark's run 19, where 1.0 turned
    hot tenants' holders away at 16 req/s. Each case tells 2.0 from 1.0 and 1.5, and four
    backends from three."""
    def holder_takes(loads: list[int], **kw) -> bool:
        backends = pool(len(loads))
        policy = PrecisePolicy(**kw)
        request = RouteRequest([31, 32, 33])
        policy.choose(request, backends)
        holder = backends[0]
        policy.index.store(holder.url, [31, 32])
        for b, n in zip(backends, loads):
            b.in_flight = n
        choice = policy.choose(request, backends)
        return choice.order[0] is holder and choice.decision == "prefix_hit"

    assert precise_hit_load_factor(4) == precise_hit_load_factor(8) == 2.0
    assert precise_hit_load_factor(3) == precise_hit_load_factor(1) == 1.0
    # four backends, mean 2 with the new one: bound ceil(3 x 2) = 6 by default; 1.0 and 1.5
    # give max(4, 3 + 1) = 4 and 5, so a holder at 5 is full under those
    assert holder_takes([5, 1, 1, 0])
    assert not holder_takes([5, 1, 1, 0], hit_load_factor=1.0)
    assert not holder_takes([5, 1, 1, 0], hit_load_factor=1.5)
    # three backends, mean 5/3: 1.0 gives max(ceil(10/3), ceil(25/12) + 1) = 4 (full at 4);
    # 2.0 would give 5 and lift the bound (a factor of N - 1)
    assert not holder_takes([4, 0, 0])
    assert holder_takes([4, 0, 0], hit_load_factor=2.0)


@pytest.mark.parametrize("cache_balance", [0.25, None], ids=["balance", "off"])
@pytest.mark.parametrize("hit_load_factor", [1.0, None], ids=["eps_h 1", "default"])
def test_precise_keeps_the_bounded_load_rule(cache_balance, hit_load_factor):
    seen: set[str] = set()
    for seed in range(6):
        n_backends = 2 + seed % 3
        policy = IndexedPrecise(load_factor=0.25, hit_load_factor=hit_load_factor,
                                cache_balance=cache_balance)
        checked = (precise_hit_load_factor(n_backends) if hit_load_factor is None
                   else hit_load_factor)
        seen |= check_placements(policy, seed=seed, n_backends=n_backends,
                                 load_factor=0.25, hit_load_factor=checked)
    assert {"prefix_hit", "hash", "overflow"} <= seen


def test_wildcard_event_endpoints_take_the_backend_host():
    assert connectable("tcp://*:5557", "http://10.1.2.3:8000") == "tcp://10.1.2.3:5557"
    assert connectable("tcp://0.0.0.0:41000", "http://127.0.0.3:9") == "tcp://127.0.0.3:41000"
    assert connectable("tcp://10.9.9.9:5557", "http://10.1.2.3:8000") == "tcp://10.9.9.9:5557"


H = [bytes([i]) * 16 for i in range(8)]  # engine block hashes (16 bytes)
E = [external_hash(h) for h in H]


def publish(recorder: KVEventRecorder, publisher: ZmqKVEventPublisher, *steps) -> None:
    for step in steps:
        for kind, i in step:
            if kind == "+":
                recorder.stored(H[i], None, [i, i])
            else:
                recorder.removed(H[i])
        publisher.flush()


async def follow(publisher: ZmqKVEventPublisher, script) -> tuple[KVIndex, KVEventFollower]:
    """A follower fed by hand: `script(follower, batches)` delivers (or withholds) the
    published batches, as a SUB socket that missed some would."""
    import zmq

    index = KVIndex()
    follower = KVEventFollower(index)
    replay = follower.ctx.socket(zmq.DEALER)
    replay.connect(publisher.replay_endpoint)
    try:
        await script(follower, replay)
    finally:
        replay.close(linger=0)
    return index, follower


def buffered(publisher: ZmqKVEventPublisher, upto: int) -> dict[int, bytes]:
    import time

    deadline = time.monotonic() + 10
    while publisher.last_seq < upto:  # the publisher thread sent them all
        assert time.monotonic() < deadline
        time.sleep(0.005)
    return dict(publisher._buffer)


def new_publisher(**config: Any) -> tuple[KVEventRecorder, ZmqKVEventPublisher]:
    recorder = KVEventRecorder(block_size=2)
    return recorder, ZmqKVEventPublisher(
        {"endpoint": "tcp://127.0.0.1:*", "replay_endpoint": "tcp://127.0.0.1:*", **config},
        recorder)


def test_a_gap_is_filled_by_replay_in_order():
    recorder, publisher = new_publisher()
    try:
        publish(recorder, publisher, [("+", 0), ("+", 1)], [("+", 2)], [("-", 0), ("+", 3)])
        batches = buffered(publisher, 3)

        async def script(follower: KVEventFollower, replay: Any) -> None:
            follower.last_seq["u"] = 0
            follower.index.apply("u", [AllBlocksCleared()])
            await follower._on_batch("u", 3, batches[3], replay)  # 1 and 2 were missed

        index, follower = asyncio.run(follow(publisher, script))
        assert set(index.blocks["u"]) == {E[1], E[2], E[3]}
        assert follower.resyncs["u"] == ["replay"] and follower.last_seq["u"] == 3
    finally:
        publisher.close()


def test_a_gap_the_buffer_no_longer_holds_comes_from_a_snapshot():
    recorder, publisher = new_publisher(buffer_steps=1)
    try:
        publish(recorder, publisher, [("+", 0)], [("+", 1)], [("-", 0)], [("+", 4)])
        batches = buffered(publisher, 4)

        async def script(follower: KVEventFollower, replay: Any) -> None:
            follower.last_seq["u"] = 0
            await follower._on_batch("u", 4, batches[4], replay)

        index, follower = asyncio.run(follow(publisher, script))
        assert set(index.blocks["u"]) == {E[1], E[4]}
        assert follower.resyncs["u"] == ["snapshot"] and follower.last_seq["u"] == 4
    finally:
        publisher.close()


def test_a_restarted_engine_is_cleared_and_resynced():
    recorder, publisher = new_publisher()
    try:
        publish(recorder, publisher, [("+", 5)], [("+", 6)])
        batches = buffered(publisher, 2)

        async def script(follower: KVEventFollower, replay: Any) -> None:
            follower.last_seq["u"] = 50  # what the follower saw of the engine before
            follower.index.store("u", [E[7]])  # a block the old engine held
            await follower._on_batch("u", 2, batches[2], replay)

        index, follower = asyncio.run(follow(publisher, script))
        assert set(index.blocks["u"]) == {E[5], E[6]}
        assert follower.resyncs["u"] == ["restart", "snapshot"]
    finally:
        publisher.close()


def test_precise_without_a_tokenizer_waits_for_the_engines_and_says_why():
    """No --tokenizer: the engines' (GET /tokenizer) is fetched; a backend that serves none
    leaves the router unready, /health naming what failed, and requests unhashed."""
    import httpx
    from router_fakes import FakeBackend
    from router_harness import RouterThread

    from paged_router.engine_tokenizer import EngineTokenizer

    with FakeBackend("127.0.0.6") as engine, \
            RouterThread(backends=[engine.url], policy="precise") as router:
        hasher = router.app.state.forwarder.hasher
        assert isinstance(hasher, EngineTokenizer)
        deadline = time.monotonic() + 15
        while "tokenizer" not in hasher.error:
            assert time.monotonic() < deadline, hasher.error
            time.sleep(0.02)
        health = httpx.get(router.url + "/health")
        assert health.status_code == 503 and not hasher.ready
        assert health.json()["tokenizer"].startswith(f"not yet: {engine.url}/tokenizer: ")
        assert hasher.request_hashes({"prompt": "x" * 100}) == []


def test_mismatched_endpoints_name_the_flag():
    from paged_router.cli import main

    with pytest.raises(SystemExit, match="--kv-events-endpoints lists 1 .* --backends lists 2"):
        main(["--backends", "http://127.0.0.2:8000,http://127.0.0.3:8000", "--policy",
              "precise", "--kv-events-endpoints", "tcp://127.0.0.2:5557"])


def test_a_follower_with_given_endpoints_starts_from_a_snapshot_then_follows_live_batches():
    recorder, publisher = new_publisher()
    try:
        publish(recorder, publisher, [("+", 0), ("+", 1)])  # before the follower starts

        async def scenario() -> tuple[set, set, list]:
            index = KVIndex()
            follower = KVEventFollower(index, endpoints={
                "http://u": (publisher.endpoint, publisher.replay_endpoint)})
            follower.track(["http://u"])

            async def until(condition, nudge=None) -> None:
                for i in range(1000):
                    if condition():
                        return
                    if nudge is not None and i % 20 == 19:
                        nudge()  # one more live batch: a gap is noticed on the next one
                    await asyncio.sleep(0.01)
                raise AssertionError("the index did not follow")

            await until(lambda: index.blocks.get("http://u") == {E[0], E[1]})
            before = set(index.blocks["http://u"])
            # live batches from now on (repeated until the subscription has reached the PUB)
            publish(recorder, publisher, [("-", 0), ("+", 2)])
            await until(lambda: E[2] in index.blocks["http://u"] and
                        E[0] not in index.blocks["http://u"],
                        nudge=lambda: publish(recorder, publisher, [("+", 3)]))
            after = set(index.blocks["http://u"])
            follower.track([])  # the backend went away: out of the index at once
            gone = list(index.blocks)
            await follower.stop()
            return before, after, gone

        before, after, gone = asyncio.run(scenario())
        assert before == {E[0], E[1]}
        assert {E[1], E[2]} <= after and E[0] not in after
        assert gone == []
    finally:
        publisher.close()


def test_a_follower_is_not_ready_before_it_follows_a_backend_unless_the_grace_ran_out():
    follower = KVEventFollower(KVIndex())
    assert not follower.ready()           # nothing tracked yet
    follower.track([])                    # discovery has offered no backend yet
    assert not follower.ready()
    follower.SYNC_GRACE = 0.0             # an engine without events: ready after the grace
    assert follower.ready()
    follower.SYNC_GRACE = 1e9
    assert follower.ready()               # and then for good
