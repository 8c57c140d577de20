"""The KV events as typed structs, and their wire codec (vLLM's, engine/kv_events.py says
it in full): everything outside `encode_batch` / `decode_batch` reads an event's fields by
name.

msgspec structs tagged by class name in the array layout, fields in vLLM's order, so the
bytes are a `KVEventBatch` as vLLM sends it: `[ts, [["BlockStored", block_hashes,
parent_block_hash, token_ids, block_size, lora_id, medium], ["BlockRemoved",
block_hashes, medium], ["AllBlocksCleared"], ...]]`. Torch-free: the router imports it.
"""
from __future__ import annotations

from typing import Any, Union

import msgspec

from engine.kv_medium import Medium

Hash = Union[int, bytes]   # vLLM publishes ints (older releases) or the digest bytes (newer)


class BlockStored(msgspec.Struct, tag=True, array_like=True):
    """A chained run: block_hashes[i]'s parent is block_hashes[i-1], the first's is
    parent_block_hash; token_ids are the blocks' tokens concatenated."""
    block_hashes: list[Hash]
    parent_block_hash: Hash | None
    token_ids: list[int]
    block_size: int
    lora_id: int | None = None
    medium: str | None = None     # none named (vLLM before media): the device's

    @property
    def where(self) -> str:
        return self.medium or Medium.GPU


class BlockRemoved(msgspec.Struct, tag=True, array_like=True):
    block_hashes: list[Hash]
    medium: str | None = None

    @property
    def where(self) -> str:
        return self.medium or Medium.GPU


class AllBlocksCleared(msgspec.Struct, tag=True, array_like=True):
    pass


Event = Union[BlockStored, BlockRemoved, AllBlocksCleared]


class KVEventBatch(msgspec.Struct, array_like=True):
    ts: float
    events: list[Event]


def block_stored(hashes: list[int], parent: int | None, token_ids: list[int],
                 block_size: int, medium: str | None = Medium.GPU) -> BlockStored:
    return BlockStored(hashes, parent, token_ids, block_size, None, medium)


def block_removed(hashes: list[int], medium: str | None = Medium.GPU) -> BlockRemoved:
    return BlockRemoved(hashes, medium)


def all_blocks_cleared() -> AllBlocksCleared:
    return AllBlocksCleared()


_encoder = msgspec.msgpack.Encoder()
_decoder = msgspec.msgpack.Decoder(KVEventBatch)


def encode_batch(ts: float, events: list[Event]) -> bytes:
    return _encoder.encode(KVEventBatch(ts, events))


def decode_batch(payload: bytes) -> tuple[float, list[Event]]:
    """(ts, events) of a KVEventBatch; also reads the map layout of newer vLLM releases
    (`{"ts":, "events": [{"type": "BlockStored", "block_hashes": ...}]}`) and skips event
    types it does not know (a newer publisher's)."""
    try:
        batch = _decoder.decode(payload)
        return batch.ts, batch.events
    except msgspec.ValidationError:
        pass
    raw = msgspec.msgpack.decode(payload)
    ts, found = (raw.get("ts", 0.0), raw.get("events", [])) if isinstance(raw, dict) else raw
    events = [_event(e) for e in found]
    return float(ts), [e for e in events if e is not None]


def _event(e: Any) -> Event | None:
    if isinstance(e, list):
        return msgspec.convert(e, Event) if e and e[0] in TAGS else None
    tag = e.get("type")
    if tag == "BlockStored":
        return BlockStored(e["block_hashes"], e.get("parent_block_hash"),
                           e.get("token_ids", []), e.get("block_size", 0), e.get("lora_id"),
                           e.get("medium"))
    if tag == "BlockRemoved":
        return BlockRemoved(e["block_hashes"], e.get("medium"))
    return AllBlocksCleared() if tag == "AllBlocksCleared" else None


TAGS = ("BlockStored", "BlockRemoved", "AllBlocksCleared")
