"""Property-based tests: random allocate/append/fork/free/preempt/abort sequences keep the
block pool and scheduler invariants (no model, no torch: the policy layer alone)."""
from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus


class EngineModel(RuleBasedStateMachine):
    """The engine's step loop with a fake model: tokens are random, KV is bookkeeping."""

    @initialize(block_size=st.sampled_from([1, 2, 4, 16]), num_blocks=st.integers(6, 40),
                prefix=st.booleans(), max_num_seqs=st.integers(1, 8),
                budget=st.integers(1, 64), policy=st.sampled_from(["fcfs", "priority"]))
    def setup(self, block_size, num_blocks, prefix, max_num_seqs, budget, policy):
        self.kv = KVCacheManager(num_blocks, block_size, prefix)
        self.sched = Scheduler(self.kv, max_num_seqs=max_num_seqs,
                               max_num_batched_tokens=budget, policy=policy)
        # one sequence (plus a copy-on-write block) always fits: no deadlock by construction
        self.max_len = (num_blocks - 1) * block_size
        self.rng = random.Random(0)
        self.requests: dict[str, list[Sequence]] = {}
        self.max_out: dict[str, int] = {}
        self.arrivals = 0

    def _live(self) -> list[Sequence]:
        return self.sched.live_sequences()

    @rule(length=st.integers(1, 48), n=st.integers(1, 3), max_out=st.integers(1, 12),
          priority=st.integers(0, 3), alphabet=st.integers(1, 4))
    def add_request(self, length, n, max_out, priority, alphabet):
        if self.max_len < 2 or n > self.sched.max_num_seqs:
            return
        length = min(length, self.max_len - 1)
        rid = f"r{self.arrivals}"
        tokens = [self.rng.randrange(alphabet) for _ in range(length)]  # small alphabet: shared prefixes
        seq = Sequence(request_id=rid, token_ids=tokens, num_prompt_tokens=length,
                       params=SamplingParams(n=n, max_tokens=max_out), priority=priority,
                       arrival_order=self.arrivals)
        self.arrivals += 1
        self.requests[rid] = [seq]
        self.max_out[rid] = min(max_out, self.max_len - length)
        self.sched.add(seq)

    @rule()
    def step(self):
        batch = self.sched.schedule()
        assert batch.num_tokens <= self.sched.max_num_batched_tokens
        assert len(self.sched.running) <= self.sched.max_num_seqs
        assert len({s.seq_id for s in batch.seqs}) == len(batch.seqs)
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            assert seq.status is SequenceStatus.RUNNING and n >= 1
            assert len(seq.block_table) * self.kv.block_size >= seq.num_computed_tokens + n
        for src, dst in batch.blocks_to_copy:
            assert self.kv.blocks[dst].ref_count == 1
        for seq in batch.preempted:
            assert seq.status is SequenceStatus.WAITING and not seq.block_table
        for seq, n in zip(batch.seqs, batch.num_new_tokens):
            self.sched.advance(seq, n)
        for seq in list(batch.seqs):
            if seq.num_computed_tokens != seq.num_tokens:
                continue
            group = [seq]
            if seq.params.n > 1 and not seq.has_forked:
                for index in range(1, seq.params.n):
                    child = seq.fork(index)
                    self.sched.fork(seq, child)
                    self.requests[seq.request_id].append(child)
                    group.append(child)
            for s in group:
                s.token_ids.append(self.rng.randrange(4))
                if s.num_output_tokens >= self.max_out[s.request_id]:
                    self.sched.finish(s, "length")

    @precondition(lambda self: any(not s.is_finished for s in self._live()))
    @rule(data=st.data())
    def abort(self, data):
        live = sorted({s.request_id for s in self._live()})
        rid = data.draw(st.sampled_from(live))
        for seq in self.requests[rid]:
            if not seq.is_finished:
                self.sched.finish(seq, "abort")

    @rule()
    def drain(self):
        """Everything admitted finishes in a bounded number of steps (no livelock)."""
        for _ in range(2000):
            if not self.sched.has_unfinished():
                break
            self.step()
        assert not self.sched.has_unfinished()
        stats = self.kv.stats()
        assert stats.num_used == 0 and stats.num_free + stats.num_cached == self.kv.num_blocks

    @invariant()
    def pool_is_consistent(self):
        if hasattr(self, "kv"):
            self.kv.check_invariants(self._live())
            s = self.kv.stats()
            assert s.num_free + s.num_cached + s.num_used == self.kv.num_blocks
            assert 0 <= s.prefix_hits <= s.prefix_queries


TestEngineModel = EngineModel.TestCase
TestEngineModel.settings = settings(max_examples=150, stateful_step_count=40, deadline=None,
                                    suppress_health_check=[HealthCheck.too_slow])
