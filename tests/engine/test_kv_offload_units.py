"""OffloadTiers and HostTier alone (engine/kv_offload/tiers.py, host.py), with stand-ins
for the transfer, the worker and the KV cache manager: the counters, the load latency
histogram, refused copies, cancelled loads, the LRU, and the disk tier's upkeep of
temporary files. test_kv_offload.py runs the tiers inside the engine."""
from __future__ import annotations

import os

import pytest

from engine.kv_medium import Medium


def test_load_latencies_fill_a_cumulative_histogram_as_prometheus_reads_it():
    """Each observed load adds to the sum and to the one bucket of the first edge it does
    not exceed (`le`), the last bucket holding what exceeds every edge."""
    from engine.kv_offload.tiers import LOAD_SECONDS_BUCKETS, TierStats

    stats = TierStats()
    seconds = [0.00005, 0.0001, 0.0003, 0.003, 0.003, 0.2, 1.0, 7.0]
    for s in seconds:
        stats.observe_load(s)
    assert stats.load_seconds_sum == pytest.approx(sum(seconds))
    edges = list(LOAD_SECONDS_BUCKETS) + [float("inf")]
    lower = [float("-inf")] + list(LOAD_SECONDS_BUCKETS)
    assert stats.load_buckets == [sum(lo < s <= hi for s in seconds)
                                  for lo, hi in zip(lower, edges)]


def test_a_host_copy_still_in_flight_is_no_hit_until_ready():
    """`find` never hands out a block the worker has not filled yet (the step would load
    garbage); once ready, it is a CPU hit."""
    from engine.kv_offload import HostEntry, HostTier, OffloadTiers

    tiers = OffloadTiers(HostTier(4 * 64, 64), transfer=None, worker=None)
    entry = HostEntry(b"h" * 16)
    tiers.host.insert(entry)
    assert tiers.find(b"h" * 16) is None
    entry.data = "the block"
    entry.ready.set()
    hit = tiers.find(b"h" * 16)
    assert (hit.block_hash, hit.entry, hit.medium) == (b"h" * 16, entry, Medium.CPU)
    assert tiers.find(b"x" * 16) is None


class _Worker:
    """A copy worker whose queue accepts or refuses each job as scripted (jobs never run)."""

    def __init__(self, answers: list[bool]) -> None:
        self.answers, self.jobs = list(answers), []

    def submit(self, job) -> bool:
        ok = self.answers.pop(0)
        if ok:
            self.jobs.append(job)
        return ok


class _Transfer:
    def __init__(self) -> None:
        self.loaded: list[tuple[list, list[int]]] = []

    def gather(self, block_ids):
        return list(block_ids)

    def load(self, data, block_ids):
        self.loaded.append((list(data), list(block_ids)))


class _Pool:
    """The KV cache manager's side of a load: which blocks each finished load registered."""

    def __init__(self) -> None:
        self.ended, self.events, self.blocks = [], None, []

    def end_load(self, block_id, register) -> None:
        self.ended.append((block_id, register))


class _Batch:
    def __init__(self, stores=(), loads=()) -> None:
        self.blocks_to_store, self.blocks_to_load = list(stores), list(loads)


def test_stores_the_copy_queue_refuses_are_counted_as_dropped():
    """A refused fill drops the step's stores; a refused disk write drops the host tier's
    evictions; every refusal adds to stores_dropped (vllm:kv_offload_stores_skipped)."""
    from engine.kv_offload import HostTier, OffloadTiers

    class NoFilesYet:  # a disk tier holding none of these blocks (the writes never run)
        def has(self, block_hash):
            return False

    worker = _Worker([False, True, False, False])
    tiers = OffloadTiers(HostTier(64, 64), _Transfer(), worker, disk=NoFilesYet())
    tiers.transfer(_Batch(stores=[(0, b"h1")]))  # the fill refused: 1 dropped
    assert tiers.stats.stores_dropped == 1 and len(tiers.host) == 0
    tiers.transfer(_Batch(stores=[(1, b"h2"), (2, b"h3")]))  # h2 evicted, its write refused
    assert tiers.stats.stores_dropped == 2 and tiers.host.hashes() == [b"h3"]
    tiers.transfer(_Batch(stores=[(3, b"h4")]))  # the fill refused again
    assert tiers.stats.stores_dropped == 3 and tiers.host.hashes() == [b"h3"]
    assert len(worker.jobs) == 1


def test_loads_run_on_the_worker_and_are_counted_when_polled():
    """A job loads its blocks in order up to the first that cannot be read; the poll ends
    each block's load (registering the loaded ones), counts them by tier, observes one
    latency per job; a cancelled job's blocks end unregistered and count as cancelled."""
    from engine.kv_offload import HostEntry, HostTier, OffloadTiers, TierHit
    from engine.kv_offload.transfer import TransferWorker

    class Disk:
        def read(self, block_hash):
            return None if block_hash == b"\x03" * 16 else f"disk{block_hash[0]}"

    hits = [TierHit(bytes([i]) * 16, HostEntry(bytes([i]) * 16, data=f"kv{i}"),
                    Medium.CPU) for i in range(5)]
    hits[1] = TierHit(b"\x01" * 16, HostEntry(b"\x01" * 16), Medium.DISK)
    hits[3] = TierHit(b"\x03" * 16, HostEntry(b"\x03" * 16), Medium.DISK)  # a bad file
    transfer, pool, worker = _Transfer(), _Pool(), TransferWorker(4, name="kv-load-unit")
    tiers = OffloadTiers(HostTier(4 * 64, 64), transfer, _Worker([]), disk=Disk(),
                         load_worker=worker)
    tiers.kv = pool
    assert tiers.can_plan_load()
    job = tiers.plan_load("seq", [(h, 10 + i) for i, h in enumerate(hits)], [0, 1, 2, 4, 5])
    gone = tiers.plan_load("seq2", [(hits[0], 20)], [0])
    assert tiers.planned_loads() == job.loads + gone.loads
    tiers.cancel_load(gone)  # planned, never started
    assert pool.ended == [(20, False)] and tiers.stats.loads_cancelled == 1
    tiers.transfer(_Batch())
    worker.drain()
    assert transfer.loaded == [(["kv0", "disk1", "kv2"], [10, 11, 12])]
    assert tiers.poll() == [job] and job.num_loaded == 3 and job.kept_blocks() == 4
    assert pool.ended[1:] == [(10, True), (11, True), (12, True), (13, False), (14, False)]
    assert tiers.stats.blocks_loaded == {Medium.CPU: 2, Medium.DISK: 1}
    assert tiers.stats.loads_failed == 2 and sum(tiers.stats.load_buckets) == 1
    assert tiers.host.get(b"\x01" * 16).data == "disk1", "a disk hit is promoted once loaded"
    assert tiers.poll() == []
    # cancelled while the worker runs it: ends unregistered when polled
    late = tiers.plan_load("seq3", [(hits[0], 30)], [0])
    tiers.transfer(_Batch())
    worker.drain()
    tiers.cancel_load(late)
    assert tiers.stats.loads_cancelled == 1
    assert tiers.poll() == [] and pool.ended[-1] == (30, False)
    assert tiers.stats.loads_cancelled == 2 and tiers.stats.blocks_loaded[Medium.CPU] == 2
    worker.close()


def test_the_host_tier_is_an_lru_bounded_by_whole_blocks():
    from engine.kv_offload import HostEntry, HostTier

    for capacity, block in [(-1, 64), (64, 0)]:
        with pytest.raises(AssertionError):
            HostTier(capacity, block)
    assert HostTier(3, 1).max_entries == 3
    tier = HostTier(2 * 64 + 63, 64)  # room for two blocks, not three
    a, b, c = (HostEntry(h * 16, data=h) for h in (b"a", b"b", b"c"))
    assert tier.insert(a) == [] and tier.insert(b) == []
    assert tier.get(b"a" * 16) is a  # now the most recent
    assert tier.insert(c) == [b]
    assert tier.hashes() == [b"a" * 16, b"c" * 16] and tier.used_bytes == 128
    tier.check_invariants()
    # an entry made with its data is ready; one still to be filled is not
    assert a.loadable and not a.on_disk
    pending = HostEntry(b"p" * 16)
    assert not pending.ready.is_set() and not pending.loadable


@pytest.mark.parametrize("policy", ["lru", "arc"])
def test_a_device_eviction_of_a_block_on_the_host_refreshes_it_there(policy):
    """The pool evicting a block the host tier already holds queues no copy, but counts
    as a use of the host's copy: most recent in the LRU, promoted to T2 in ARC. So the
    next insertion evicts another block, not the one the device just gave up."""
    from engine.kv_offload import ArcHostTier, HostEntry, HostTier, OffloadTiers

    host = (HostTier if policy == "lru" else ArcHostTier)(3 * 64, 64)
    tiers = OffloadTiers(host, transfer=None, worker=None)
    a, b, c, d = (bytes([i]) * 16 for i in b"abcd")
    for h in (a, b, c):
        assert host.insert(HostEntry(h)) == []
    tiers.evicted(7, a)
    assert tiers.take_stores() == []
    if policy == "arc":
        assert a in host.t2 and a not in host.t1
    else:
        assert host.hashes() == [b, c, a]
    assert [e.block_hash for e in host.insert(HostEntry(d))] == [b]
    tiers.evicted(8, b)  # gone from the host: a copy is queued
    assert tiers.take_stores() == [(8, b)]


def test_a_disk_write_removes_stale_temporary_files_and_keeps_fresh_ones(tmp_path):
    """A `.tmp-` file older than STALE_TMP_SECONDS is a dead writer's: the next listing
    (once per RELIST_SHARE of the bound written) removes it. A younger one is another
    writer's file in progress: kept, and not counted in the bound (it is no block yet)."""
    import time

    import torch

    from engine.kv_offload.disk import STALE_TMP_SECONDS, SUFFIX, DiskTier

    shape = (2, 1, 2, 1, 4)
    disk = DiskTier(tmp_path, 1 << 20, namespace=b"n" * 32, block_shape=shape,
                    dtype=torch.float32)
    now = time.time()
    ages = {"dead": STALE_TMP_SECONDS + 5, "old-but-alive": STALE_TMP_SECONDS - 5,
            "fresh": 1}
    for who, age in ages.items():
        path = tmp_path / f".tmp-{who}{SUFFIX}"
        path.write_bytes(b"partial")
        os.utime(path, (now - age, now - age))
    listed, written = disk.listings, 0
    while disk.listings == listed:   # the writes until the next listing
        assert disk.write(written.to_bytes(16, "little"), torch.zeros(shape))
        written += 1
        if disk.listings == listed:   # not listed yet: the dead writer's file is still there
            assert (tmp_path / f".tmp-dead{SUFFIX}").exists()
    assert written == -(-disk.relist_bytes // disk.file_bytes)   # its share, in whole files
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".tmp-"))
    assert left == [f".tmp-fresh{SUFFIX}", f".tmp-old-but-alive{SUFFIX}"]
    assert disk.usage_bytes == written * disk.file_bytes
