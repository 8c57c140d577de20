"""The precise policy's tokenizer when the router is given none: fetched from its engines.

Each engine serves the files that decide its token ids at `GET /tokenizer`
(engine/entrypoints/tokenizer_files.py: tokenizer.json, and the chat template it renders
with the special tokens); the router writes them to a folder of its own and hashes with
them exactly as with `--tokenizer MODEL` (hashing.EngineBlockHasher). Until one engine has
answered, requests get no block hashes (placed by the ring and load) and /health says
the router is not ready, so a (re)started router sends nothing it cannot place by the
index. The block size is the engines' too (their /kv_events, through the follower).
"""
from __future__ import annotations

import logging
import tempfile
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import httpx

from paged_router.hashing import EngineBlockHasher

logger = logging.getLogger(__name__)


class EngineTokenizer:
    def __init__(self, block_size: int, max_chunks: int) -> None:
        self._block_size, self.max_chunks = block_size, max_chunks
        self.hasher: EngineBlockHasher | None = None
        self.source: str | None = None      # the engine it came from
        self.error = "no engine asked yet"

    @property
    def ready(self) -> bool:
        return self.hasher is not None

    @property
    def block_size(self) -> int:
        return self._block_size

    @block_size.setter
    def block_size(self, size: int) -> None:   # the engines' (their KV events' info)
        self._block_size = size
        if self.hasher is not None:
            self.hasher.block_size = size

    def request_hashes(self, body: dict[str, Any]) -> list[int]:
        return [] if self.hasher is None else self.hasher.request_hashes(body)

    async def fetch(self, urls: Iterable[str]) -> bool:
        """From the first of `urls` that serves its tokenizer; False when none did."""
        async with httpx.AsyncClient(timeout=30) as client:
            for url in urls:
                try:
                    response = await client.get(url + "/tokenizer")
                    response.raise_for_status()
                    files = response.json()
                    folder = Path(tempfile.mkdtemp(prefix="router-tokenizer-"))
                    for name in ("tokenizer.json", "tokenizer_config.json"):
                        (folder / name).write_text(files[name])
                    self.hasher = EngineBlockHasher(str(folder), self._block_size,
                                                    self.max_chunks)
                except (httpx.HTTPError, ValueError, KeyError, TypeError, OSError) as exc:
                    self.error = f"{url}/tokenizer: {type(exc).__name__}: {exc}"
                    logger.warning("no tokenizer from %s", self.error)
                    continue
                self.source = url
                logger.info("hashing with the tokenizer of %s", url)
                return True
        return False
