"""The scheduler's counts: seats, the token budget, preemptions, retirement, cached prompt
tokens; each pinned by a small hand-checked case (no model, no torch; found by
scripts/mutation.py, complementing test_scheduler_policy.py)."""
from __future__ import annotations

from engine.kv_cache_manager import KVCacheManager
from engine.sampling_params import SamplingParams
from engine.scheduler import Scheduler
from engine.sequence import Sequence, SequenceStatus
from test_scheduler_policy import _step  # one step with a fake model

PARAMS = SamplingParams(max_tokens=8)


def _seq(rid: str, tokens: list[int], arrival: int, params: SamplingParams = PARAMS) -> Sequence:
    return Sequence(request_id=rid, token_ids=list(tokens), num_prompt_tokens=len(tokens),
                    params=params, arrival_order=arrival)


def _sched(max_num_seqs: int, budget: int, *, num_blocks: int = 32, block_size: int = 4,
           prefix: bool = False) -> Scheduler:
    return Scheduler(KVCacheManager(num_blocks, block_size, prefix), max_num_seqs=max_num_seqs,
                     max_num_batched_tokens=budget)


def _plan(batch):
    return [(s.request_id, s.index, n) for s, n in zip(batch.seqs, batch.num_new_tokens)]


def _fork(sched: Scheduler, parent: Sequence) -> Sequence:
    """As the engine does once a request's prompt is computed: sample 1 forks off sample 0."""
    child = parent.fork(1)
    sched.fork(parent, child)
    return child


def test_max_num_seqs_caps_admissions_within_one_step():
    sched = _sched(max_num_seqs=2, budget=64)
    for i in range(3):
        sched.add(_seq(f"r{i}", [i + 1, i + 2], i))
    assert _plan(sched.schedule()) == [("r0", 0, 2), ("r1", 0, 2)]
    assert [s.request_id for s in sched.waiting] == ["r2"]


def test_the_last_token_of_the_budget_admits_a_waiting_prompts_first_chunk():
    sched = _sched(max_num_seqs=2, budget=2)
    sched.add(_seq("a", [1], 0))
    sched.add(_seq("b", [2, 3, 4], 1))
    assert _plan(sched.schedule()) == [("a", 0, 1), ("b", 0, 1)]


def test_a_sequence_scheduled_in_this_step_is_never_its_preemption_victim():
    # A (low priority) was admitted a step before B (high priority): running is [A, B].
    sched = Scheduler(KVCacheManager(3, 2, False), max_num_seqs=2, max_num_batched_tokens=64,
                      policy="priority")
    a = Sequence(request_id="A", token_ids=[10, 11], num_prompt_tokens=2, params=PARAMS,
                 priority=5, arrival_order=0)
    b = Sequence(request_id="B", token_ids=[20, 21], num_prompt_tokens=2, params=PARAMS,
                 priority=0, arrival_order=1)
    sched.add(a)
    _step(sched)
    sched.add(b)
    assert _plan(_step(sched)) == [("A", 0, 1), ("B", 0, 2)]   # the pool is now full
    # A's next token fits its block and A is scheduled first; B needs a block: A holds
    # the lowest priority but is already in the batch, so B is the one to go
    batch = _step(sched)
    assert (_plan(batch), [s.request_id for s in batch.preempted]) == ([("A", 0, 1)], ["B"])
    assert sched.running == [a] and sched.waiting == [b]


def test_samples_reserve_their_seats_until_they_fork_then_take_one_each():
    sched = _sched(max_num_seqs=3, budget=64)
    parent = _seq("p", [5, 6], 0, SamplingParams(n=2, max_tokens=8))
    sched.add(parent)
    sched.add(_seq("q", [7], 1))
    sched.add(_seq("r", [8], 2))
    # p's two samples hold two seats before the fork: q fits, r does not
    assert _plan(sched.schedule()) == [("p", 0, 2), ("q", 0, 1)]
    for seq, n in ((parent, 2), (sched.running[1], 1)):
        sched.advance(seq, n)
    child = _fork(sched, parent)
    for seq in sched.running:
        seq.token_ids.append(1)
    sched.finish(sched.running[1], "stop")      # q done: p's two samples hold 2 of 3 seats
    assert [(s.request_id, s.index) for s in sched.running] == [("p", 0), ("p", 1)]
    assert _plan(sched.schedule()) == [("p", 0, 1), ("p", 1, 1), ("r", 0, 1)]
    assert child.status is SequenceStatus.RUNNING


def test_the_token_budget_cuts_running_sequences_off_in_admission_order():
    # max_num_seqs <= budget, as the engine's settings require; the fork appends p's second
    # sample behind q, whose prompt is still being prefilled in chunks.
    sched = _sched(max_num_seqs=3, budget=4)
    parent = _seq("p", [5], 0, SamplingParams(n=2, max_tokens=8))
    q = _seq("q", list(range(10, 18)), 1)       # an 8-token prompt
    sched.add(parent)
    sched.add(q)
    batch = sched.schedule()
    assert _plan(batch) == [("p", 0, 1), ("q", 0, 3)]
    sched.advance(parent, 1)
    sched.advance(q, 3)
    child = _fork(sched, parent)
    parent.token_ids.append(1)
    child.token_ids.append(2)
    # budget 4: p's decode, then q's next chunk takes the other 3; p's sibling waits
    assert _plan(_step(sched)) == [("p", 0, 1), ("q", 0, 3)]
    # q has 2 prompt tokens left: the last token of the budget goes to the sibling
    assert _plan(_step(sched)) == [("p", 0, 1), ("q", 0, 2), ("p", 1, 1)]


def test_num_preemptions_counts_every_preemption():
    # three one-block sequences fill a 3-block pool; their next tokens need new blocks
    sched = _sched(max_num_seqs=3, budget=64, num_blocks=3, block_size=2)
    for i, name in enumerate("ABC"):
        sched.add(_seq(name, [10 + i, 20 + i], i))
    _step(sched)
    assert sched.num_preemptions == 0
    batch = _step(sched)
    assert [s.request_id for s in batch.preempted] == ["C", "B"]
    assert sched.num_preemptions == 2
    for _ in range(3):                          # A alone fills the pool block by block
        assert not _step(sched).preempted
    assert [s.request_id for s in _step(sched).preempted] == ["A"]
    assert sched.num_preemptions == 3


def test_finish_retires_a_waiting_or_running_sequence_and_records_why():
    sched = _sched(max_num_seqs=1, budget=64)
    running, waiting = _seq("run", [1, 2], 0), _seq("wait", [3, 4], 1)
    sched.add(running)
    sched.add(waiting)
    sched.schedule()
    sched.finish(waiting, "abort")
    assert (waiting.status, waiting.finish_reason) == (SequenceStatus.FINISHED, "abort")
    assert sched.waiting == [] and sched.running == [running]
    sched.finish(running, "stop")
    assert (running.status, running.finish_reason) == (SequenceStatus.FINISHED, "stop")
    assert not sched.has_unfinished()
    assert sched.kv.stats().num_used == 0


def test_cached_tokens_are_the_prefix_hit_of_the_first_admission_only():
    sched = _sched(max_num_seqs=2, budget=64, num_blocks=4, block_size=2, prefix=True)
    a, b = _seq("A", [10, 11, 12], 0), _seq("B", [20, 21, 22], 1)
    sched.add(a)
    sched.add(b)
    for _ in range(3):
        batch = _step(sched)
    assert [s.request_id for s in batch.preempted] == ["B"]    # the pool ran out
    sched.finish(a, "stop")
    # B comes back and finds its own first block in the cache: recomputing after a
    # preemption is not a cache hit for the client
    assert _plan(_step(sched)) == [("B", 0, 3)] and b.num_computed_tokens == 5
    assert b.num_cached_tokens == 0
    # a new request sharing B's first block: those 2 prompt tokens came from the cache
    c = _seq("C", [20, 21, 22, 7], 2)
    sched.add(c)
    assert _plan(_step(sched)) == [("B", 0, 1), ("C", 0, 2)]
    assert c.num_cached_tokens == 2
