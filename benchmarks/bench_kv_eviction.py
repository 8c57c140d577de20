"""The host tier's eviction policy under a stream of one-off documents: LRU against ARC.

Multi-turn conversations (as bench_kv_multiturn.py: a shared system prompt, then every
earlier message and answer plus a new message) interleaved with one-off documents (a new
random prompt of `--doc-tokens`, read once, as RAG over fresh documents), one document
after each turn, closed loop at `--concurrency`. The device pool holds about a quarter of
the conversations' working set; the host tier (`--host-share` of it) could hold the
conversations but not the documents as well. Every document the pool evicts is stored in
the host tier too: under LRU the documents push the histories out between two turns of a
conversation; ARC keeps the histories, referenced again each turn, apart from the blocks
seen once. Configurations: no tiers, LRU and ARC with the same host tier; they take turns
per round, order rotating; same seeded prompts, greedy, outputs checked equal; medians over
rounds of throughput (output tokens/s) and of each round's TTFT p50 / p90 of the
conversation turns and of the documents.

On CPU the device pool and the host tier are both DRAM: the host tier stands for what a
GPU gets from host memory.

    python benchmarks/bench_kv_eviction.py --models bench --threads 1
"""
from __future__ import annotations

import argparse
import random
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks.kv_bench_common import (add_conversation_args, model_path,  # noqa: E402
                                        quantile, start_conversations)

CONFIGS = ("off", "lru", "arc")


def _serve(engine, items: list[tuple], concurrency: int, max_tokens: int):
    """Closed loop over items in order: ("turn", conversation, message) or ("doc", prompt).
    A turn waits for its conversation's previous answer. Returns (seconds, output tokens,
    turn TTFTs, document TTFTs, every answer in order of the items)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    history: dict[int, list[int]] = {}
    busy: set[int] = set()
    in_flight: dict[str, tuple[int, int | None]] = {}  # request id -> (item index, conversation)
    answers: list[list[int] | None] = [None] * len(items)
    ttfts: dict[str, list[float]] = {"turn": [], "doc": []}
    nxt, out_tokens = 0, 0
    start = time.perf_counter()
    while nxt < len(items) or in_flight:
        while nxt < len(items) and len(in_flight) < concurrency:
            kind, *rest = items[nxt]
            if kind == "turn":
                c, message = rest
                if c in busy:
                    break
                busy.add(c)
                history[c] = history.get(c, []) + message
                prompt, conv = history[c], c
            else:
                prompt, conv = rest[0], None
            in_flight[f"r{nxt}"] = (nxt, conv)
            engine.add_request(f"r{nxt}", prompt, params)
            nxt += 1
        for out in engine.step():
            if not out.finished:
                continue
            i, conv = in_flight.pop(out.request_id)
            answer = out.outputs[0].token_ids
            answers[i], out_tokens = answer, out_tokens + len(answer)
            ttfts["turn" if conv is not None else "doc"].append(
                out.metrics.first_token_time - out.metrics.arrival_time)
            if conv is not None:
                history[conv] = history[conv] + answer
                busy.discard(conv)
    return time.perf_counter() - start, out_tokens, ttfts["turn"], ttfts["doc"], answers


def _items(rng: random.Random, args: argparse.Namespace, vocab: int) -> list[tuple]:
    system = [rng.randrange(10, vocab) for _ in range(args.system_tokens)]
    items: list[tuple] = []
    for t in range(args.turns):
        for c in range(args.conversations):
            message = [rng.randrange(10, vocab) for _ in range(args.user_tokens)]
            items.append(("turn", c, (system if t == 0 else []) + message))
            items.append(("doc", [rng.randrange(10, vocab) for _ in range(args.doc_tokens)]))
    return items


def bench_model(name: str, args: argparse.Namespace) -> list[str]:
    from engine import LLMEngine

    rng = random.Random(args.seed)
    longest = args.system_tokens + args.turns * (args.user_tokens + args.max_tokens)
    max_len = max(longest, args.doc_tokens + args.max_tokens) + 1
    model = model_path(name, max_len)
    conv_blocks = args.conversations * -(-longest // args.block_size)
    pool = max(conv_blocks // 4, -(-max_len // args.block_size) * args.concurrency + 2)
    host_blocks = int(conv_blocks * args.host_share)
    engines = {}
    for config in CONFIGS:
        kw = dict(model=model, block_size=args.block_size, max_model_len=max_len,
                  num_gpu_blocks_override=pool, dtype="float32", max_num_seqs=args.concurrency,
                  max_num_batched_tokens=max(2048, max_len))
        engines[config] = LLMEngine.from_args(**kw)
        if config != "off":  # the host tier's size in whole blocks of this model
            kv_pool = engines[config].runner.kv_pool
            block_bytes = kv_pool[:, :, 0].numel() * kv_pool.element_size()
            del engines[config]
            engines[config] = LLMEngine.from_args(
                **kw, kv_offloading_size=host_blocks * block_bytes / 2**30,
                kv_offloading_eviction_policy=config)
            assert engines[config].offload.host.max_entries == host_blocks
    vocab = engines["off"].info.vocab_size
    results: dict[str, list[tuple[float, ...]]] = {c: [] for c in CONFIGS}
    for r in range(args.rounds + 1):  # round 0 warms up, uncounted
        items = _items(rng, args, vocab)
        answers = []
        for config in CONFIGS[r % 3:] + CONFIGS[:r % 3]:
            seconds, tokens, turns, docs, out = _serve(engines[config], items,
                                                      args.concurrency, args.max_tokens)
            answers.append(out)
            if engines[config].offload is not None:
                engines[config].offload.host.check_invariants()
            if r:
                results[config].append((tokens / seconds, quantile(turns, 0.5),
                                        quantile(turns, 0.9), quantile(docs, 0.5)))
        assert all(a == answers[0] for a in answers), "the configurations answered differently"
    med = {c: [statistics.median(x[i] for x in results[c]) for i in range(4)] for c in CONFIGS}
    rows = []
    for config in CONFIGS:
        tput, p50, p90, doc50 = med[config]
        stats = engines[config].kv.stats()
        hits = stats.hits_by_medium.get("CPU", 0)
        rows.append(f"| {name} | {pool} | {host_blocks} | {config} | {tput:.1f} | {p50 * 1000:.0f} "
                    f"| {p90 * 1000:.0f} | {doc50 * 1000:.0f} | {tput / med['off'][0]:.2f}x "
                    f"| {p50 / med['off'][1]:.2f}x | {p90 / med['off'][2]:.2f}x | {hits} |")
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_conversation_args(p, turns=6)
    p.add_argument("--doc-tokens", type=int, default=512)
    p.add_argument("--host-share", type=float, default=0.75,
                   help="the host tier's size as a share of the conversations' working set")
    args = p.parse_args(argv)
    if args.host_share <= 0:
        p.error(f"--host-share {args.host_share}: give a share > 0 of the working set")
    print(start_conversations(p, args) + f", a {args.doc_tokens}-token "
          f"one-off document after each turn, concurrency {args.concurrency}, "
          f"{args.rounds} rounds (+1 warm-up)")
    print("| model | pool blocks | host blocks | host eviction | out tok/s | turn TTFT p50 ms "
          "| turn TTFT p90 ms | doc TTFT p50 ms | tok/s vs off | turn p50 vs off "
          "| turn p90 vs off | hit tokens from host |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    for name in args.models.split(","):
        for row in bench_model(name.strip(), args):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
