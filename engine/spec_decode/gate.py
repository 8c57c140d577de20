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

- `adaptive_draft_knee`: the draft length adapts per step. A step computing T tokens is
  taken to cost 1 + T / knee (the knee: tokens per step at which a step costs twice a
  one-token step, where decoding stops being bound by reading the weights). Each sequence
  keeps a per-position acceptance estimate alpha (accepted drafts over drafts verified up to
  and including the first rejection, decayed by `ALPHA_DECAY` per draft step, from the
  prior `ALPHA_PRIOR`), so k drafts yield 1 + alpha + ... + alpha^k tokens in expectation,
  and drafts the k <= the proposer's limit that maximises those tokens per unit of cost
  with `batch_size` rows each verifying k: shorter as alpha drops or the batch grows, 0
  when drafting costs more than it saves. A sequence at 0 probes with one draft after
  `acceptance_probe_interval` steps, so its estimate can recover. Suffix drafts, which
  carry the evidence behind each token, are cut instead by `cut()`: the same figure with
  each token's own probability, calibrated on earlier drafts of the same kind
  (engine/spec_decode/calibration.py), in place of alpha^k.

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

from engine.spec_decode.calibration import DraftCalibration, Key

EMA_WEIGHT = 0.25  # weight of the latest draft step in the acceptance average
ALPHA_PRIOR = (1.6, 2.0)  # (accepted, verified) pseudo-counts: alpha starts at 0.8 (they
#                             decay like observed counts, so the evidence takes over)
ALPHA_DECAY = 0.8  # weight of the past in the per-position counts, per draft step


def best_length(alpha: float, batch_size: int, knee: float, limit: int) -> int:
    """The k in 0..limit maximising (1 + alpha + ... + alpha^k) / (1 + batch_size (1 + k)
    / knee): expected tokens per unit of step cost (the smallest k among equals)."""
    return best_cut([alpha ** k for k in range(1, limit + 1)], batch_size, knee)


def best_cut(cumulative: list[float], batch_size: int, knee: float) -> int:
    """The k in 0..len(cumulative) maximising (1 + cumulative[0] + ... + cumulative[k-1])
    / (1 + batch_size (1 + k) / knee), cumulative[i] the probability that the first i + 1
    drafts are all accepted (the smallest k among equals)."""
    best, best_rate = 0, 1.0 / (1.0 + batch_size / knee)
    tokens = 1.0
    for k, p in enumerate(cumulative, 1):
        tokens += p
        rate = tokens / (1.0 + batch_size * (1 + k) / knee)
        if rate > best_rate * (1 + 1e-9):
            best, best_rate = k, rate
    return best


@dataclass
class _State:
    ema: float = 1.0
    since_draft: int = 0  # decode steps without drafts while below the rate
    drafts: list[int] = field(default_factory=list)  # the last drafts handed out
    length: int = 0  # the sequence's length when they were
    accepted: float = ALPHA_PRIOR[0]  # decayed per-position counts (adaptive_draft_knee),
    verified: float = ALPHA_PRIOR[1]  # the prior's pseudo-counts decaying with them
    since_long: int = 0  # decode steps at length 0 (adaptive_draft_knee)
    keys: list = field(default_factory=list)  # the calibration keys of the drafts (cut())

    @property
    def alpha(self) -> float:
        return self.accepted / self.verified


class DraftGate:
    def __init__(self, *, min_acceptance_rate: float | None = None,
                 acceptance_probe_interval: int = 16,
                 disable_by_batch_size: int | None = None,
                 adaptive_draft_knee: int | None = None) -> None:
        if min_acceptance_rate is not None and not 0 <= min_acceptance_rate <= 1:
            raise ValueError(f"min_acceptance_rate must be in 0..1, got {min_acceptance_rate}")
        if acceptance_probe_interval < 1:
            raise ValueError("acceptance_probe_interval must be >= 1, got "
                             f"{acceptance_probe_interval}")
        if disable_by_batch_size is not None and disable_by_batch_size < 1:
            raise ValueError(f"disable_by_batch_size must be >= 1, got {disable_by_batch_size}")
        if adaptive_draft_knee is not None and adaptive_draft_knee < 1:
            raise ValueError(f"adaptive_draft_knee must be >= 1, got {adaptive_draft_knee}")
        self.knee = adaptive_draft_knee
        # per-token acceptance by kind of evidence (drafts that come with keys: cut())
        self.calibration = DraftCalibration() if adaptive_draft_knee is not None else None
        self.min_rate = min_acceptance_rate
        self.probe_interval = acceptance_probe_interval
        self.max_batch = disable_by_batch_size
        # per sequence (keyed by the Sequence object: the state goes with it)
        self._states: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    @classmethod
    def from_config(cls, config: dict) -> "DraftGate":
        """From a checked speculative_config (its off-switch keys appear only when set)."""
        return cls(min_acceptance_rate=config.get("min_acceptance_rate"),
                   acceptance_probe_interval=config.get("acceptance_probe_interval") or 16,
                   disable_by_batch_size=config.get("disable_by_batch_size"),
                   adaptive_draft_knee=config.get("adaptive_draft_knee"))

    @property
    def active(self) -> bool:
        return self.min_rate is not None or self.max_batch is not None or self.knee is not None

    @property
    def _tracking(self) -> bool:  # whether drafts and their acceptance are followed
        return self.min_rate is not None or self.knee is not None

    def acceptance(self, seq) -> float | None:
        """The sequence's acceptance average (None before its first counted draft step)."""
        state = self._states.get(seq)
        return state.ema if state is not None else None

    def allows(self, seq, batch_size: int) -> bool:
        """Whether `seq` may draft in this step (counts the step when it may not)."""
        state = self._observe(seq) if self._tracking else None
        if self.max_batch is not None and batch_size >= self.max_batch:
            return False
        if self.min_rate is None or state.ema >= self.min_rate:
            return True
        state.since_draft += 1
        if state.since_draft > self.probe_interval:
            state.since_draft = 0
            return True
        return False

    def length(self, seq, batch_size: int, limit: int) -> int:
        """How many drafts `seq` may take in this step (<= limit), after allows(): `limit`
        unless adaptive_draft_knee is set (then best_length, or 1 as a probe)."""
        if self.knee is None or limit <= 0:
            return limit
        state = self._states[seq]   # allows() tracks every sequence while the knee is set
        return self._or_probe(state, best_length(state.alpha, batch_size, self.knee, limit))

    def cut(self, seq, batch_size: int, keys: list[Key]) -> int:
        """With adaptive_draft_knee: how many of a draft's tokens, keyed by
        calibration.draft_keys, `seq` verifies in this step (after allows()): the k that
        maximises expected tokens per unit of cost with each token's calibrated
        probability (best_cut), or 1 as a probe. Without the knee: all of them."""
        if self.knee is None or not keys:
            return len(keys)
        state = self._states[seq]
        cumulative = self.calibration.cumulative(keys)
        return self._or_probe(state, best_cut(cumulative, batch_size, self.knee))

    def _or_probe(self, state: _State, k: int) -> int:
        if k > 0:
            state.since_long = 0
            return k
        state.since_long += 1
        if state.since_long > self.probe_interval:
            state.since_long = 0
            return 1
        return 0

    def handed_out(self, seq, drafts: list[int], keys: list[Key] | None = None) -> None:
        """Record the drafts given to `seq` (checked against its tokens at the next step),
        with their calibration keys when cut() chose them."""
        if not self._tracking:
            return
        state = self._states[seq]   # allows() made it
        state.drafts, state.length = list(drafts), len(seq.token_ids)
        state.keys = list(keys[:len(drafts)]) if keys and self.calibration is not None else []

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
            state.accepted = ALPHA_DECAY * state.accepted + a
            state.verified = ALPHA_DECAY * state.verified + a + (a < len(state.drafts))
            if state.keys:
                self.calibration.observe(state.keys, a)
        if new:  # the drafts are settled once the sequence moved on
            state.drafts.clear()
        return state
