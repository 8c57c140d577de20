"""End to end: `python -m paged_router --policy precise` in front of two real engines
(tiny model, small KV pools) publishing KV events; the router learns their event
endpoints from GET /kv_events.

Each prefix used here is chosen so that the consistent-hash ring would send it to the
*other* replica: only the index the events build can send it where it is cached."""
from __future__ import annotations

import time

import httpx
import pytest
from router_harness import engine, router
from test_router_e2e import metric

from paged_router.hashing import EngineBlockHasher
from paged_router.ring import HashRing

pytestmark = pytest.mark.xdist_group("router-precise-e2e")
BLOCK = 16
EVENTS = ('{"enable_kv_cache_events": true, "endpoint": "tcp://%s:*", '
          '"replay_endpoint": "tcp://%s:*"}')


@pytest.fixture(scope="module")
def model_dir() -> str:
    from engine.model_loader import resolve_model_path

    return str(resolve_model_path(None))


@pytest.fixture(scope="module")
def engines():
    import threading

    procs: list = [None, None]

    def start(i: int) -> None:
        host = f"127.0.0.{12 + i}"
        procs[i] = engine(host, "--max-model-len", "256", "--block-size", str(BLOCK),
                          "--num-gpu-blocks-override", "24",
                          "--kv-events-config", EVENTS % (host, host))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    try:
        assert all(procs), "an engine failed to start"
        yield procs
    finally:
        for p in procs:
            if p is not None:
                p.kill()


@pytest.fixture(scope="module")
def front(engines, model_dir):
    state = {"router": router([e.url for e in engines], "--policy", "precise",
                              "--tokenizer", model_dir, "--hash-block-size", str(BLOCK))}
    yield state
    state["router"].kill()


def prompt_owned_by(owner: str, others: list[str], model_dir: str, tag: str) -> str:
    """A prompt of a few blocks whose ring owner (as the router places new prefixes) is
    `owner`."""
    hasher = EngineBlockHasher(model_dir, BLOCK)
    ring = HashRing([owner, *others])
    for k in range(200):
        text = f"{tag} {k}: " + "please summarise the following report in three lines. " * 6
        hashes = hasher.request_hashes({"prompt": text})
        if len(hashes) >= 3 and ring.walk(hashes[0])[0] == owner:
            return text
    raise AssertionError("no prompt hashed to the wanted owner")


def complete(url: str, prompt: str, max_tokens: int = 2) -> httpx.Response:
    r = httpx.post(url + "/v1/completions", timeout=120, json={
        "prompt": prompt, "max_tokens": max_tokens, "temperature": 0})
    assert r.status_code == 200, r.text
    return r


def synced(router_url: str, engines, timeout: float = 30.0) -> None:
    """Waits until the router has applied every batch each engine has published."""
    deadline = time.monotonic() + timeout
    while True:
        want = {e.url: httpx.get(e.url + "/kv_events").json()["last_seq"] for e in engines}
        have = httpx.get(router_url + "/health").json().get("kv_events", {})
        if all(have.get(u, {}).get("last_seq", -1) >= s for u, s in want.items()):
            return
        assert time.monotonic() < deadline, f"router index not synced: {have} vs {want}"
        time.sleep(0.05)


def test_engines_advertise_their_event_endpoints(engines):
    info = httpx.get(engines[0].url + "/kv_events").json()
    assert info["endpoint"].startswith("tcp://127.0.0.12:") and info["block_size"] == BLOCK
    assert info["replay_endpoint"].startswith("tcp://127.0.0.12:")
    text = httpx.get(engines[0].url + "/metrics").text
    assert "paged:kv_events_batches_published_total" in text


def test_a_prefix_served_by_a_replica_goes_back_to_it_until_that_replica_evicts_it(
        engines, front, model_dir):
    a, b = engines
    r = front["router"]
    text = prompt_owned_by(b.url, [a.url], model_dir, "report")
    complete(a.url, text + " first question")  # served by A, straight
    synced(r.url, engines)
    routed = complete(r.url, text + " second question")
    assert routed.headers["x-routed-to"] == a.url
    assert metric(r.url, "paged_router_requests_total", backend=a.url,
                  decision="prefix_hit") == 1
    # A evicts it: four other prompts (about 9 blocks each) fill its 24-block pool
    evicted = metric(a.url, "paged:evictions_total")
    for i in range(4):
        complete(a.url, f"unrelated document {i}: " + "lorem ipsum dolor sit amet. " * 7)
    assert metric(a.url, "paged:evictions_total") > evicted
    synced(r.url, engines)
    routed = complete(r.url, text + " third question")
    assert routed.headers["x-routed-to"] == b.url  # no longer counted on A: the ring's pick
    assert metric(r.url, "paged_router_requests_total", backend=a.url,
                  decision="prefix_hit") == 1


def test_the_engines_tokenizer_hashes_requests_as_the_model_folder_does(engines, model_dir):
    """GET /tokenizer: the files the router hashes with when given no --tokenizer give the
    same block hashes as the model's own folder, for chat (the template) and text."""
    import asyncio

    from paged_router.engine_tokenizer import EngineTokenizer

    fetched = EngineTokenizer(BLOCK, 256)
    assert asyncio.run(fetched.fetch(["http://127.0.0.1:9", engines[0].url]))
    assert fetched.source == engines[0].url and "127.0.0.1:9/tokenizer" in fetched.error
    own = EngineBlockHasher(model_dir, BLOCK)
    chat = {"messages": [{"role": "system", "content": "You answer briefly. " * 8},
                         {"role": "user", "content": "Where is my parcel? " * 4}]}
    text = {"prompt": "please summarise the following report in three lines. " * 6}
    for body in (chat, text, {**text, "cache_salt": "tenant-a"}):
        assert fetched.request_hashes(body) == own.request_hashes(body) != []


def test_a_restarted_router_recovers_the_index_from_snapshots(engines, front, model_dir):
    a, b = engines
    text = prompt_owned_by(b.url, [a.url], model_dir, "invoice")
    complete(a.url, text + " before the restart")
    front["router"].kill()
    # restarted with the backends alone: the tokenizer and block size are the engines'
    r = front["router"] = router([e.url for e in engines], "--policy", "precise")
    synced(r.url, engines)
    deadline = time.monotonic() + 30   # ready: the index synced and the tokenizer fetched
    while httpx.get(r.url + "/health").status_code != 200:
        assert time.monotonic() < deadline, httpx.get(r.url + "/health").json()
        time.sleep(0.05)
    assert httpx.get(r.url + "/health").json()["tokenizer"] in (a.url, b.url)
    assert metric(r.url, "paged_router_kv_resyncs_total", backend=a.url, how="snapshot") >= 1
    routed = complete(r.url, text + " after the restart")
    assert routed.headers["x-routed-to"] == a.url
    assert metric(r.url, "paged_router_requests_total", backend=a.url,
                  decision="prefix_hit") == 1


def test_a_replica_that_goes_away_leaves_the_index(engines, front):
    a, b = engines
    r = front["router"]
    synced(r.url, engines)
    assert a.url in httpx.get(r.url + "/health").json()["kv_events"]
    a.kill()
    deadline = time.monotonic() + 30
    while a.url in httpx.get(r.url + "/health").json()["kv_events"]:
        assert time.monotonic() < deadline, "the dead replica stayed in the index"
        time.sleep(0.05)
    assert metric(r.url, "paged_router_kv_index_blocks", backend=a.url) == 0
