"""The disk tier (engine/kv_offload/disk.py): files shared by engines, never wrong tokens
from a bad file, a bound that holds with several writers, a full disk skipped and counted."""
from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap

import pytest
import torch
from test_kv_offload import GREEDY, prompts, run_phases, with_tail

from engine import LLM
from engine.kv_event_wire import BlockStored
from engine.kv_medium import Medium
from engine.kv_offload.disk import HEADER, DiskTier, trim_target

SHAPE = (2, 2, 4, 2, 8)  # [2, layers, block_size, kv_heads, head_dim]
NS = b"n" * 32


def tier(root, capacity=1 << 20, namespace=NS, dtype=torch.float32) -> DiskTier:
    return DiskTier(root, capacity, namespace=namespace, block_shape=SHAPE, dtype=dtype)


def block(seed: int) -> torch.Tensor:
    return torch.randn(SHAPE, generator=torch.Generator().manual_seed(seed))


def test_a_written_block_reads_back_and_a_restarted_tier_finds_it(tmp_path):
    tier(tmp_path).write(b"h" * 16, block(1))
    assert torch.equal(tier(tmp_path).read(b"h" * 16), block(1))
    assert tier(tmp_path).read(b"x" * 16) is None


@pytest.mark.parametrize("damage, kind", [
    (lambda raw: raw[:-1], "truncated"),
    (lambda raw: raw[:HEADER.size - 3], "truncated"),
    (lambda raw: raw[:-5] + bytes([raw[-5] ^ 0x40]) + raw[-4:], "corrupt"),
    (lambda raw: raw[:4] + (99).to_bytes(2, "little") + raw[6:], "foreign"),  # format version
])
def test_damaged_files_are_misses(tmp_path, damage, kind):
    disk = tier(tmp_path)
    disk.write(b"h" * 16, block(1))
    path = disk.path_for(b"h" * 16)
    path.write_bytes(damage(path.read_bytes()))
    assert disk.read(b"h" * 16) is None
    assert disk.bad_files[kind] == 1


def test_another_engines_block_under_our_name_is_a_miss(tmp_path):
    """A file of another namespace (model, dtype, layout) is never taken for ours."""
    theirs, ours = tier(tmp_path, namespace=b"t" * 32), tier(tmp_path)
    theirs.write(b"h" * 16, block(1))
    os.replace(theirs.path_for(b"h" * 16), ours.path_for(b"h" * 16))
    assert ours.read(b"h" * 16) is None and ours.bad_files["foreign"] == 1
    half = tier(tmp_path / "half", dtype=torch.float16)
    half.write(b"h" * 16, block(1).half())
    os.replace(half.path_for(b"h" * 16), ours.path_for(b"h" * 16))
    assert ours.read(b"h" * 16) is None and ours.bad_files["foreign"] == 2


def test_a_failed_write_leaves_no_file_and_is_counted_and_logged_once(tmp_path, monkeypatch,
                                                                       caplog):
    disk = tier(tmp_path)
    finals, seen = [disk.path_for(b"a" * 16), disk.path_for(b"b" * 16)], []

    def half_then_full(path, data):  # a disk that fills up in the middle of the write
        with open(path, "wb") as f:
            f.write(data[:len(data) // 2])
        seen.append(any(p.exists() for p in finals))  # what a reader would find meanwhile
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskTier, "_write_file", staticmethod(half_then_full))
    with caplog.at_level(logging.WARNING, logger="engine.kv_offload"):
        assert not disk.write(b"a" * 16, block(1))
        assert not disk.write(b"b" * 16, block(2))
    assert disk.write_failures == 2
    assert seen == [False, False], "a block's file must appear whole or not at all"
    assert [r.message for r in caplog.records].count(caplog.records[0].message) == 1
    assert "No space left" in caplog.records[0].message
    assert os.listdir(tmp_path) == [], "no partial or temporary file may stay"


def test_a_bound_of_zero_skips_and_counts(tmp_path):
    disk = tier(tmp_path, capacity=0)
    assert not disk.write(b"a" * 16, block(1))
    assert disk.writes_skipped == 1 and os.listdir(tmp_path) == []


WRITER = textwrap.dedent("""
    import sys, torch
    from engine.kv_offload.disk import DiskTier
    root, capacity, who = sys.argv[1], int(sys.argv[2]), sys.argv[3]
    disk = DiskTier(root, capacity, namespace=b"n" * 32, block_shape=(2, 2, 4, 2, 8),
                    dtype=torch.float32)
    for i in range(60):
        block = torch.full((2, 2, 4, 2, 8), float(i))
        assert disk.write(f"{who}{i:04d}".encode().ljust(16, b"."), block)
""")


def test_the_bound_holds_with_two_writing_processes(tmp_path):
    file_bytes = tier(tmp_path).file_bytes
    capacity = 10 * file_bytes
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(tmp_path), str(capacity), who])
             for who in ("a", "b")]
    assert [p.wait(timeout=120) for p in procs] == [0, 0]
    sizes = [e.stat().st_size for e in os.scandir(tmp_path)]
    assert 0 < sum(sizes) <= capacity and all(s == file_bytes for s in sizes)


def test_the_bound_trims_the_least_recently_used_and_counts_other_writers_files(tmp_path):
    disk = tier(tmp_path, capacity=3 * tier(tmp_path).file_bytes)
    fb = disk.file_bytes
    for i, h in enumerate((b"a", b"b", b"c")):
        disk.write(h * 16, block(i))
        os.utime(disk.path_for(h * 16), (1000 + i, 1000 + i))
    assert disk.read(b"a" * 16) is not None  # a hit: a is the most recent now
    disk.write(b"d" * 16, block(3))
    assert [disk.path_for(h * 16).exists() for h in (b"a", b"b", b"c", b"d")] == [
        True, False, True, True] and disk.usage_bytes == 3 * fb
    os.unlink(disk.path_for(b"c" * 16))  # another writer removed one, and added a big one
    (tmp_path / ("f" * 64 + ".kvb")).write_bytes(b"x" * 2 * fb)
    os.utime(tmp_path / ("f" * 64 + ".kvb"), (2000, 2000))
    os.utime(disk.path_for(b"d" * 16), (1200, 1200))
    os.utime(disk.path_for(b"a" * 16), (1500, 1500))
    disk.write(b"e" * 16, block(4))  # 5 blocks' bytes: d (1200), then a (1500) go
    assert not disk.path_for(b"a" * 16).exists() and not disk.path_for(b"d" * 16).exists()
    assert disk.usage_bytes == 3 * fb and disk.files_evicted == 3


def test_a_trim_frees_a_tenth_of_the_bound_so_the_next_writes_do_not_trim(tmp_path,
                                                                          monkeypatch):
    """Past the bound a write deletes the oldest files down to trim_target (a tenth of the
    bound free, in whole files), so the writes after it list the directory but stat only
    their own new file, until the bound is passed again."""
    import engine.kv_offload.disk as disk_module

    fb = tier(tmp_path).file_bytes
    disk = tier(tmp_path, capacity=20 * fb)
    keys = [bytes([i]) * 16 for i in range(24)]

    def write(i):
        assert disk.write(keys[i], block(i))
        os.utime(disk.path_for(keys[i]), (1000 + i, 1000 + i))   # written in this order
    for i in range(20):
        write(i)
    assert disk.files_evicted == 0 and disk.usage_bytes == 20 * fb
    stats = []
    real_stat = disk_module._stat
    monkeypatch.setattr(disk_module, "_stat", lambda path: stats.append(path) or real_stat(path))
    write(20)   # 21 files: the three oldest go, 18 stay
    assert disk.files_evicted == 3 and disk.usage_bytes == 18 * fb
    assert [disk.has(k) for k in keys[:4]] == [False, False, False, True]
    assert len(stats) > 20   # the trim read every file's time
    stats.clear()
    write(21)
    write(22)   # back at the bound: no trim, one stat per write (its new file's size)
    assert disk.files_evicted == 3 and disk.usage_bytes == 20 * fb and len(stats) == 2
    write(23)   # past it again
    assert disk.files_evicted == 6 and disk.usage_bytes == 18 * fb
    assert trim_target(20 * fb, fb) == 18 * fb and trim_target(3 * fb, fb) == 3 * fb


def test_a_writer_lists_the_directory_once_per_hundredth_of_the_bound_it_writes(tmp_path):
    """A write adds its file to the last listing's total; the directory is listed again
    after RELIST_SHARE of the bound written (here 3 files), or as soon as that total passes
    the bound, so a lone writer never leaves the directory over it; another writer's files
    count from the next listing on."""
    from engine.kv_offload.disk import RELIST_SHARE

    fb = tier(tmp_path).file_bytes
    disk = tier(tmp_path, capacity=300 * fb)
    assert disk.relist_bytes == 3 * fb == int(300 * fb * RELIST_SHARE)
    assert disk.listings == 1   # at start
    for i in range(9):
        assert disk.write(i.to_bytes(16, "little"), block(i))
    assert disk.listings == 1 + 3 and disk.usage_bytes == 9 * fb
    for name in ("e" * 64, "f" * 64):   # another writer's two files
        (tmp_path / f"{name}.kvb").write_bytes(b"x" * fb)
    assert disk.write((9).to_bytes(16, "little"), block(9))
    assert disk.usage_bytes == 10 * fb   # not listed yet
    for i in (10, 11):
        assert disk.write(i.to_bytes(16, "little"), block(i))
    assert disk.listings == 1 + 4 and disk.usage_bytes == 14 * fb
    for i in range(12, 300):
        assert disk.write(i.to_bytes(16, "little"), block(i))
        on_disk = sum(e.stat().st_size for e in os.scandir(tmp_path))
        assert on_disk <= disk.capacity_bytes and disk.usage_bytes == on_disk, i
    # 14 files before the loop; its writes up to the 300th file listed every third write
    # (writes 14, 17, ..., 296: 95 listings); the one that made 301 files listed at once
    # and trimmed to trim_target; the last one did not list
    assert disk.files_evicted == 301 - trim_target(300 * fb, fb) // fb
    assert disk.listings == 1 + 4 + 95 + 1


# ---- engines on a disk tier ------------------------------------------------------------------

def block_gib(blocks: int) -> float:
    return blocks * 2 * 2 * 16 * 2 * 16 * 4 / 2**30


def disk_llm(path: str, root, **kw) -> LLM:
    args = dict(model=path, block_size=16, num_gpu_blocks_override=10, max_model_len=128,
                kv_offloading_size=block_gib(2), kv_disk_dir=str(root), kv_disk_size=0.01)
    args.update(kw)
    return LLM(**args)


@pytest.fixture(scope="module")
def recompute(tiny_checkpoints):
    llm = LLM(model=tiny_checkpoints["llama"], block_size=16, num_gpu_blocks_override=64,
              max_model_len=128, enable_prefix_caching=False)
    return lambda phases: run_phases(llm, phases)


def test_a_batch_mixing_device_host_disk_and_compute_matches_the_oracle(tiny_checkpoints,
                                                                       recompute, tmp_path):
    first = prompts(seed=11, count=6, prefix_len=48)
    # oldest (disk) ... newest (device), and two new prompts (computed)
    mixed = [with_tail(p, 20 + i) for i, p in enumerate(first[::-1])] + prompts(
        seed=12, count=2, prefix_len=48)
    phases = [[p] for p in first] + [mixed]
    llm = disk_llm(tiny_checkpoints["llama"], tmp_path, num_gpu_blocks_override=14,
                   max_num_seqs=8, max_num_batched_tokens=128)
    assert run_phases(llm, phases) == recompute(phases)
    hits = llm.llm_engine.kv.stats().hits_by_medium
    assert all(hits[m] > 0 for m in ("GPU", "CPU", "Disk")), hits


def block_files(root) -> list[os.DirEntry]:
    """The block files in a disk tier's directory (not its .model-ids cache)."""
    return [e for e in os.scandir(root) if e.name.endswith(".kvb")]


@pytest.mark.parametrize("where", ["same path", "a copy elsewhere"])
def test_a_restarted_engine_finds_its_prefixes_on_disk(tiny_checkpoints, recompute, tmp_path,
                                                       where):
    """Also a replica whose copy of the checkpoint lies elsewhere, with other file times (a
    pod that downloaded it into its own volume): the namespace is the model's content."""
    disk_dir = tmp_path / "kv"
    first = prompts(seed=13, count=4, prefix_len=64)
    run_phases(disk_llm(tiny_checkpoints["llama"], disk_dir, kv_offloading_size=0),
               [[p] for p in first] + [prompts(seed=14, count=3, prefix_len=64)])
    again = [[with_tail(p, 30 + i)] for i, p in enumerate(first)]
    model = tiny_checkpoints["llama"]
    if where != "same path":
        model = str(shutil.copytree(model, tmp_path / "elsewhere" / "llama",
                                    copy_function=shutil.copy))  # new mtimes
    restarted = disk_llm(model, disk_dir)
    assert run_phases(restarted, again) == recompute(again)
    assert restarted.llm_engine.kv.stats().hits_by_medium[Medium.DISK] >= 4 * 64


@pytest.mark.parametrize("damage", ["garbage", "truncate"])
def test_damaged_files_never_give_wrong_tokens(tiny_checkpoints, recompute, tmp_path, damage):
    first = prompts(seed=15, count=4, prefix_len=64)
    run_phases(disk_llm(tiny_checkpoints["llama"], tmp_path, kv_offloading_size=0),
               [[p] for p in first] + [prompts(seed=16, count=3, prefix_len=64)])
    for entry in block_files(tmp_path):
        raw = open(entry.path, "rb").read()
        with open(entry.path, "wb") as f:  # the payload as huge floats, or cut short
            f.write(raw[:HEADER.size] + b"\x7e" * (len(raw) - HEADER.size)
                    if damage == "garbage" else raw[:-100])
    again = [[with_tail(p, 40 + i)] for i, p in enumerate(first)]
    restarted = disk_llm(tiny_checkpoints["llama"], tmp_path)
    assert run_phases(restarted, again) == recompute(again)
    disk = restarted.llm_engine.offload.disk
    assert restarted.llm_engine.kv.stats().hits_by_medium[Medium.DISK] == 0
    assert disk.bad_files["corrupt" if damage == "garbage" else "truncated"] > 0


def test_a_full_disk_skips_and_counts_while_the_engine_serves(tiny_checkpoints, recompute,
                                                             tmp_path, monkeypatch):
    def full(path, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(DiskTier, "_write_file", staticmethod(full))
    phases = [[p] for p in prompts(seed=17, count=5, prefix_len=64)]
    llm = disk_llm(tiny_checkpoints["llama"], tmp_path, kv_offloading_size=0)
    assert run_phases(llm, phases) == recompute(phases)
    assert llm.llm_engine.offload.disk.write_failures > 0
    assert llm.llm_engine.offload.stats.blocks_stored[Medium.DISK] == 0


ENGINE = textwrap.dedent("""
    import json, sys
    from engine import LLM, SamplingParams
    model, root, spec = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
    llm = LLM(model=model, block_size=16, num_gpu_blocks_override=10, max_model_len=128,
              kv_offloading_size=0, kv_disk_dir=root, kv_disk_size=0.01)
    out = []
    for p in spec:
        out += [o.outputs[0].token_ids for o in llm.generate([{"prompt_token_ids": p}],
                SamplingParams(temperature=0.0, max_tokens=8, ignore_eos=True))]
    tiers = llm.llm_engine.offload
    tiers.drain()
    print(json.dumps({"tokens": out, "hits": llm.llm_engine.kv.stats().hits_by_medium,
                      "bad": tiers.disk.bad_files}))
""")


def _engine_process(model: str, root, spec: list[dict]) -> subprocess.Popen:
    ids = json.dumps([p["prompt_token_ids"] for p in spec])
    return subprocess.Popen([sys.executable, "-c", ENGINE, model, str(root), ids],
                            stdout=subprocess.PIPE, text=True)


def _result(proc: subprocess.Popen) -> dict:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0
    return json.loads(out.strip().splitlines()[-1])


def test_two_engine_processes_share_one_directory(tiny_checkpoints, recompute, tmp_path):
    model = tiny_checkpoints["llama"]
    shared = prompts(seed=18, count=4, prefix_len=64)
    mine = [prompts(seed=19 + i, count=4, prefix_len=64) for i in range(2)]
    # both write and read the directory at once, on overlapping prefixes
    a, b = (_engine_process(model, tmp_path, shared + m + [with_tail(p, 50) for p in shared])
            for m in mine)
    ra, rb = _result(a), _result(b)
    # a third engine finds what they wrote
    late = [with_tail(p, 60 + i) for i, p in enumerate(shared + mine[0])]
    rc = _result(_engine_process(model, tmp_path, late))
    for spec, r in ((shared + mine[0] + [with_tail(p, 50) for p in shared], ra),
                    (shared + mine[1] + [with_tail(p, 50) for p in shared], rb),
                    (late, rc)):
        assert r["tokens"] == recompute([spec])
        assert r["bad"] == {"truncated": 0, "corrupt": 0, "foreign": 0}, \
            "a reader saw a partial file"
    assert rc["hits"][Medium.DISK] >= 4 * 64


def test_a_step_evicting_many_blocks_spills_them_all(tiny_checkpoints, recompute, tmp_path):
    """Block size 1: one admission evicts over a hundred blocks at once, and every one of
    them reaches the disk (one copy job per step, not one per block)."""
    first = prompts(seed=21, count=4, prefix_len=112)  # the last two evict the first two
    llm = disk_llm(tiny_checkpoints["llama"], tmp_path, block_size=1, kv_offloading_size=0,
                   num_gpu_blocks_override=130)
    run_phases(llm, [[p] for p in first])
    tiers = llm.llm_engine.offload
    assert tiers.stats.stores_dropped == 0
    assert tiers.stats.blocks_stored[Medium.DISK] >= 2 * 112
    again = [[with_tail(p, 70 + i)] for i, p in enumerate(first[:2])]
    restarted = disk_llm(tiny_checkpoints["llama"], tmp_path, block_size=1,
                         num_gpu_blocks_override=130)
    assert run_phases(restarted, again) == recompute(again)
    assert restarted.llm_engine.kv.stats().hits_by_medium[Medium.DISK] >= 2 * 112


def test_each_block_written_to_disk_is_counted_once(tiny_checkpoints, tmp_path):
    """blocks_stored[Disk] (vllm:kv_offload_blocks_stored{medium="Disk"}) counts the files
    written: with room for all of them, one per file in the directory. A block read back
    from disk passes through the (empty) host tier without being written again, also when
    the pool evicts it once more (every prefix comes back, so each is loaded and evicted
    again)."""
    first = prompts(seed=23, count=4, prefix_len=64)
    llm = disk_llm(tiny_checkpoints["llama"], tmp_path, kv_offloading_size=0)
    run_phases(llm, [[p] for p in first] + [[with_tail(p, 50)] for p in first]
               + [[with_tail(first[0], 70)]])
    assert llm.llm_engine.kv.stats().hits_by_medium[Medium.DISK] > 0
    tiers = llm.llm_engine.offload
    files = len(block_files(tmp_path))
    assert files >= 4 and tiers.stats.stores_dropped == 0
    assert tiers.stats.blocks_stored[Medium.DISK] == files


def test_disk_writes_are_announced_as_disk_and_counted_like_the_events(tiny_checkpoints,
                                                                      tmp_path):
    """A block spilled to disk is a BlockStored event of medium Disk naming its hash; the
    events' stores per tier match the tiers' own counters."""
    from engine.kv_events import KVEventRecorder

    llm = disk_llm(tiny_checkpoints["llama"], tmp_path)
    engine = llm.llm_engine
    recorder = KVEventRecorder(16)
    engine.kv.events = recorder
    events = []
    for p in prompts(seed=24, count=4, prefix_len=64):
        llm.generate([p], GREEDY)
        events += recorder.take()
        engine.offload.drain()
    stored = {m: [h for e in events if isinstance(e, BlockStored) and e.medium == m
                  for h in e.block_hashes] for m in ("CPU", "Disk")}
    stats = engine.offload.stats
    assert stats.blocks_stored[Medium.DISK] > 0
    assert len(stored["Disk"]) == stats.blocks_stored[Medium.DISK] == len(block_files(tmp_path))
    assert len(stored["CPU"]) == stats.blocks_stored["CPU"] > 0
    assert set(stored["Disk"]) <= set(stored["CPU"]), "spilled from the host tier"
