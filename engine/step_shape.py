"""What one engine step computes, in the terms step time depends on (no torch here).

The tuner's performance profile (tuner/sim/profile.py) fits step time as a function of
these figures, from steps the engine timed itself, and its simulator predicts a step's
time from the same figures of a batch the engine's own scheduler formed.

- a *prefill* row computes new tokens of a prompt (a chunk, or a whole prompt); its
  attention reads the chunk against everything before it, so its cost grows with
  chunk length x context;
- a *decode* row computes one token (plus any speculative drafts it verifies) against
  its whole context; a row that verifies drafts costs more than its query rows (the
  verifier's per-row work: on the embedded model about 0.3 ms per row besides 0.1 ms per
  draft, benchmarks/bench_verify_cost.py, 2026-12-06), so such rows are counted too,
  and so are the rows a proposer looked up drafts for and found none (an n-gram lookup:
  0.10-0.23 ms per row at 200-2,000 tokens of context).
- a step's *served rows* (prefill rows and decode rows: what it delivers to streams) are
  also counted squared, so summed over steps the counters hold their mean square: a
  server's cost per delivered row grows with the rows a step delivers
  (tuner/sim/live_profile.serving_term), and a window's mean rows squared under-states
  the mean of its steps' squares wherever the batch size varies.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from engine.scheduler import ScheduledBatch


@dataclass(frozen=True)
class StepShape:
    prefill_tokens: int = 0    # new prompt tokens over the prefill rows
    prefill_attention: int = 0  # sum over prefill rows of chunk x (context after the chunk)
    prefill_seqs: int = 0
    decode_seqs: int = 0
    decode_context: int = 0    # sum over decode rows of their context (tokens attended)
    draft_tokens: int = 0      # speculative tokens verified beyond one per decode row
    blocks_read: int = 0       # KV blocks every row's attention walks (its block table)
    draft_seqs: int = 0        # decode rows that verify at least one draft
    lookup_seqs: int = 0       # decode rows the proposer was asked for drafts, offering none
    served_rows_squared: int = 0   # (prefill_seqs + decode_seqs) ** 2

    @property
    def num_tokens(self) -> int:
        return self.prefill_tokens + self.decode_seqs + self.draft_tokens

    @classmethod
    def of(cls, batch: ScheduledBatch) -> StepShape:
        """The shape of a scheduled batch, before the step runs (num_computed_tokens is
        each row's context so far)."""
        pt = pa = ps = ds = dc = dr = blocks = dq = 0
        drafts = batch.draft_token_ids or [[]] * len(batch.seqs)
        for seq, n, d in zip(batch.seqs, batch.num_new_tokens, drafts):
            end = seq.num_computed_tokens + n
            blocks += len(seq.block_table)
            if n - len(d) > 1 or seq.num_computed_tokens < seq.num_prompt_tokens:
                pt, pa, ps = pt + n, pa + n * end, ps + 1
            else:
                ds, dc, dr, dq = ds + 1, dc + end, dr + len(d), dq + bool(d)
        return cls(pt, pa, ps, ds, dc, dr, blocks, dq, batch.lookups, (ps + ds) ** 2)

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


FIGURES = tuple(f.name for f in fields(StepShape))  # what the step counters sum
