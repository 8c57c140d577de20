"""The precise policy through the real router app, against fake backends whose KV events
come from real ZeroMQ publishers (engine/kv_events.py): a burst released at once, and a
restarted router's first request.

A burst: llm-d-router PR 2515 saw every request of a burst go to one pod when all pods
held the prefix (equal scores) and the in-flight counts were updated only after the
decision. Here the router counts a dispatch before it picks the next request, so the
bounded-load rule gives a bound on the spread, derived beside each case below."""
from __future__ import annotations

import asyncio
import math
import time

import httpx
import pytest
from router_fakes import FakeBackend
from router_harness import RouterThread

from engine.kv_events import KVEventRecorder, ZmqKVEventPublisher, block_stored
from paged_router.hashing import EngineBlockHasher
from paged_router.ring import HashRing

BLOCK = 16
SHARED = "You are the support assistant of a parcel courier; answer in two lines. " * 6


@pytest.fixture(scope="module")
def model_dir() -> str:
    from engine.model_loader import resolve_model_path

    return str(resolve_model_path(None))


@pytest.fixture
def fleet():
    """Four fake backends (one second per request), each advertising its own publisher."""
    backends, publishers = [], []
    try:
        for _ in range(4):
            fake = FakeBackend(delay=1.0).__enter__()
            backends.append(fake)
            publisher = ZmqKVEventPublisher({"endpoint": "tcp://127.0.0.1:*",
                                             "replay_endpoint": "tcp://127.0.0.1:*"},
                                            KVEventRecorder(block_size=BLOCK))
            publishers.append(publisher)
            fake.kv_events_info = publisher.info()
        yield backends, publishers
    finally:
        for x in [*backends, *publishers]:
            x.close()


def store(publisher: ZmqKVEventPublisher, hashes: list[int]) -> None:
    """The engine behind `publisher` caches these blocks (one BlockStored, as an engine
    step publishes a prefill's chained blocks)."""
    publisher.recorder.pending.append(block_stored(hashes, None, [], BLOCK))
    publisher.flush()


def wait_for(condition, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, what
        time.sleep(0.01)


async def burst(url: str, prompts: list[str]) -> list[httpx.Response]:
    limits = httpx.Limits(max_connections=None, max_keepalive_connections=None)
    async with httpx.AsyncClient(timeout=60, limits=limits) as client:
        return await asyncio.gather(*(client.post(url + "/v1/completions", json={
            "prompt": p, "max_tokens": 2}) for p in prompts))


N = 64  # requests in a burst, all released at once


@pytest.mark.parametrize("shared", [True, False], ids=["held-everywhere", "new-prefixes"])
def test_a_burst_spreads_within_the_bound_the_rule_gives(fleet, model_dir, shared):
    backends, publishers = fleet
    hasher = EngineBlockHasher(model_dir, BLOCK)
    prompts = [(SHARED if shared else f"Tenant {i}: " + SHARED) + f"Question {i}?"
               for i in range(N)]
    with RouterThread(backends=[b.url for b in backends], policy="precise",
                      tokenizer=model_dir) as router:
        index = router.policy.index
        if shared:  # every backend holds the shared prefix: all scores equal
            held = hasher.request_hashes({"prompt": SHARED})
            for publisher in publishers:
                store(publisher, held)
            wait_for(lambda: all(index.prefix_blocks(held, [b.url])[b.url] == len(held)
                                 for b in backends), "the index never saw the stored blocks")
        replies = asyncio.run(burst(router.url, prompts))
        assert all(r.status_code == 200 for r in replies)
        chosen = {r.headers["x-routed-to"] for r in replies}
        peaks = [b.max_in_flight for b in backends]
        if shared:
            # Every backend holds the same leading blocks, so the holders are ordered by
            # in-flight count and each request goes to a backend with the fewest. With T
            # requests open before it, the fewest is at most floor(T/B), so the pick ends
            # at most at floor(T/B) + 1 <= ceil(N/B) (T + 1 <= N). The hit bound only
            # removes candidates above the mean, never the least loaded one. At the peak
            # the mean is N/B: max/mean <= ceil(N/B) / (N/B) = 1 for 64 on 4.
            bound = math.ceil(N / len(backends))
            assert sum(router.sample("paged_router_requests_total", backend=b.url,
                                     decision="prefix_hit") for b in backends) == N
        else:
            # No backend holds any of them: each is a new prefix, placed under the tight
            # bound ceil((1+eps) * (T+1)/B) with T open before it, at most
            # ceil(1.25 * N/B) = 20 for 64 on 4: max/mean <= 1.25 at the peak.
            bound = math.ceil((1 + 0.25) * N / len(backends))
        assert max(peaks) <= bound, f"in flight at once per backend {peaks}, bound {bound}"
        assert len(chosen) == len(backends)
        assert sum(len(b.requests) for b in backends) == N


def test_a_restarted_router_sends_its_first_request_to_the_holder(fleet, model_dir):
    backends, publishers = fleet
    urls = [b.url for b in backends]
    hasher = EngineBlockHasher(model_dir, BLOCK)
    ring = HashRing(urls)
    prompt = next(p for p in (f"Tenant {k}: " + SHARED for k in range(500))
                  if ring.walk(hasher.request_hashes({"prompt": p})[0])[0] != urls[0])
    # the holder is not the replica the ring would give this new prefix
    with RouterThread(backends=urls, policy="precise", tokenizer=model_dir) as router:
        wait_for(lambda: httpx.get(router.url + "/health").status_code == 200, "never ready")
        store(publishers[0], hasher.request_hashes({"prompt": prompt}))
        wait_for(lambda: router.policy.index.size(urls[0]) > 0, "the event never arrived")
        reply = httpx.post(router.url + "/v1/completions", json={"prompt": prompt + " one?"})
        assert reply.headers["x-routed-to"] == urls[0]
    for fake in backends:  # the new router learns the endpoints slowly, snapshots after
        fake.kv_events_delay = 1.0
    with RouterThread(backends=urls, policy="precise", tokenizer=model_dir) as router:
        # ready means ready to place by the index: the first request goes to the holder
        wait_for(lambda: httpx.get(router.url + "/health").status_code == 200, "never ready")
        reply = httpx.post(router.url + "/v1/completions", json={"prompt": prompt + " two?"},
                           timeout=30)
        assert reply.headers["x-routed-to"] == urls[0]
        assert router.sample("paged_router_kv_resyncs_total", backend=urls[0],
                             how="snapshot") == 1
