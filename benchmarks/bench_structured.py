"""Decode time per output token (TPOT) with a JSON-schema constraint against none.

For each batch size, two engines' worth of work on one engine, in turns: --batch requests
unconstrained, then --batch requests constrained to a JSON schema (a string of 200-400
characters in an object, so no row finishes inside the timed steps), each prefilled
(not timed) and then decoded for --steps timed steps. Rows sample (temperature 0.8,
seeded), so the mask's cost is in the sampler's path as in serving. Rounds alternate the
two, so a shared, noisy machine slows them alike; the table gives median step times
(TPOT: every row gets one token per step), their ratio, and the median of per-round ratios,
and the time the constrained steps spent filling and applying the grammar's masks (the
whole added work in the sampler, less noisy than a difference of step times).
Goal: constrained / unconstrained <= 1.10 at batch 16.

    python benchmarks/bench_structured.py --batches 1,16 --steps 24 --rounds 5 --threads 1
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

SCHEMA = {"type": "object", "properties": {
    "text": {"type": "string", "minLength": 200, "maxLength": 400}}, "required": ["text"]}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None,
                   help="checkpoint path or builtin:// name (default: the 23M bench Llama)")
    p.add_argument("--batches", default="1,16", help="comma-separated batch sizes")
    p.add_argument("--steps", type=int, default=24, help="timed decode steps per turn")
    p.add_argument("--rounds", type=int, default=5, help="turns of each kind per batch size")
    p.add_argument("--context", type=int, default=64, help="prompt tokens per request")
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    return p


def _turn(engine, batch: int, steps: int, context: int, constrained: bool, tag: str
          ) -> float:
    """Median decode step time (s) of one batch run for `steps` steps, then aborted."""
    from engine import SamplingParams
    from engine.structured_output import StructuredOutputsParams

    so = StructuredOutputsParams(json=SCHEMA) if constrained else None
    ids = []
    for i in range(batch):
        rid = f"{tag}-{i}"
        ids.append(rid)
        prompt = [3 + (i * 7 + j * 13 + len(tag)) % 500 for j in range(context)]
        engine.add_request(rid, prompt, SamplingParams(
            temperature=0.8, seed=i, max_tokens=steps + 8, ignore_eos=True,
            structured_outputs=so))
    while engine.scheduler.waiting or any(s.num_output_tokens == 0
                                          for s in engine.scheduler.running):
        engine.step()  # prefill (and the first token): not timed
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        engine.step()
        times.append(time.perf_counter() - t0)
    for rid in ids:
        engine.abort_request(rid)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    from benchmarks.bench_decode import bench_model_path
    from engine import LLMEngine
    from engine.model_loader import resolve_model_path

    path = resolve_model_path(args.model) if args.model else bench_model_path(None)
    batches = [int(b) for b in args.batches.split(",")]
    max_len = args.context + args.steps + 64
    engine = LLMEngine.from_args(
        model=str(path), max_num_seqs=max(batches), max_model_len=max_len,
        max_num_batched_tokens=max(2048, max(batches) * args.context),
        num_gpu_blocks_override=max(batches) * (-(-max_len // 16)) + 8, device="cpu",
        dtype="float32", cpu_threads=args.threads, enable_prefix_caching=False)
    _turn(engine, 1, 2, args.context, True, "warm")  # xgrammar's tokenizer info, compile
    manager, mask_times = engine.output.structured, []
    apply_masks = manager.apply_masks

    def timed_masks(logits, seqs):
        t0 = time.perf_counter()
        apply_masks(logits, seqs)
        if any(s.params.structured_outputs is not None for s in seqs):
            mask_times.append(time.perf_counter() - t0)

    manager.apply_masks = timed_masks
    print(f"model {path.name}, vocab {engine.info.vocab_size}, {args.steps} steps x "
          f"{args.rounds} rounds, context {args.context}")
    print("| batch | unconstrained TPOT (ms) | JSON schema TPOT (ms) | ratio | "
          "median per-round ratio | mask time per step (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for batch in batches:
        free, forced = [], []
        mask_times.clear()
        for r in range(args.rounds):
            free.append(_turn(engine, batch, args.steps, args.context, False, f"f{batch}-{r}"))
            forced.append(_turn(engine, batch, args.steps, args.context, True, f"c{batch}-{r}"))
        a, b = statistics.median(free), statistics.median(forced)
        per_round = statistics.median(c / f for f, c in zip(free, forced))
        masks = statistics.median(mask_times) if mask_times else 0.0
        print(f"| {batch} | {a * 1e3:.2f} | {b * 1e3:.2f} | {b / a:.3f} | {per_round:.3f} "
              f"| {masks * 1e3:.3f} |")
    engine.check_no_leaks()
    return 0


if __name__ == "__main__":
    sys.exit(main())
