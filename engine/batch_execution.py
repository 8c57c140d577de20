"""One step's model run and sampling, without committing anything: the step loop
(engine/llm_engine.py) commits the result, or retries the step request by request when it
raises (so nothing here may change a sequence)."""
from __future__ import annotations

from typing import TYPE_CHECKING

from engine.scheduler import ScheduledBatch
from engine.sequence import Sequence
if TYPE_CHECKING:
    from engine.model_runner import ModelRunner
    from engine.sampler import Sampler


def execute_batch(runner: ModelRunner, sampler: Sampler, batch: ScheduledBatch
                  ) -> tuple[list[tuple[Sequence, Sequence | None, tuple]], dict[int, list], dict]:
    """Model and sampler, without committing anything: (sample seq, its parent if it is a
    new fork, (token, logprob, top logprobs)) for each sampled sequence, the prompt
    logprobs of this step's chunks by seq_id, and the verified drafts by seq_id."""
    from engine.spec_decode.verifier import verify

    prompt_logits: dict = {}
    if any(s.wants_prompt_logits for s in batch.seqs):
        logits, rows = runner.execute(batch, prompt_logits)
    else:
        logits, rows = runner.execute(batch)
    # seq_id -> logprob entries of the prompt tokens this chunk's positions predict
    prompt_lps = {}
    for i, lg in prompt_logits.items():
        seq = batch.seqs[i]
        c = seq.num_computed_tokens
        prompt_lps[seq.seq_id] = sampler.prompt_logprobs(
            lg, seq.token_ids[c + 1:c + 1 + lg.shape[0]], seq.params.prompt_logprobs)
    sample_seqs: list[Sequence] = []
    parents: list[Sequence | None] = []
    sample_rows: list[int] = []
    drafts = batch.draft_token_ids or [[]] * len(batch.seqs)
    spec_seqs, spec_drafts, spec_rows = [], [], []
    row = 0
    while row < len(rows):  # a row with d drafts has 1 + d logits rows
        i = rows[row]
        seq = batch.seqs[i]
        if drafts[i]:
            spec_seqs.append(seq)
            spec_drafts.append(drafts[i])
            spec_rows += range(row, row + 1 + len(drafts[i]))
            row += 1 + len(drafts[i])
            continue
        sample_seqs.append(seq)
        parents.append(None)
        sample_rows.append(row)
        if seq.params.n > 1 and not seq.has_forked:  # the prompt ended: fork n samples
            for index in range(1, seq.params.n):
                sample_seqs.append(seq.fork(index))
                parents.append(seq)
                sample_rows.append(row)
        row += 1
    verified = {}
    if spec_seqs:
        results = verify(sampler, logits[spec_rows], spec_seqs, spec_drafts)
        verified = {s.seq_id: v for s, v in zip(spec_seqs, results)}
    if not sample_seqs:
        return [], prompt_lps, verified
    if sample_rows != list(range(logits.shape[0])):  # not every row once, in order
        logits = logits[sample_rows]
    r = sampler(logits, sample_seqs)
    return [(s, parent, token) for s, parent, token in zip(
        sample_seqs, parents, zip(r.token_ids, r.logprobs, r.top_logprobs))], prompt_lps, \
        verified
