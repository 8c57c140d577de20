"""The host KV tier in the simulator (tuner/sim/tiers.py): the engine's own tiers with the
copies in virtual time. The same stream through the real engine (its real model runner and
real block copies, on the same virtual clock) and through the simulator gives the same
schedule with the tier on; a load is done when its bytes' time has passed, and a step with
nothing else to run waits for it; the tier serves prefixes the pool evicted, and leaks no
block."""
from __future__ import annotations

import queue
from types import SimpleNamespace

import pytest

from engine.config import EngineConfig
from engine.kv_medium import Medium
from engine.kv_offload import LOAD_QUEUE_JOBS, OffloadIO
from engine.kv_offload.disk import HEADER
from engine.kv_offload.transfer import make_transfer
from engine.llm_engine import LLMEngine
from engine.model_runner import ModelRunner
from loadtests.workloads.trace import TraceRequest
from tuner.sim.engine import VirtualClock, sim_engine
from tuner.sim.profile import Fit, Identity, Memory, Profile
from tuner.sim.simulate import simulate
from tuner.sim.stream import TraceStream
from tuner.sim.tiers import InlineWorker, VirtualDone, VirtualTransfer, time_copies

STEP = 0.05
KV_BYTES_PER_TOKEN = 4096
LOAD_SECONDS_PER_BYTE = 1.5 * STEP / (3 * 16 * KV_BYTES_PER_TOKEN)   # 3 blocks: 1.5 steps
DISK_FILE_BYTES = HEADER.size + 16 * KV_BYTES_PER_TOKEN
DISK_SECONDS_PER_BYTE = 2 * STEP / DISK_FILE_BYTES   # a disk block: 2 steps


def _profile(*, store=0.0, load=LOAD_SECONDS_PER_BYTE, disk=DISK_SECONDS_PER_BYTE) -> Profile:
    return Profile(Identity("builtin://default", "f" * 64, "cpu", "2.13.0", 1),
                   Fit("tokens", {"intercept": STEP, "num_tokens": 0.0}, 0.0),
                   Memory(0.0, 1.3e7, KV_BYTES_PER_TOKEN, 0.0, 2e4, 2048, 609,
                          store_seconds_per_byte=store, load_seconds_per_byte=load,
                          disk_load_seconds_per_byte=disk), 100)


@pytest.fixture(scope="module")
def hf_config():
    from transformers import AutoConfig

    from engine.model_loader import resolve_model_path
    return AutoConfig.from_pretrained(resolve_model_path(None))


def _trace() -> list[TraceRequest]:
    """Four tenants' 48-token system prompts, revisited after the small pool has given
    them to others' blocks: their second visits find them in the host tier."""
    return [TraceRequest(timestamp=0.1 * i, prompt_tokens=60 + 5 * (i % 3),
                         output_tokens=10 + 3 * (i % 4), prefix_group=f"g{i % 4}",
                         prefix_tokens=48) for i in range(20)]


SETTINGS = dict(block_size=16, max_num_seqs=3, max_num_batched_tokens=64, max_model_len=256,
                num_gpu_blocks_override=18, enable_prefix_caching=True, cpu_threads=1,
                kv_offloading_size=0.05)


def _run(hf_config, engine=None, settings=SETTINGS, profile=None):
    return simulate(profile or _profile(), settings, TraceStream(_trace(), max_model_len=256),
                    duration=60.0, slos={}, hf_config=hf_config, keep_schedule=True,
                    engine=engine)


def test_same_stream_same_schedule_as_the_real_engine_with_the_host_tier(hf_config,
                                                                         monkeypatch):
    """The real engine's model runner runs at a fixed step time on a virtual clock, its
    blocks really copied to and from host memory; only when a load is done comes from
    the clock (the same VirtualDone), as the simulator's does."""
    clock = VirtualClock()

    def offload_io(runner):   # the real pool's copies, each worker inline, loads timed
        transfer = make_transfer(runner.kv_pool)
        return OffloadIO(transfer, InlineWorker(), InlineWorker(LOAD_QUEUE_JOBS),
                         VirtualDone(clock, 16 * KV_BYTES_PER_TOKEN, LOAD_SECONDS_PER_BYTE))
    monkeypatch.setattr(ModelRunner, "offload_io", offload_io)
    real = LLMEngine(EngineConfig(**SETTINGS), clock=clock)
    assert real.offload is not None
    execute = real.runner.execute

    def fixed_step(batch, prompt_logits=None):
        clock.now += STEP
        return execute(batch, prompt_logits)
    real.runner.execute = fixed_step
    measured = _run(hf_config, (real, clock))
    simulated = _run(hf_config)
    assert measured.schedule == simulated.schedule
    for name in ("server_preemptions", "prefix_cache_hit_rate", "host_tier_hit_rate",
                 "evictions", "steps", "completed", "ttft_p50", "e2e_p90"):
        assert measured.figures[name] == pytest.approx(simulated.figures[name]), name
    assert real.offload.stats.blocks_loaded[Medium.CPU] > 0   # real KV came back
    # the stream exercised the tier: prefixes the pool evicted, served from host memory
    assert simulated.figures["host_tier_hit_rate"] > 0.1
    assert simulated.figures["completed"] == len(_trace())


# a host tier of 1 block spills the rest to a disk tier that never fills: both serve hits
DISK_SETTINGS = {**SETTINGS, "kv_offloading_size": 16 * KV_BYTES_PER_TOKEN / 2**30,
                 "kv_disk_size": 0.05}


def test_same_stream_same_schedule_as_the_real_engine_with_a_disk_tier(hf_config, tmp_path,
                                                                       monkeypatch):
    """As above, with the engine's own DiskTier writing and reading real files under a
    small host tier; the simulator's VirtualDisk in its place gives the same schedule,
    the same hits from host memory and from disk, and the same first tokens (a disk
    block's load takes its file bytes' time on both sides)."""
    clock = VirtualClock()

    def offload_io(runner):
        return OffloadIO(make_transfer(runner.kv_pool), InlineWorker(),
                         InlineWorker(LOAD_QUEUE_JOBS),
                         VirtualDone(clock, 16 * KV_BYTES_PER_TOKEN, LOAD_SECONDS_PER_BYTE,
                                     DISK_FILE_BYTES * DISK_SECONDS_PER_BYTE))
    monkeypatch.setattr(ModelRunner, "offload_io", offload_io)
    settings = {**DISK_SETTINGS, "kv_disk_dir": str(tmp_path / "kv")}
    real = LLMEngine(EngineConfig(**settings), clock=clock)
    assert real.offload.disk is not None and real.offload.disk.file_bytes == DISK_FILE_BYTES
    execute = real.runner.execute

    def fixed_step(batch, prompt_logits=None):
        clock.now += STEP
        return execute(batch, prompt_logits)
    real.runner.execute = fixed_step
    measured = _run(hf_config, (real, clock), settings=settings)
    engine, sim_clock = sim_engine(_profile(), settings, hf_config=hf_config)
    simulated = _run(hf_config, (engine, sim_clock), settings=settings)
    assert measured.schedule == simulated.schedule
    for name in ("server_preemptions", "prefix_cache_hit_rate", "host_tier_hit_rate",
                 "disk_tier_hit_rate", "evictions", "steps", "completed", "ttft_p50",
                 "ttft_p90", "e2e_p90"):
        assert measured.figures[name] == pytest.approx(simulated.figures[name]), name
    # real KV came back from files, and the simulator wrote none
    assert real.offload.stats.blocks_loaded[Medium.DISK] > 0
    assert list((tmp_path / "kv").glob("*.kvb"))
    assert simulated.figures["disk_tier_hit_rate"] > 0.02
    assert simulated.figures["host_tier_hit_rate"] > 0.02
    assert engine.offload.stats.blocks_stored[Medium.DISK] == \
        real.offload.stats.blocks_stored[Medium.DISK]
    engine.offload.check_invariants(engine.kv)
    stats = engine.kv.stats()
    assert stats.num_used == 0 and len(engine.offload._done) == 0


def test_slower_disk_loads_delay_first_tokens(hf_config):
    settings = {**DISK_SETTINGS, "kv_disk_dir": "/nonexistent/never-written"}
    fast = _run(hf_config, settings=settings, profile=_profile(disk=0.0))
    slow = _run(hf_config, settings=settings, profile=_profile(disk=DISK_SECONDS_PER_BYTE * 8))
    assert slow.figures["disk_tier_hit_rate"] > 0
    assert slow.figures["ttft_p90"] > fast.figures["ttft_p90"]
    assert "disk_tier_hit_rate" not in _run(hf_config).figures   # no disk, no such figure


@pytest.mark.parametrize("files", [3, 20, 300])
def test_the_virtual_disk_keeps_what_the_real_one_keeps(tmp_path, files):
    """The same writes and reads on the engine's DiskTier (the touched file's mtime set in
    order after each, as a slower clock would have it; a read refreshes it) and on a
    VirtualDisk of the same bound: the same files survive, the same usage, the same trims
    (a bound of 3 files trims to 3, one of 20 to 18, one of 300 to 270: disk.trim_target;
    at 300 the real tier lists its directory every third write: disk.RELIST_SHARE); a
    bound below one file stores nothing."""
    import os
    import random

    import torch

    from engine.kv_offload.disk import DiskTier
    from tuner.sim.tiers import VirtualDisk

    shape = (2, 1, 16, 1, 64)   # 8 KiB of float32
    block = torch.zeros(shape)
    bound = files * (HEADER.size + block.numel() * 4)
    real = DiskTier(tmp_path, bound, namespace=bytes(32), block_shape=shape,
                    dtype=torch.float32)
    virtual = VirtualDisk(bound, block.numel() * 4)
    assert virtual.file_bytes == real.file_bytes
    keys = [k.to_bytes(2, "little") * 8 for k in range(3 * files)]
    rng = random.Random(files)
    ops = [("w", 0), ("w", 1), ("w", 2), ("r", 0), ("w", 3), ("r", 2), ("w", 4), ("r", 1),
           ("w", 5)] if files == 3 else [
        ("r", rng.randrange(k)) if k and rng.random() < 0.3 else ("w", k)
        for k in range(3 * files)]
    for tick, (op, k) in enumerate(ops):
        if op == "w":
            assert real.write(keys[k], block) and virtual.write(keys[k], block)
        else:
            assert (real.read(keys[k]) is None) == (virtual.read(keys[k]) is None)
        if real.has(keys[k]):   # the file this op touched, newest in order
            os.utime(real.path_for(keys[k]), (1000 + tick, 1000 + tick))
        if files < 100 or tick % 25 == 0 or tick == len(ops) - 1:   # (one stat a key)
            assert [real.has(k) for k in keys] == [virtual.has(k) for k in keys], (op, k)
        assert real.has(keys[k]) == virtual.has(keys[k]), (op, k)
        assert real.usage_bytes == virtual.usage_bytes
        assert real.files_evicted == virtual.files_evicted
    if files == 3:
        assert [virtual.has(k) for k in keys] == [False, False, True, False, True, True, False,
                                                  False, False]
    assert virtual.files_evicted > 0
    tiny = VirtualDisk(100, block.numel() * 4)
    assert not tiny.write(keys[0], block) and tiny.writes_skipped == 1 and not tiny.has(keys[0])


def test_the_tier_serves_evicted_prefixes_and_leaks_no_block(hf_config):
    without = _run(hf_config, settings={**SETTINGS, "kv_offloading_size": 0})
    engine, clock = sim_engine(_profile(), SETTINGS, hf_config=hf_config)
    with_tier = _run(hf_config, (engine, clock))
    assert "host_tier_hit_rate" not in without.figures   # no tier, no such figure
    assert with_tier.figures["prefix_cache_hit_rate"] > without.figures["prefix_cache_hit_rate"]
    # less prefill to compute
    assert with_tier.figures["step_prefill_tokens"] < without.figures["step_prefill_tokens"]
    assert engine.offload.io.loaded > 0 and engine.offload.io.stored > 0
    # every request done: no block in use, none waiting for a load
    stats = engine.kv.stats()
    assert stats.num_used == 0 and stats.num_free + stats.num_cached == engine.num_blocks
    assert len(engine.offload._done) == 0 and not engine.scheduler.loading
    engine.offload.check_invariants(engine.kv)


def test_slower_loads_delay_first_tokens_by_their_copy_time(hf_config):
    fast = _run(hf_config, profile=_profile(load=0.0))
    slow = _run(hf_config, profile=_profile(load=LOAD_SECONDS_PER_BYTE * 8))
    assert slow.figures["host_tier_hit_rate"] > 0
    assert slow.figures["ttft_p90"] > fast.figures["ttft_p90"]
    # a store's snapshot costs its step: the same schedule takes longer
    stored = _run(hf_config, profile=_profile(store=LOAD_SECONDS_PER_BYTE * 4))
    assert stored.figures["e2e_p50"] > _run(hf_config).figures["e2e_p50"]


def _job(blocks: int, disk: int = 0):
    hits = ([SimpleNamespace(medium=Medium.CPU)] * blocks
            + [SimpleNamespace(medium=Medium.DISK)] * disk)
    return SimpleNamespace(loads=[(hit, i) for i, hit in enumerate(hits)],
                           read=["x"] * (blocks + disk), seconds=None)


def test_a_load_is_taken_once_its_bytes_time_has_passed():
    clock = VirtualClock(10.0)
    done = VirtualDone(clock, block_bytes=100, load_seconds_per_byte=0.001)   # 0.1 s/block
    first, second = _job(3), _job(1)
    done.put(first)                       # due 10.3
    clock.now = 10.05
    done.put(second)                      # due 10.15
    assert first.seconds == pytest.approx(0.3) and second.seconds == pytest.approx(0.1)
    with pytest.raises(queue.Empty):
        done.get_nowait()
    clock.now = 10.15
    assert done.get_nowait() is second   # the earlier end first, at its end exactly
    with pytest.raises(queue.Empty):     # nothing ends within the wait: the clock waited
        done.get(timeout=0.1)
    assert clock.now == pytest.approx(10.25)
    assert done.get(timeout=0.1) is first and clock.now == pytest.approx(10.3)
    assert len(done) == 0


def test_a_snapshot_moves_the_clock_by_its_bytes():
    clock = VirtualClock(1.0)
    transfer = VirtualTransfer(clock, block_bytes=1000, store_seconds_per_byte=1e-6)
    snapshot = transfer.gather([4, 5])
    assert clock.now == pytest.approx(1.002) and transfer.stored == 2
    assert len(transfer.split(snapshot)) == 2 and all(transfer.split(snapshot))


def test_copy_rates_are_timed_per_byte():
    store, load, disk = time_copies(64 * 1024, blocks=4, repeats=3)
    assert 0 < store < 1e-6 and 0 < load < 1e-6 and 0 < disk < 1e-6   # > 1 MB/s anywhere


def test_a_profile_cached_before_copies_were_timed_gets_them_once(tmp_path, monkeypatch):
    from tuner.sim.calibrate import cached_path, identity
    from tuner.sim.context import load_profile

    monkeypatch.setenv("PAGED_PROFILE_DIR", str(tmp_path))
    ident = identity(None, 1)
    old = _profile(store=None, load=None, disk=None)
    old.identity = ident
    old.save(cached_path(ident))
    loaded = load_profile(None, 1, calibrate=False)
    assert 0 < loaded.memory.load_seconds_per_byte < 1e-6
    assert 0 < loaded.memory.store_seconds_per_byte < 1e-6
    assert 0 < loaded.memory.disk_load_seconds_per_byte < 1e-6
    again = Profile.load(cached_path(ident))   # written back: timed once per machine
    assert again.memory == loaded.memory
    assert again.fit == old.fit
    # one cached with the host tier's rates, before the disk's: those stay, the disk's timed
    host_only = _profile(store=3e-9, load=2e-9, disk=None)
    host_only.identity = ident
    host_only.save(cached_path(ident))
    loaded = load_profile(None, 1, calibrate=False)
    assert (loaded.memory.store_seconds_per_byte, loaded.memory.load_seconds_per_byte) == \
        (3e-9, 2e-9)
    assert 0 < loaded.memory.disk_load_seconds_per_byte < 1e-6
