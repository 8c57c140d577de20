"""Prefix-cache block hashes: the one definition the engine and the router share.

A block's hash digests its parent's hash, its token ids and the request's cache salt, so
two sequences share block i's hash exactly when they share tokens 0..(i+1)*block_size and
the salt. The KV cache manager keys its prefix cache by `hash_block`; the KV events carry
`external_hash` of it (an unsigned 64-bit int, the type vLLM's subscribers decode); the
router's `precise` policy computes the same hashes from the token ids it expects the
engine to see, to look them up in the index the events build. Standard library only (the
router imports this without torch).
"""
from __future__ import annotations

from array import array
from collections.abc import Sequence
from hashlib import blake2b


def hash_block(parent: bytes | None, token_ids: Sequence[int], extra: str | None) -> bytes:
    """Chained hash: a block's identity includes every token before it and the salt."""
    h = blake2b(digest_size=16)
    h.update(parent or b"root")
    h.update(array("q", token_ids).tobytes())
    if extra:
        h.update(b"salt:" + extra.encode())
    return h.digest()


def external_hash(block_hash: bytes) -> int:
    """The hash as KV events publish it: the digest's first 8 bytes, big-endian."""
    return int.from_bytes(block_hash[:8], "big")


def event_hash(h: bytes | int) -> int:
    """A block hash as an event carries it, one int either way: vLLM publishes ints (older
    releases) or the digest bytes (newer)."""
    return external_hash(h) if isinstance(h, bytes) else int(h)


def full_block_hashes(token_ids: Sequence[int], block_size: int, extra: str | None = None,
                      max_blocks: int | None = None) -> list[bytes]:
    """The chained hashes of the full blocks of `token_ids` (a partial tail is never cached)."""
    n = len(token_ids) // block_size
    if max_blocks is not None:
        n = min(n, max_blocks)
    out: list[bytes] = []
    parent = None
    for i in range(n):
        parent = hash_block(parent, token_ids[i * block_size:(i + 1) * block_size], extra)
        out.append(parent)
    return out
