"""benchmarks/bench_verify_cost.py times what it says: decode steps of `batch` sequences,
each verifying exactly k drafts, no prefill among them, as many as asked; and its table."""
from __future__ import annotations

import pytest

from benchmarks import bench_verify_cost
from benchmarks.bench_verify_cost import step_times


@pytest.fixture(scope="module")
def engine():
    from engine import LLMEngine

    return LLMEngine.from_args(model=None, device="cpu", dtype="float32", cpu_threads=1,
                               max_num_seqs=2, block_size=16, max_model_len=256,
                               num_gpu_blocks_override=40, max_num_batched_tokens=256,
                               speculative_config={"method": "ngram",
                                                   "num_speculative_tokens": 4})


@pytest.mark.parametrize("k,batch", [(0, 1), (3, 1), (4, 2)])
def test_every_timed_step_decodes_the_batch_with_k_drafts_each(engine, k, batch):
    before = engine.get_stats().spec_num_draft_tokens
    timed = step_times(engine, k, batch=batch, context=40, steps=6, seed=k)
    assert len(timed) == 6
    for shape, seconds in timed:
        assert (shape.prefill_tokens, shape.decode_seqs, shape.draft_tokens) == (0, batch, k * batch)
        assert seconds > 0
    # the drafts reached the verifier (all of every timed step's, and more)
    assert engine.get_stats().spec_num_draft_tokens - before >= 6 * k * batch
    assert not engine.has_unfinished_requests()        # nothing left behind
    assert engine.kv.stats().usage == 0                # every block back in the pool


def test_the_table_has_a_row_per_dtype_and_draft_length_against_no_drafts(capsys):
    bench_verify_cost.main(["--model", "builtin://default", "--dtype", "float32",
                            "--drafts", "2", "--steps", "4", "--context", "32"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines()
            if line.startswith("| float32")]
    assert [int(r[1]) for r in rows] == [0, 2]         # 0 drafts added as the reference
    assert rows[0][4].strip() == "1.00x" and [int(r[2]) for r in rows] == [1, 3]
