"""Continuous batching: who runs this step, with how many tokens (no torch here).

Every step: running sequences first (decodes and unfinished prefill chunks), then
waiting ones, within `max_num_seqs` sequences and `max_num_batched_tokens` tokens. A long
prompt is split across steps (chunked prefill) and mixed with decodes. When blocks run
out, the lowest-priority running sequence is preempted by recompute: its blocks are
freed and it goes back to the waiting queue in its original order; on readmission its
prefix-cached blocks make the recompute cheap.

With KV tiers (engine/kv_offload/), a waiting sequence whose prefix run reaches the tiers
below the pool is admitted into its blocks and waits for their loads (`loading`) while
other sequences' steps run; a later step that finds its loads done (polled at the start,
never waited for while there is other work) runs it as a prefill of the rest. If the load
queue is full, the sequence is admitted with its device hits only and recomputes the rest.

With speculative decoding, a running decode also carries the proposer's drafts: its row
computes 1 + len(drafts) tokens (they count against the token budget and need their KV
slots, and never take the budget or the blocks another running sequence needs).
"""
from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any

from engine.kv_cache_manager import KVCacheManager
from engine.sequence import Sequence, SequenceStatus
from engine.spec_decode.proposer import Proposer


@dataclass
class ScheduledBatch:
    seqs: list[Sequence] = field(default_factory=list)
    num_new_tokens: list[int] = field(default_factory=list)
    blocks_to_copy: list[tuple[int, int]] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    # per sequence, the draft tokens its row verifies after its last token ([]: none);
    # they are included in num_new_tokens
    draft_token_ids: list[list[int]] = field(default_factory=list)
    # decode rows the proposer was asked for drafts and offered none (its lookup ran:
    # a cost of its own, engine/step_shape.py)
    lookups: int = 0
    # KV tiers (engine/kv_offload/): (block, hash) the pool evicted, to copy below it before
    # this step writes them, and (tier hit, block) of the loads admitted in this step,
    # started after that copy (they finish in a later step; no sequence of this batch)
    blocks_to_store: list[tuple[int, bytes]] = field(default_factory=list)
    blocks_to_load: list[tuple[Any, int]] = field(default_factory=list)

    @property
    def num_tokens(self) -> int:
        return sum(self.num_new_tokens)

    def __len__(self) -> int:
        return len(self.seqs)


class Scheduler:
    def __init__(self, kv: KVCacheManager, *, max_num_seqs: int, max_num_batched_tokens: int,
                 policy: str = "fcfs", proposer: Proposer | None = None,
                 max_model_len: int | None = None) -> None:
        self.kv = kv
        self.proposer = proposer
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.waiting: list[Sequence] = []  # sorted by sort_key
        self.running: list[Sequence] = []  # in admission order
        self.loading: list[Sequence] = []  # admitted, waiting for their loads
        self._loads: dict[int, Any] = {}  # seq_id -> its LoadJob (engine/kv_offload/loads.py)
        self.num_preemptions = 0

    def _key(self, seq: Sequence) -> tuple[int, int, int]:
        return seq.sort_key(self.policy)

    def add(self, seq: Sequence) -> None:
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=self._key)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running or self.loading)

    def live_sequences(self) -> list[Sequence]:
        return self.running + self.waiting + self.loading

    def finish(self, seq: Sequence, reason: str) -> None:
        """Retire a sequence (stopped, length or abort) and release its blocks."""
        if seq.seq_id in self._loads:
            self._drop_load(seq)
        elif seq.status is SequenceStatus.RUNNING:
            self.running.remove(seq)
        elif seq.status is SequenceStatus.WAITING:
            self.waiting.remove(seq)
        self.kv.free(seq)
        seq.status = SequenceStatus.FINISHED
        seq.finish_reason = reason
        if self.proposer is not None:
            self.proposer.finished(seq)

    def advance(self, seq: Sequence, num_new_tokens: int) -> None:
        """The step computed `num_new_tokens` of seq: count them, offer its full blocks to
        the prefix cache."""
        seq.num_computed_tokens += num_new_tokens
        self.kv.cache_full_blocks(seq, num_new_tokens)

    def rollback(self, seq: Sequence) -> None:
        """After a speculative step's commit: free the blocks only rejected drafts used."""
        self.kv.trim(seq)

    def _drafts(self, seq: Sequence, budget: int, batch: ScheduledBatch) -> list[int]:
        """Drafts for a running decode (one uncomputed token after >= 1 output token), within
        `budget` extra tokens and never past max_tokens or max_model_len (the step also
        samples one token after the accepted drafts); a proposer asked and offering none
        counts in batch.lookups."""
        if self.proposer is None or seq.num_output_tokens == 0 or (
                seq.num_tokens - seq.num_computed_tokens != 1):
            return []
        # a grammar's mask follows its matcher's state, which only the sampled tokens advance
        if getattr(seq.params, "structured_outputs", None) is not None:
            return []
        room = budget
        if seq.params.max_tokens is not None:
            room = min(room, seq.params.max_tokens - seq.num_output_tokens - 1)
        if self.max_model_len is not None:
            room = min(room, self.max_model_len - seq.num_tokens - 1)
        if room <= 0:
            return []
        drafts = self.proposer.draft(seq, room, len(self.running))
        batch.lookups += not drafts
        return drafts

    def fork(self, parent: Sequence, child: Sequence) -> None:
        """At the end of its prompt a request's sample 0 (`parent`) forks into a running
        sibling sharing its blocks (after `advance` for the step that ended the prompt)."""
        parent.has_forked = True
        child.has_forked = True
        child.num_computed_tokens = parent.num_computed_tokens
        child.status = SequenceStatus.RUNNING
        self.kv.fork(parent, child)
        self.running.append(child)

    def _preempt(self, seq: Sequence) -> None:
        if seq.seq_id in self._loads:
            self._drop_load(seq)
        else:
            self.running.remove(seq)
        self.kv.free(seq)
        seq.num_computed_tokens = 0
        self.num_preemptions += 1
        self.add(seq)

    @staticmethod
    def _seats(seq: Sequence) -> int:
        """A request's n samples fork off after its prefill: their seats are reserved."""
        return 1 if seq.has_forked else seq.params.n

    # ---- loads from the KV tiers ------------------------------------------------------------
    def _drop_load(self, seq: Sequence) -> None:
        """seq leaves while loading: its job is cancelled (the caller frees seq's blocks)."""
        self.loading.remove(seq)
        self.kv.offload.cancel_load(self._loads.pop(seq.seq_id))

    def _poll_loads(self) -> None:
        """Sequences whose loads are done run from now on, from their first block not
        loaded (all loaded: the prompt's last token; a load failed: that block)."""
        for job in self.kv.offload.poll():
            seq = job.seq
            del self._loads[seq.seq_id]
            self.loading.remove(seq)
            kept = job.kept_blocks()
            self.kv.keep_prefix(seq, kept, {p: hit.medium for p, (hit, _) in
                                            zip(job.positions, job.loads)})
            seq.num_computed_tokens = kept * self.kv.block_size
            if not seq.has_forked and seq.num_output_tokens == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)

    def _admit_loading(self, seq: Sequence, hits: list, num_new: int) -> None:
        loads, positions = self.kv.admit_loading(seq, hits, num_new)
        self._loads[seq.seq_id] = self.kv.offload.plan_load(seq, loads, positions)
        self.loading.append(seq)

    def schedule(self) -> ScheduledBatch:
        if self.kv.offload is None:
            return self._schedule()
        self._poll_loads()
        batch = self._schedule()
        if not batch.seqs and not batch.blocks_to_load and self._loads:
            # nothing to run but loads in flight: wait for one instead of spinning
            if self.kv.offload.wait_for_load(timeout=0.1):
                self._poll_loads()
                more = self._schedule()
                more.blocks_to_store[:0] = batch.blocks_to_store
                more.preempted[:0] = batch.preempted
                batch = more
        return batch

    def _schedule(self) -> ScheduledBatch:
        batch = ScheduledBatch()
        budget = self.max_num_batched_tokens
        scheduled: set[int] = set()

        # 1. Running sequences, in admission order; preempt from the lowest priority.
        i = 0
        while i < len(self.running) and budget > 0:
            seq = self.running[i]
            num_new = min(seq.num_tokens - seq.num_computed_tokens, budget)
            # drafts leave one token of budget to each running sequence after this one
            drafts = self._drafts(seq, budget - num_new - (len(self.running) - i - 1), batch)
            if drafts and not self.kv.can_append(seq, num_new + len(drafts)):
                drafts = []  # speculation never preempts
            num_new += len(drafts)
            while not self.kv.can_append(seq, num_new):
                candidates = [s for s in self.running if s.seq_id not in scheduled]
                candidates += self.loading
                victim = max(candidates, key=self._key)
                self._preempt(victim)
                batch.preempted.append(victim)
                if victim is seq:
                    break
            else:
                self.kv.append(seq, num_new, batch.blocks_to_copy)
                batch.seqs.append(seq)
                batch.num_new_tokens.append(num_new)
                batch.draft_token_ids.append(drafts)
                scheduled.add(seq.seq_id)
                budget -= num_new
                i += 1

        # 2. Waiting sequences, unless this step already had to preempt.
        seats_taken = sum(self._seats(s) for s in self.running + self.loading)
        while not batch.preempted and self.waiting and budget > 0:
            seq = self.waiting[0]
            if seats_taken + self._seats(seq) > self.max_num_seqs:
                break
            hits = self.kv.lookup_prefix(seq)
            first_tier = next((i for i, h in enumerate(hits) if type(h) is not int), None)
            if first_tier is not None and not self.kv.offload.can_plan_load():
                hits = hits[:first_tier]  # the load queue is full: recompute instead
                first_tier = None
            num_new = min(seq.num_tokens - len(hits) * self.kv.block_size, budget)
            if not self.kv.can_admit(seq, hits, num_new):
                break
            self.waiting.pop(0)
            seats_taken += self._seats(seq)
            if first_tier is not None:
                self._admit_loading(seq, hits, num_new)
                continue
            seq.num_computed_tokens = self.kv.admit(seq, hits, num_new)
            if not seq.has_forked and seq.num_output_tokens == 0:
                seq.num_cached_tokens = seq.num_computed_tokens
            seq.status = SequenceStatus.RUNNING
            self.running.append(seq)
            batch.seqs.append(seq)
            batch.num_new_tokens.append(num_new)
            batch.draft_token_ids.append([])
            budget -= num_new
        if self.kv.offload is not None:
            batch.blocks_to_store = self.kv.offload.take_stores()
            batch.blocks_to_load = self.kv.offload.planned_loads()
        return batch
