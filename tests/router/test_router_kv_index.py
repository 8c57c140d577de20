"""KVIndex's edges (router/paged_router/kv_index.py): hashes as vLLM's digest bytes, events of
releases without a medium, a removal naming several blocks, the device/host split of a
leading run, a backend dropped before it sent anything, and the loss clock's first step."""
from __future__ import annotations

import pytest

from engine.kv_event_wire import BlockRemoved, BlockStored
from paged_router.kv_index import KVIndex


def test_digest_bytes_are_read_as_their_first_eight_bytes_big_endian():
    index = KVIndex()
    digest = bytes(range(1, 33))  # a 32-byte digest, as newer vLLM releases publish
    index.apply("a", [BlockStored([digest], None, [], 16, None, "GPU")])
    assert set(index.holders) == {0x0102030405060708}
    index.apply("a", [BlockRemoved([digest], "GPU")])
    assert index.holders == {} and index.size("a") == 0


def test_events_without_a_medium_are_the_devices():
    """vLLM before media: BlockStored has six fields, BlockRemoved two."""
    index = KVIndex()
    index.apply("a", [BlockStored([1, 2], None, [], 16, None),
                      BlockStored([2], None, [], 16, None, "CPU")])
    assert index.holders == {1: {"a": {"GPU"}}, 2: {"a": {"GPU", "CPU"}}}
    index.apply("a", [BlockRemoved([1, 2])])
    assert index.holders == {2: {"a": {"CPU"}}}


def test_one_removal_of_several_blocks_goes_on_past_a_block_another_tier_keeps():
    index = KVIndex()
    index.apply("a", [BlockStored([1, 2, 3], None, [], 16, None, "GPU"),
                      BlockStored([1], None, [], 16, None, "CPU")])
    index.apply("a", [BlockRemoved([1, 2, 3], "GPU")])
    assert index.holders == {1: {"a": {"CPU"}}} and index.blocks["a"] == {1}
    assert index.held_total == 1 and index.evicted("a") == 2


def test_leading_media_counts_device_blocks_then_host_blocks_of_the_held_run():
    index = KVIndex()
    run = [10, 11, 12, 13, 14, 15]
    index.apply("a", [BlockStored(run[:3], None, [], 16, None, "GPU"),
                      BlockStored(run[1:5], None, [], 16, None, "CPU"),
                      BlockStored(run[5:], None, [], 16, None, "Disk")])
    index.apply("b", [BlockStored(run[:2], None, [], 16, None, "CPU")])
    held = index.prefix_blocks(run, ["a", "b", "c"])
    assert held == {"a": 6, "b": 2, "c": 0}
    # a: 10-12 on the device (11, 12 on the host too), 13-14 on the host only, 15 on disk
    assert index.leading_media(run, held) == {"a": (3, 2), "b": (0, 2), "c": (0, 0)}


def test_a_backend_dropped_before_any_event_leaves_nothing_behind():
    index = KVIndex()
    index.drop("never-seen")
    index.clear("never-seen")
    index.apply("a", [BlockStored([1], None, [], 16, None, "GPU")])
    index.drop("a")
    assert index.holders == {} and index.blocks == {} and index.held_total == 0


def test_the_loss_clock_advances_by_new_blocks_over_blocks_held():
    """One half-life per fleet's worth of new blocks: a block stored while one is held
    is a whole half-life (1 / max(held, 1)), from the very first store."""
    index = KVIndex()
    index.store("a", [1])             # age 1
    index.remove("a", [1])            # one lost at age 1
    assert index.evicted("a") == 1.0
    index.store("a", [2])             # held 1: age 2
    assert index.evicted("a") == pytest.approx(0.5)
    index.store("b", [3, 4])          # held 3: age 2 + 2/3
    assert index.evicted("a") == pytest.approx(0.5 ** (5 / 3))
    assert index.demand("a") == pytest.approx(1 + 0.5 ** (5 / 3))
