"""What verifying drafts costs: one decode step's time against the drafts it verifies.

Speculative decoding gains `tokens per step / (step time with k drafts / step time
without)`. This measures the denominator on this machine: the engine's own steps (its
model runner, paged attention, sampler and verifier), `--batch` sequences decoding at
`--context` tokens, each step verifying k drafts per sequence (a proposer that always
offers k tokens, all rejected, so every step has the same shape), per dtype. A method pays
off only where its tokens per step exceed the ratio printed for its draft length.

    python -m benchmarks.bench_verify_cost --model builtin://smollm2-135m-instruct \\
        [--dtype float32,bfloat16] [--drafts 0,1,2,4,8] [--batch 1] [--context 512]
        [--steps 24] [--threads 1]

The step is timed by the engine itself (LLMEngine.step_observer); the table gives the
median over --steps steps after three unmeasured ones, and the ratio against 0 drafts of
the same dtype, batch and context. Drafts are rejected here, so what the proposer and the
output processing do with accepted tokens is not in it (both are small next to the
forward on CPU: bench_spec_decode's profiles).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def step_times(engine, k: int, *, batch: int, context: int, steps: int, seed: int) -> list[tuple]:
    """(shape, seconds) of `steps` decode steps of `batch` sequences, each verifying `k`
    drafts (after 3 unmeasured ones); fewer when the sequences ended first."""
    from engine.sampling_params import SamplingParams
    from tuner.sim.calibrate import FixedDrafts

    rng = random.Random(seed)
    vocab = engine.info.vocab_size
    engine.scheduler.proposer = FixedDrafts(k, token=3) if k else None
    for i in range(batch):
        ids = [rng.randrange(3, vocab) for _ in range(context)]
        engine.add_request(f"k{k}-{i}", ids, SamplingParams(
            max_tokens=steps + 8 + k, ignore_eos=True, temperature=0.0))
    timed: list[tuple] = []
    engine.step_observer = lambda shape, s: timed.append((shape, s))
    while engine.has_unfinished_requests():
        engine.step()
    decodes = [(shape, s) for shape, s in timed if not shape.prefill_tokens
               and shape.decode_seqs == batch and shape.draft_tokens == k * batch]
    return decodes[3:3 + steps]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="builtin://smollm2-135m-instruct")
    ap.add_argument("--dtype", default="float32,bfloat16")
    ap.add_argument("--drafts", default="0,1,2,4,8", help="drafts per sequence, comma-separated")
    ap.add_argument("--batch", type=int, default=1, help="sequences decoding together")
    ap.add_argument("--context", type=int, default=512, help="each sequence's prompt tokens")
    ap.add_argument("--steps", type=int, default=24)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    drafts = [int(x) for x in args.drafts.split(",")]
    if min(drafts) < 0 or args.batch < 1 or args.context < 1 or args.steps < 1:
        ap.error("--drafts must be >= 0; --batch, --context and --steps >= 1")
    if 0 not in drafts:
        drafts = [0] + drafts
    import torch

    from engine import LLMEngine

    print(f"# {args.model}; torch {torch.__version__}, {args.threads} thread(s); "
          f"{args.batch} sequence(s) at {args.context} tokens; median of {args.steps} steps")
    print("| dtype | drafts per sequence | query rows | step ms | vs 0 drafts |")
    print("|---|---:|---:|---:|---:|")
    for dtype in args.dtype.split(","):
        per_seq = args.context + args.steps + 16 + 2 * max(drafts)
        engine = LLMEngine.from_args(
            model=args.model, dtype=dtype, device="cpu", cpu_threads=args.threads,
            max_num_seqs=args.batch, block_size=16, max_model_len=per_seq + 16,
            num_gpu_blocks_override=args.batch * (per_seq // 16 + 2) + 8,
            max_num_batched_tokens=max(2048, args.batch * (max(drafts) + 1), args.context),
            speculative_config={"method": "ngram", "num_speculative_tokens": max(max(drafts), 1)})
        base = None
        for k in drafts:
            timed = step_times(engine, k, batch=args.batch, context=args.context,
                               steps=args.steps, seed=k)
            if not timed:
                raise SystemExit(f"no decode step with {k} drafts was timed; raise --steps")
            ms = statistics.median(s for _, s in timed) * 1e3
            base = base or ms
            print(f"| {dtype} | {k} | {args.batch * (k + 1)} | {ms:.1f} | {ms / base:.2f}x |")
        del engine
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
