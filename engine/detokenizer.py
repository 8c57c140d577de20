"""Incremental detokenization and stop-string matching for one output stream.

Decoding a window of recent tokens (rather than the whole output each step) keeps the cost
per token constant; text is released only once it no longer ends in an incomplete UTF-8
sequence, so multi-byte characters are never split across stream chunks.
"""
from __future__ import annotations

_WINDOW = 6  # tokens of left context; byte-level BPE merges never span more


class IncrementalDetokenizer:
    def __init__(self, tokenizer, *, skip_special_tokens: bool = True,
                 stop: list[str] | None = None, include_stop_str_in_output: bool = False) -> None:
        self.tokenizer = tokenizer
        self.skip_special_tokens = skip_special_tokens
        self.stop = stop or []
        self.include_stop = include_stop_str_in_output
        self.token_ids: list[int] = []
        self.text = ""
        self._prefix_offset = 0  # window start
        self._read_offset = 0  # tokens already turned into text

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=self.skip_special_tokens,
                                     clean_up_tokenization_spaces=False)

    def add(self, token_id: int) -> str | None:
        """Append a token; returns the stop string if one now appears in the text."""
        self.token_ids.append(token_id)
        prefix = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
        full = self._decode(self.token_ids[self._prefix_offset:])
        if full.endswith("\ufffd") or len(full) < len(prefix):
            return None  # an incomplete character: wait for the next token
        new_text = full[len(prefix):]
        self._read_offset = len(self.token_ids)
        self._prefix_offset = max(0, self._read_offset - _WINDOW)
        checked_from = max(0, len(self.text) - max((len(s) for s in self.stop), default=0) + 1)
        self.text += new_text
        for s in self.stop:
            at = self.text.find(s, checked_from)
            if at != -1:
                self.text = self.text[:at + len(s)] if self.include_stop else self.text[:at]
                return s
        return None

    def flush(self) -> None:
        """At the end of the stream: release any text held back for an incomplete character."""
        if self._read_offset < len(self.token_ids):
            prefix = self._decode(self.token_ids[self._prefix_offset:self._read_offset])
            full = self._decode(self.token_ids[self._prefix_offset:])
            self.text += full[len(prefix):]
            self._read_offset = len(self.token_ids)
