"""TTFT of a request whose long prefix the device pool has evicted: loaded from the host
tier, from the disk tier, or recomputed; the prefix still in the pool as the floor.

For each model, the configurations take turns in every round (the order alternates, so a
shared machine slows them alike). A round, per configuration: one request caches a
`--prefix`-token prefix, a filler request of the same length evicts it from a pool that
holds about one such request (into the host tier, or through it to disk), the tiers'
copies finish, then the timed request (same prefix, another tail, one output token)
runs alone: its wall time is its TTFT. Greedy, so every configuration must produce the
same token (checked). The table gives medians over rounds and ratios against recompute.

`--replica` measures the issue's third benchmark instead: one engine serves `--rounds`
prefixes and a filler, so they reach the disk tier; then, per round, a newly started
engine on the same directory (warm) and one on an empty directory (cold) each serve their
first request, on one of those prefixes; their TTFTs, medians, and warm / cold.

On CPU the device pool and the host tier are both DRAM: the host tier stands for what a
GPU gets from host memory.

    python benchmarks/bench_kv_offload.py --models bench,builtin://smollm2-135m-instruct \
        --prefix 2032 --rounds 3 --threads 1
    python benchmarks/bench_kv_offload.py --models builtin://smollm2-135m-instruct \
        --prefix 8176 --configs host,recompute --warmup-prefix 512 --rounds 1 --threads 1

For a prefix past the bench model's 2,048 positions, the bench model is written once more
with a larger max_position_embeddings (same seed, same weights; kv_bench_common.py).
`--configs` runs a subset; `--warmup-prefix` shortens the warm-up round (at 8k tokens every
prefill of SmolLM2 takes about a minute on one CPU thread).
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.kv_bench_common import model_path  # noqa: E402

CONFIGS = ("device", "host", "disk", "recompute")
TAIL = 8


def _engine(model: str, config: str, prefix: int, block_size: int, disk_root: Path):
    from engine import LLMEngine

    max_len = prefix + TAIL + 1
    blocks = -(-max_len // block_size)
    kw = dict(model=model, block_size=block_size, max_model_len=max_len,
              max_num_batched_tokens=max(2048, max_len), dtype="float32",
              # "device": room for two requests; otherwise about one request's worth
              num_gpu_blocks_override=blocks * (2 if config == "device" else 1) + 2)
    if config == "host":
        kw.update(kv_offloading_size=4.0)
    elif config == "disk":
        kw.update(kv_offloading_size=0, kv_disk_dir=str(disk_root / model.replace("/", "_")),
                  kv_disk_size=8.0)
    return LLMEngine.from_args(**kw)


def _run(engine, request_id: str, ids: list[int]) -> tuple[float, list[int], int]:
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=1, ignore_eos=True)
    start = time.perf_counter()
    engine.add_request(request_id, ids, params)
    out = None
    while engine.has_unfinished_requests():
        out = next((o for o in engine.step() if o.finished), out)
    return time.perf_counter() - start, out.outputs[0].token_ids, out.num_cached_tokens


def _model(name: str, args: argparse.Namespace) -> str:
    return model_path(name, args.prefix + TAIL + 1)


def bench_model(name: str, args: argparse.Namespace, disk_root: Path) -> list[str]:
    model = _model(name, args)
    configs = args.configs
    engines = {c: _engine(model, c, args.prefix, args.block_size, disk_root) for c in configs}
    vocab = min(e.info.vocab_size for e in engines.values())
    rng = random.Random(args.seed)

    def tokens(n: int) -> list[int]:
        return [rng.randrange(10, vocab) for _ in range(n)]

    times: dict[str, list[float]] = {c: [] for c in configs}
    cached: dict[str, list[int]] = {c: [] for c in configs}
    warmup = args.prefix if args.warmup_prefix is None else args.warmup_prefix
    for r in range(0 if warmup else 1, args.rounds + 1):  # round 0 warms up, uncounted
        length = warmup if r == 0 else args.prefix
        prefix, filler = tokens(length), tokens(length + TAIL)
        first, timed = prefix + tokens(TAIL), prefix + tokens(TAIL)
        answers = set()
        order = configs if r % 2 == 0 else configs[::-1]
        for c in order:
            engine = engines[c]
            _run(engine, f"p{r}", first)
            if c != "device":
                _run(engine, f"f{r}", filler)
            if engine.offload is not None:
                engine.offload.drain()
            seconds, answer, num_cached = _run(engine, f"t{r}", timed)
            answers.add(tuple(answer))
            if r:
                times[c].append(seconds)
                cached[c].append(num_cached)
        assert len(answers) == 1, f"configurations disagree: {answers}"
        if r:  # each round as it ends, so a run cut short still shows what it measured
            print(f"# {name} round {r}: " + ", ".join(
                f"{c} {times[c][-1] * 1000:.1f} ms" for c in configs), file=sys.stderr, flush=True)
    for engine in engines.values():
        if engine.offload is not None:
            engine.offload.close()
    med = {c: statistics.median(times[c]) for c in configs}
    rows = []
    for c in configs:
        rows.append(f"| {name} | {args.prefix} | {c} | {statistics.median(cached[c]):.0f} | "
                    f"{med[c] * 1000:.1f} ({min(times[c]) * 1000:.1f}-{max(times[c]) * 1000:.1f}) "
                    f"| {med['recompute'] / med[c]:.1f}x |")
    return rows


def bench_replica(name: str, args: argparse.Namespace, disk_root: Path) -> list[str]:
    """A replica started after another filled the shared disk tier, against a cold one."""
    model = _model(name, args)
    shared, empty = disk_root / "shared", disk_root / "cold"
    first = _engine(model, "disk", args.prefix, args.block_size, shared)
    rng = random.Random(args.seed)
    vocab = first.info.vocab_size
    prefixes = [[rng.randrange(10, vocab) for _ in range(args.prefix)]
                for _ in range(args.rounds + 1)]
    fillers = [[rng.randrange(10, vocab) for _ in range(args.prefix)] for _ in range(2)]
    for i, prefix in enumerate(prefixes + fillers):  # fillers push the last ones to disk
        _run(first, f"fill{i}", prefix + [rng.randrange(10, vocab) for _ in range(TAIL)])
    first.offload.drain()
    first.offload.close()
    times: dict[str, list[float]] = {"warm": [], "cold": []}
    for r, prefix in enumerate(prefixes):  # round 0 warms up, uncounted
        timed = prefix + [rng.randrange(10, vocab) for _ in range(TAIL)]
        answers = set()
        for kind in (("warm", "cold") if r % 2 == 0 else ("cold", "warm")):
            root = shared if kind == "warm" else empty / str(r)
            engine = _engine(model, "disk", args.prefix, args.block_size, root)
            seconds, answer, num_cached = _run(engine, "first", timed)
            engine.offload.close()
            answers.add(tuple(answer))
            if r:
                times[kind].append(seconds)
            if kind == "warm":
                assert num_cached >= args.prefix - args.block_size, num_cached
        assert len(answers) == 1, f"warm and cold disagree: {answers}"
    med = {k: statistics.median(v) for k, v in times.items()}
    return [f"| {name} | {args.prefix} | {k} | {med[k] * 1000:.1f} "
            f"({min(times[k]) * 1000:.1f}-{max(times[k]) * 1000:.1f}) | "
            f"{med[k] / med['cold']:.2f}x |" for k in ("warm", "cold")]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", default="bench,builtin://smollm2-135m-instruct",
                   help="comma-separated: bench (the ~23M random-weight bench model of "
                        "bench_offline.py) and/or checkpoint dirs or builtin://NAME")
    p.add_argument("--prefix", type=int, default=2032, help="prefix tokens (a block multiple)")
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch intra-op threads")
    p.add_argument("--replica", action="store_true", help="the shared-disk replica benchmark "
                   "(see above) instead of the tiers' TTFT")
    p.add_argument("--disk-dir", default=None, help="the disk tier's directory (default: a "
                   "temporary one)")
    p.add_argument("--configs", default=",".join(CONFIGS), help="which of " + ",".join(CONFIGS)
                   + " to run (recompute, the ratios' base, always among them)")
    p.add_argument("--warmup-prefix", type=int, default=None, help="prefix tokens of the "
                   "uncounted warm-up round (default: --prefix; 0: no warm-up round); a "
                   "shorter one saves time on long prefixes, not in --replica")
    args = p.parse_args(argv)
    args.configs = tuple(c.strip() for c in args.configs.split(","))
    unknown = sorted(set(args.configs) - set(CONFIGS))
    if unknown or "recompute" not in args.configs or len(set(args.configs)) < len(args.configs):
        p.error(f"--configs {','.join(args.configs)}: name each of {','.join(CONFIGS)} at most "
                "once, recompute among them" + (f" (unknown: {unknown})" if unknown else ""))
    if args.prefix < 1 or args.prefix % args.block_size:
        p.error(f"--prefix {args.prefix}: give a positive multiple of --block-size "
                f"{args.block_size}")
    if args.warmup_prefix is not None and not 0 <= args.warmup_prefix <= args.prefix:
        p.error(f"--warmup-prefix {args.warmup_prefix}: give 0 to {args.prefix} (--prefix)")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    warmup = args.prefix if args.warmup_prefix is None or args.replica else args.warmup_prefix
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU, "
          f"block size {args.block_size}, {args.rounds} rounds (+"
          + (f"1 warm-up of {warmup} tokens)" if warmup else "no warm-up)"))
    if args.replica:
        print("| model | prefix tokens | new replica's disk | first TTFT ms, median (min-max) "
              "| this / cold |")
        print("|---|---|---|---|---|")
    else:
        print("| model | prefix tokens | TTFT of the prefix from | tokens cached | TTFT ms, "
              "median (min-max) | recompute / this |")
        print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(args.disk_dir) if args.disk_dir else Path(tmp)
        for name in args.models.split(","):
            bench = bench_replica if args.replica else bench_model
            for row in bench(name.strip(), args, root):
                print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
