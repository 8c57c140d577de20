"""When a sequence drafts at all: speculation's off-switches (torch-free; the proposer asks).

Two keys of --speculative-config, both off by default (drafting then behaves as vLLM's
`ngram`):

- `disable_by_batch_size` (vLLM's key): no sequence drafts in a step while this many
  sequences or more are running. Every draft is computed whether accepted or not, and the
  larger the batch, the less a step's cost depends on the weights it reads once, so the
  gain shrinks (and turns into a loss) as batches grow.
- `min_acceptance_rate`: each sequence keeps an exponential moving average of the share of
  its drafts the target accepted (weight `EMA_WEIGHT` per draft step, starting at 1). Once
  it falls below the rate, the sequence stops drafting; after `acceptance_probe_interval`
  decode steps without drafts it drafts once more (a probe), whose result moves the
  average like any other, so a sequence whose text starts copying again resumes.

Outputs never change: the drafts only decide how many tokens a step verifies.

The acceptance is read from the sequence's own tokens, not reported by the engine: the
drafts a step verified are followed by the accepted ones and then one token that differs
from the next draft (or follows the last), so the next call sees `a + 1` new tokens of
which the first `a` equal the drafts. When the scheduler dropped the drafts for lack of
blocks, the step's one token counts as a rejection if it differs from the first draft (the
drafts were wrong) and not at all if it equals it.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field

EMA_WEIGHT = 0.25  # weight of the latest draft step in the acceptance average


@dataclass
class _State:
    ema: float = 1.0
    since_draft: int = 0  # decode steps without drafts while below the rate
    drafts: list[int] = field(default_factory=list)  # the last drafts handed out
    length: int = 0  # the sequence's length when they were


class DraftGate:
    def __init__(self, *, min_acceptance_rate: float | None = None,
                 acceptance_probe_interval: int = 16,
                 disable_by_batch_size: int | None = None) -> None:
        if min_acceptance_rate is not None and not 0 <= min_acceptance_rate <= 1:
            raise ValueError(f"min_acceptance_rate must be in 0..1, got {min_acceptance_rate}")
        if acceptance_probe_interval < 1:
            raise ValueError("acceptance_probe_interval must be >= 1, got "
                             f"{acceptance_probe_interval}")
        if disable_by_batch_size is not None and disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {disable_by_batch_size}")
        self.min_rate = min_acceptance_rate
        self.probe_interval = acceptance_probe_interval
        self.max_batch = disable_by_batch_size
        # per sequence (keyed by the Sequence object: the state goes with it)
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @property
    def active(self) -> bool:
        return self.min_rate is not None or self.max_batch is not None

    def acceptance(self, seq) -> float | None:
        """The sequence's acceptance average (None before its first counted draft step)."""
        state = self._states.get(seq)
        return state.ema if state is not None else None

    def allows(self, seq, batch_size: int) -> bool:
        """Whether `seq` may draft in this step (counts the step when it may not)."""
        state = self._observe(seq) if self.min_rate is not None else None
        if self.max_batch is not None and batch_size >= self.max_batch:
            return False
        if state is None or state.ema >= self.min_rate:
            return True
        state.since_draft += 1
        if state.since_draft > self.probe_interval:
            state.since_draft = 0
            return True
        return False

    def handed_out(self, seq, drafts: list[int]) -> None:
        """Record the drafts given to `seq` (checked against its tokens at the next step)."""
        if self.min_rate is None:
            return
        state = self._states.setdefault(seq, _State())
        state.drafts, state.length = list(drafts), len(seq.token_ids)

    def _observe(self, seq) -> _State:
        state = self._states.setdefault(seq, _State())
        if not state.drafts:
            return state
        new = seq.token_ids[state.length:]
        a = 0
        while a < len(new) and a < len(state.drafts) and new[a] == state.drafts[a]:
            a += 1
        # verified: a accepted, then one more token (a correction, or the bonus after all)
        if len(new) == a + 1:
            state.ema += EMA_WEIGHT * (a / len(state.drafts) - state.ema)
        if new:  # the drafts are settled once the sequence moved on
            state.drafts = []
        return state
