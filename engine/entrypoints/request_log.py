"""Opt-in JSONL request log (`--request-log FILE`): lengths and prefix hashes, never text.

One line per finished (or aborted) engine request, written by the engine-loop thread at
the moment the request's metrics are observed, so the log counts exactly the requests
that `vllm:request_prompt_tokens` / `vllm:request_generation_tokens` count:

  {"ts": 1718000000.123, "prompt_tokens": 412, "output_tokens": 64,
   "finish_reason": "length", "prefix_tokens": 32,
   "prefix_hashes": ["9f2c...", "51ab...", "07de..."]}

`ts` is the wall-clock arrival time (seconds since the epoch). `prefix_hashes[k]` is a
64-bit BLAKE2b hash of the first `prefix_tokens * 2**k` prompt token ids, for every k
with that many tokens in the prompt: the first is the request's prefix group, the later
ones tell how long a shared prefix is (`python -m tuner trace` turns the log into a
replayable trace). A hash of a short token prefix can be matched by someone who guesses
the prompt; the log holds no text, but treat it as you would the service's access log.
"""
from __future__ import annotations

import hashlib
import json
import threading
import time
from array import array
from pathlib import Path
from typing import TextIO

DEFAULT_PREFIX_TOKENS = 32


def prefix_hashes(token_ids: list[int], prefix_tokens: int) -> list[str]:
    """Hashes of the first prefix_tokens * 2**k tokens, k = 0, 1, ... (within the prompt)."""
    if prefix_tokens < 1:
        raise ValueError(f"prefix_tokens must be >= 1, got {prefix_tokens}")
    out, digest, done, depth = [], hashlib.blake2b(digest_size=8), 0, prefix_tokens
    while depth <= len(token_ids):
        digest.update(array("q", token_ids[done:depth]).tobytes())
        out.append(digest.copy().hexdigest())
        done, depth = depth, depth * 2
    return out


class RequestLog:
    """Appends one JSON line per request; safe to call from the engine thread."""

    def __init__(self, path: str | Path, *, prefix_tokens: int = DEFAULT_PREFIX_TOKENS) -> None:
        if prefix_tokens < 1:
            raise ValueError(f"--request-log-prefix-tokens must be >= 1, got {prefix_tokens}")
        self.path = Path(path)
        self.prefix_tokens = prefix_tokens
        self._lock = threading.Lock()
        try:
            self._file: TextIO | None = open(self.path, "a", encoding="utf-8", buffering=1)
        except OSError as exc:
            raise ValueError(f"--request-log: cannot open {self.path} for appending: "
                             f"{exc.strerror}") from None

    def record(self, *, arrival_monotonic: float, prompt_token_ids: list[int],
               output_tokens: int, finish_reason: str) -> None:
        """One request; `arrival_monotonic` is its time.monotonic() arrival time."""
        ts = time.time() - (time.monotonic() - arrival_monotonic)
        line = json.dumps({
            "ts": round(ts, 4), "prompt_tokens": len(prompt_token_ids),
            "output_tokens": int(output_tokens), "finish_reason": finish_reason,
            "prefix_tokens": self.prefix_tokens,
            "prefix_hashes": prefix_hashes(prompt_token_ids, self.prefix_tokens)})
        with self._lock:
            if self._file is not None:
                self._file.write(line + "\n")

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None
