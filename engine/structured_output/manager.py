"""Grammars compiled once, one matcher per sequence, masks for the constrained rows only.

Compiling happens on the caller's thread (the server's worker pool, off the event loop;
offline, `add_request`) and is cached by the request's constraint, so the engine thread
finds it compiled. The engine thread alone touches the matchers: `apply_masks` fills the
bitmask of each constrained row before sampling, `accept` advances a sequence's matcher
with the token the step committed (a step that is redone has not advanced it).
"""
from __future__ import annotations

import copy
import json
import re
import threading
from collections import OrderedDict
from typing import TYPE_CHECKING, Any

from engine.structured_output.params import StructuredOutputsParams

if TYPE_CHECKING:
    import torch

    from engine.sequence import Sequence

_XGR_LOCATION = re.compile(r"^\[[^\]]*\]\s*\S+:\d+:\s*")  # "[12:00:00] /x/y.cc:42: "
# xgrammar's rule for a length-bounded JSON string character lets raw control characters
# through (its unbounded string rule does not); JSON forbids them unescaped.
_LOOSE_STRING_CHAR = r'[^\"\\\r\n]'
_JSON_STRING_CHAR = r'[^\0-\x1f\"\\\r\n]'


def _message(exc: BaseException) -> str:
    lines = [_XGR_LOCATION.sub("", line).strip() for line in str(exc).splitlines()]
    return next((line for line in lines if line), type(exc).__name__)[:300]


def _json_schema_ebnf(schema: Any) -> str:
    """The schema as xgrammar's EBNF (compact JSON, strict), control characters barred."""
    import xgrammar as xgr

    ebnf = str(xgr.Grammar.from_json_schema(schema, any_whitespace=False, strict_mode=True))
    return ebnf.replace(_LOOSE_STRING_CHAR, _JSON_STRING_CHAR)


class StructuredOutputManager:
    def __init__(self, tokenizer: Any, *, vocab_size: int, eos_token_ids: frozenset[int],
                 max_cached_grammars: int = 256) -> None:
        self.tokenizer = tokenizer
        self.vocab_size = vocab_size
        self.eos_token_ids = eos_token_ids
        self.max_cached_grammars = max_cached_grammars
        self._lock = threading.Lock()
        self._compiler: Any = None
        self._grammars: OrderedDict[tuple[str, str], Any] = OrderedDict()
        self._matchers: dict[int, Any] = {}  # seq_id -> GrammarMatcher (engine thread)
        self._unconfirmed: set[int] = set()  # masked this step, token not yet accepted
        self.num_compiled = 0  # compilations done (cache misses)

    # --- compiling (any thread) --------------------------------------------------------

    def _compiler_locked(self) -> Any:
        if self._compiler is None:
            import xgrammar as xgr

            # a copy: the first compile may run on a server worker thread while the engine
            # thread detokenizes with the original (fast tokenizers are not thread-safe)
            info = xgr.TokenizerInfo.from_huggingface(
                copy.deepcopy(self.tokenizer), vocab_size=self.vocab_size,
                stop_token_ids=sorted(self.eos_token_ids))
            self._compiler = xgr.GrammarCompiler(info, max_threads=1, cache_enabled=False)
        return self._compiler

    def compile(self, params: StructuredOutputsParams) -> Any:
        """The compiled grammar for `params` (cached); ValueError naming the field if the
        schema, regex or grammar is invalid."""
        key = params.key()
        with self._lock:
            grammar = self._grammars.get(key)
            if grammar is not None:
                self._grammars.move_to_end(key)
                return grammar
            compiler = self._compiler_locked()
        kind = params.kind
        try:
            if kind in ("json", "json_object"):
                schema = params.json if kind == "json" else {"type": "object"}
                if isinstance(schema, str):
                    schema = json.loads(schema)
                grammar = compiler.compile_grammar(_json_schema_ebnf(schema))
            elif kind == "regex":
                grammar = compiler.compile_regex(params.regex)
            elif kind == "choice":
                # each choice as a JSON string literal: EBNF's quoting and escapes
                grammar = compiler.compile_grammar(
                    "root ::= " + " | ".join(json.dumps(c) for c in params.choice or ()))
            else:
                grammar = compiler.compile_grammar(params.grammar)
        except (RuntimeError, ValueError, TypeError) as exc:
            raise ValueError(f"structured_outputs.{kind} is invalid: {_message(exc)}") from None
        with self._lock:
            self.num_compiled += 1
            self._grammars[key] = grammar
            while len(self._grammars) > self.max_cached_grammars:
                self._grammars.popitem(last=False)
        return grammar

    # --- matching (engine thread) ------------------------------------------------------

    def _matcher(self, seq: Sequence) -> Any:
        matcher = self._matchers.get(seq.seq_id)
        if matcher is None:
            import xgrammar as xgr

            matcher = xgr.GrammarMatcher(self.compile(seq.params.structured_outputs))
            for token in seq.output_token_ids:  # a sequence that already has output
                matcher.accept_token(token)
            self._matchers[seq.seq_id] = matcher
        return matcher

    def apply_masks(self, logits: torch.Tensor, seqs: list[Sequence]) -> None:
        """Set to -inf, in place, every token the grammar forbids next, in the rows of
        constrained sequences (logits: [len(seqs), vocab]); other rows are untouched."""
        # Matchers masked for a step that never committed (it raised and is redone, or its
        # new forks were dropped) go: `_matcher` rebuilds one by replaying the output.
        for seq_id in self._unconfirmed:
            self._matchers.pop(seq_id, None)
        self._unconfirmed.clear()
        rows = [i for i, s in enumerate(seqs) if s.params.structured_outputs is not None]
        if not rows:
            return
        import xgrammar as xgr

        bitmask = xgr.allocate_token_bitmask(len(seqs), self.vocab_size)  # all allowed
        masked = []
        for i in rows:
            matcher = self._matcher(seqs[i])
            self._unconfirmed.add(seqs[i].seq_id)
            if not matcher.is_terminated():  # done: only its stop token was left
                matcher.fill_next_token_bitmask(bitmask, i)
                masked.append(i)
        if masked:
            xgr.apply_token_bitmask_inplace(logits, bitmask.to(logits.device), indices=masked,
                                            vocab_size=self.vocab_size)

    def accept(self, seq: Sequence, token: int) -> None:
        if seq.params.structured_outputs is None:
            return
        matcher = self._matcher(seq)
        self._unconfirmed.discard(seq.seq_id)
        if not matcher.is_terminated() and not matcher.accept_token(token):
            raise RuntimeError(f"token {token} does not fit the request's grammar")

    def forget(self, seq: Sequence) -> None:
        self._matchers.pop(seq.seq_id, None)
        self._unconfirmed.discard(seq.seq_id)

    @property
    def num_matchers(self) -> int:
        return len(self._matchers)
