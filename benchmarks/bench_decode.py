"""Decode-only throughput: the engine's step loop against the model's own batched decode.

A static batch of --batch sequences with --context tokens each is prefilled (not timed).
Rows:

- engine (<backend>): one LLMEngine.step() (schedule, inputs, forward, sample, outputs) with
  that CPU attention backend, swapped in place on one engine: same model, cache, scheduler;
- ceiling: the same checkpoint in transformers (SDPA, contiguous DynamicCache, static batch
  of the same size and context, greedy argmax): what the model code itself does here.

Each round gives every row a turn back to back (one untimed step, then --turn-steps timed
ones; the ceiling steps as often as the engine, so contexts stay equal), so a shared, noisy
machine slows the rows alike; with several --threads counts each round does every row at
each count (torch's intra-op threads are process-wide: both rows run with the same count).
One table per thread count gives tok/s from median step times, their ratios, and the median
of per-round ratios.

    python benchmarks/bench_decode.py --batch 64 --context 200 --rounds 10 --threads 1,2
"""
from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default=None, help="checkpoint path (default: the 23M bench Llama)")
    p.add_argument("--batch", type=int, default=64, help="sequences decoding together")
    p.add_argument("--context", type=int, default=200, help="tokens of context when timing starts")
    p.add_argument("--rounds", type=int, default=10,
                   help="rounds; in each, every row takes a turn (medians reported)")
    p.add_argument("--turn-steps", type=int, default=2, help="timed decode steps in one turn")
    p.add_argument("--backends", default="torch-reference,torch",
                   help="comma-separated CPU attention backends to compare")
    p.add_argument("--threads", default="1,2",
                   help="torch intra-op thread counts, comma-separated, all in this run "
                        "(2 is the engine's default on a 2-core machine)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--no-ceiling", action="store_true", help="skip the transformers row")
    return p


def bench_model_path(model: str | None) -> Path:
    if model:
        return Path(model)
    from engine.builtin_models import build_once, model_cache_root
    from engine.default_model import build_checkpoint

    # the checkpoint benchmarks/bench_offline.py uses (same directory, built once)
    return build_once(model_cache_root() / "bench-llama-23m-v1", lambda tmp: build_checkpoint(
        tmp, hidden_size=512, num_layers=8, num_heads=8, num_kv_heads=4,
        intermediate_size=1376, max_position_embeddings=2048, seed=0))


class EngineDecode:
    """One engine holding a prefilled static batch; each call times one decode step with the
    given attention backend (swapped in place: same model, cache, scheduler)."""

    def __init__(self, path: Path, *, batch: int, context: int, max_steps: int, block_size: int,
                 threads: int | None) -> None:
        from engine import LLMEngine, SamplingParams

        max_len = context + max_steps + 64  # sequences admitted first decode while others prefill
        self.engine = eng = LLMEngine.from_args(
            model=str(path), block_size=block_size, max_num_seqs=batch,
            max_num_batched_tokens=max(2048, batch), max_model_len=max_len,
            num_gpu_blocks_override=batch * (-(-max_len // block_size)) + 8,
            enable_prefix_caching=False, device="cpu", dtype="float32", cpu_threads=threads)
        params = SamplingParams(temperature=0.0, max_tokens=max_len - context, ignore_eos=True)
        for i in range(batch):  # distinct prompts (no prefix sharing) of context - 1 tokens
            eng.add_request(f"r{i}", [3 + (i * 7 + j * 13) % 500 for j in range(context - 1)], params)
        while eng.scheduler.waiting or any(s.num_computed_tokens < s.num_tokens - 1
                                           for s in eng.scheduler.running):
            eng.step()  # prefill, chunked as the scheduler likes: not timed
        eng.step()  # first decode: warm-up
        self.batch = batch

    def step(self, backend) -> tuple[float, float]:
        self.engine.runner.backend = backend
        start, cpu = time.perf_counter(), time.process_time()
        outputs = self.engine.step()
        elapsed = time.perf_counter() - start, time.process_time() - cpu
        assert len(outputs) == self.batch, "every sequence decodes each step"
        return elapsed


class CeilingDecode:
    """transformers' own batched decode: SDPA, contiguous cache, greedy, static batch."""

    def __init__(self, path: Path, *, batch: int, context: int) -> None:
        import inspect

        import torch
        from transformers import AutoModelForCausalLM, DynamicCache

        self.model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32,
                                                          attn_implementation="sdpa").eval()
        params = inspect.signature(self.model.forward).parameters
        kw = "cache" if "cache" in params else "past_key_values"  # renamed in transformers 5.x
        self.cache = {kw: DynamicCache(config=self.model.config)}
        ids = torch.randint(3, 500, (batch, context - 1), generator=torch.Generator().manual_seed(0))
        with torch.inference_mode():
            self.token = self.model(ids, use_cache=True, **self.cache).logits[:, -1:].argmax(-1)
        self.step()  # warm-up

    def step(self, _backend=None) -> tuple[float, float]:
        import torch

        start, cpu = time.perf_counter(), time.process_time()
        with torch.inference_mode():  # token: [batch, 1]; the cache grows by one a step
            self.token = self.model(self.token, **self.cache).logits[:, -1:].argmax(-1)
        return time.perf_counter() - start, time.process_time() - cpu


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    import torch

    from paged_kernels import get_backend

    try:
        counts = [int(n) for n in str(args.threads).split(",") if n.strip()]
    except ValueError:
        raise SystemExit(f"--threads: comma-separated whole numbers, got {args.threads!r}")
    if not counts or min(counts) < 1:
        raise SystemExit(f"--threads: one or more counts >= 1, got {args.threads!r}")
    torch.set_num_threads(counts[0])
    path = bench_model_path(args.model)
    names = [b.strip() for b in args.backends.split(",") if b.strip()]
    backends = {n: get_backend(n, "cpu") for n in names}
    for b in backends.values():
        b.check_values = False  # as the model runner runs them
    # per row, engine and ceiling alike
    steps = args.rounds * len(counts) * max(len(backends), 1) * (1 + args.turn_steps)
    rows = {}
    if backends:  # --backends "" times the ceiling alone
        engine = EngineDecode(path, batch=args.batch, context=args.context, max_steps=steps,
                              block_size=args.block_size, threads=counts[0])
        rows = {f"engine ({n})": (engine.step, b) for n, b in backends.items()}
    ceiling_key = "ceiling: transformers batched decode"
    if not args.no_ceiling:
        rows[ceiling_key] = (CeilingDecode(path, batch=args.batch, context=args.context).step, None)
    print(f"# {path.name}; batch {args.batch}, context {args.context} to {args.context + steps}; "
          f"torch {torch.__version__}, threads {', '.join(map(str, counts))} "
          f"({os.cpu_count()} CPUs, load average {os.getloadavg()[0]:.2f} at start); "
          f"{args.rounds} rounds, each a turn of every row at every thread count back to back "
          f"(1 untimed + {args.turn_steps} timed decode steps); medians")
    times = {n: {k: [] for k in rows} for n in counts}   # (wall, CPU) medians of each turn
    for r in range(args.rounds):
        for n in counts:
            torch.set_num_threads(n)
            order = list(rows.items()) if r % 2 == 0 else list(rows.items())[::-1]  # no order bias
            for key, (step, backend) in order:
                # a turn: one untimed step (the previous row's allocations may have reshaped
                # the heap), then the median of the timed ones
                step(backend)
                turn = [step(backend) for _ in range(args.turn_steps)]
                times[n][key].append(tuple(statistics.median(x) for x in zip(*turn)))
            if ceiling_key in rows:  # the ceiling steps as often as the engine (equal contexts)
                for _ in range((max(len(backends), 1) - 1) * (1 + args.turn_steps)):
                    rows[ceiling_key][0]()
    for n in counts:
        print(f"\n## {n} thread{'s' if n > 1 else ''}")
        print_table(times[n], args.batch, ceiling_key if ceiling_key in rows else next(iter(rows)))
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")
    return 0


def print_table(times: dict[str, list[tuple[float, float]]], batch: int, ref_key: str) -> None:
    """Wall-clock columns, then the process's CPU time per step (all its threads): on a
    shared machine wall time also counts waiting for a core, CPU time only the work (and
    the thread pool's spinning)."""
    wall = {k: [w for w, _ in v] for k, v in times.items()}
    cpu = {k: [c for _, c in v] for k, v in times.items()}
    med = {k: statistics.median(v) for k, v in wall.items()}
    ref = ref_key.split(":")[0]
    print(f"| {'row':<38} | {'tok/s':>7} | {'ms/step':>8} | {'vs ' + ref:>11} | "
          f"{'paired vs ' + ref:>18} | {'CPU ms/step':>11} | {'CPU paired':>10} |")
    print(f"|{'-' * 40}|{'-' * 9}|{'-' * 10}|{'-' * 13}|{'-' * 20}|{'-' * 13}|{'-' * 12}|")
    for key, v in wall.items():
        paired = statistics.median(r / x for x, r in zip(v, wall[ref_key]))  # per-round ratio
        cpu_paired = statistics.median(r / x for x, r in zip(cpu[key], cpu[ref_key]))
        print(f"| {key:<38} | {batch / med[key]:>7.1f} | {1000 * med[key]:>8.1f} | "
              f"{med[ref_key] / med[key]:>10.2f}x | {paired:>17.2f}x | "
              f"{1000 * statistics.median(cpu[key]):>11.1f} | {cpu_paired:>9.2f}x |")
    engines = [k for k in wall if k.startswith("engine")]
    if len(engines) == 2:
        a, b = engines
        paired = statistics.median(x / y for x, y in zip(wall[a], wall[b]))
        print(f"# {b} vs {a}: {med[a] / med[b]:.2f}x faster (median of per-round ratios {paired:.2f}x)")


if __name__ == "__main__":
    raise SystemExit(main())
