"""Multi-turn conversations whose working set exceeds the device pool: tiers on vs off.

Each conversation's turn is its whole history (every earlier prompt and answer) plus a new
user message. Closed loop (default): `--concurrency` conversations in flight, a
conversation's next turn sent when its answer is complete. Open loop (`--loop open`): turns
arrive as one seeded Poisson process for all conversations (its k-th arrival is turn
k // conversations of conversation k % conversations), at `--rate` turns/s or at `--load`
times the turns/s that the tiers-off engine served closed-loop in the warm-up round; a turn
due before its previous answer is complete is sent when that answer is ("late", counted).
Throughput is output tokens over the time to the last answer; TTFT counts from the send.
The engines run at most `--concurrency` sequences at once either way. The pool holds about a quarter of the working set
(all histories at their longest), so without tiers a returning conversation's history has
mostly been evicted and is recomputed; with the host tier it is loaded. Same seeded
messages for both, greedy (the answers are checked equal); the configurations take turns
per round, order alternating; medians over rounds of throughput (output tokens/s) and of
each round's TTFT p50 / p90.

On CPU the device pool and the host tier are both DRAM: the host tier stands for what a
GPU gets from host memory.

    python benchmarks/bench_kv_multiturn.py --models bench --threads 1
    python benchmarks/bench_kv_multiturn.py --models bench --threads 1 --loop open --load 0.7
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
                                        open_loop_schedule, quantile, start_conversations)


def _conversation(engine, messages: list[list[list[int]]], concurrency: int, max_tokens: int
                  ) -> tuple[float, int, list[float], list[list[int]]]:
    """Closed loop over the conversations: (seconds, output tokens, TTFTs, histories)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    history: list[list[int]] = [[] for _ in messages]
    turn = [0] * len(messages)
    ready = list(range(len(messages)))
    in_flight: dict[str, int] = {}
    ttfts, out_tokens, n = [], 0, 0
    start = time.perf_counter()
    while ready or in_flight:
        while ready and len(in_flight) < concurrency:
            c = ready.pop(0)
            history[c] = history[c] + messages[c][turn[c]]
            n += 1
            in_flight[f"r{n}"] = c
            engine.add_request(f"r{n}", history[c], params)
        for out in engine.step():
            if not out.finished:
                continue
            c = in_flight.pop(out.request_id)
            ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
            answer = out.outputs[0].token_ids
            out_tokens += len(answer)
            history[c] = history[c] + answer
            turn[c] += 1
            if turn[c] < len(messages[c]):
                ready.append(c)
    return time.perf_counter() - start, out_tokens, ttfts, history


def _open_loop(engine, messages: list[list[list[int]]], arrivals: list[list[float]],
               max_tokens: int) -> tuple[float, int, list[float], list[list[int]], int]:
    """Open loop: turn t of conversation c is sent at arrivals[c][t] seconds (or, "late",
    when its previous answer completes, if that is later: a user answers what they read).
    (seconds to the last answer, output tokens, TTFTs, histories, late turns)."""
    from engine import SamplingParams

    params = SamplingParams(temperature=0.0, max_tokens=max_tokens, ignore_eos=True)
    history: list[list[int]] = [[] for _ in messages]
    turn = [0] * len(messages)
    busy = [False] * len(messages)
    in_flight: dict[str, int] = {}
    ttfts, out_tokens, n, late = [], 0, 0, 0
    start = time.perf_counter()
    while in_flight or any(t < len(m) for t, m in zip(turn, messages)):
        now = time.perf_counter() - start
        for c, m in enumerate(messages):
            if not busy[c] and turn[c] < len(m) and arrivals[c][turn[c]] <= now:
                history[c] = history[c] + m[turn[c]]
                n += 1
                in_flight[f"r{n}"] = c
                busy[c] = True
                engine.add_request(f"r{n}", history[c], params)
        if not engine.has_unfinished_requests():
            due = [arrivals[c][turn[c]] for c, m in enumerate(messages)
                   if not busy[c] and turn[c] < len(m)]
            time.sleep(max(0.0, min(due) - (time.perf_counter() - start)))  # idle till due
            continue
        for out in engine.step():
            if not out.finished:
                continue
            c = in_flight.pop(out.request_id)
            busy[c] = False
            ttfts.append(out.metrics.first_token_time - out.metrics.arrival_time)
            answer = out.outputs[0].token_ids
            out_tokens += len(answer)
            history[c] = history[c] + answer
            turn[c] += 1
            if turn[c] < len(messages[c]) and arrivals[c][turn[c]] < time.perf_counter() - start:
                late += 1
    return time.perf_counter() - start, out_tokens, ttfts, history, late


def bench_model(name: str, args: argparse.Namespace) -> list[str]:
    from engine import LLMEngine

    rng = random.Random(args.seed)
    per_turn = args.user_tokens + args.max_tokens
    longest = args.system_tokens + args.turns * per_turn
    model = model_path(name, longest + 1)
    working_set = args.conversations * longest
    pool = -(-working_set // args.block_size) // 4  # a quarter of the working set
    pool = max(pool, -(-longest // args.block_size) * args.concurrency + 2)
    engines = {}
    for config in ("off", "host"):
        kw = dict(model=model, block_size=args.block_size, max_model_len=longest + 1,
                  num_gpu_blocks_override=pool, dtype="float32",
                  max_num_seqs=args.concurrency, max_num_batched_tokens=max(2048, longest))
        if config == "host":
            kw["kv_offloading_size"] = 4.0  # GiB: more than the working set here
        engines[config] = LLMEngine.from_args(**kw)
    vocab = engines["off"].info.vocab_size
    results: dict[str, list[tuple[float, ...]]] = {"off": [], "host": []}
    rate = args.rate
    for r in range(args.rounds + 1):  # round 0 warms up (closed loop), uncounted
        system = [rng.randrange(10, vocab) for _ in range(args.system_tokens)]
        messages = [[(system if t == 0 else []) + [rng.randrange(10, vocab)
                                                   for _ in range(args.user_tokens)]
                     for t in range(args.turns)] for _ in range(args.conversations)]
        open_loop = args.loop == "open" and r > 0
        if open_loop:  # the same arrival times for both configurations in a round
            arrivals = open_loop_schedule(args.conversations, args.turns, rate,
                                          seed=args.seed * 1000 + r)
        histories = []
        for config in (("off", "host") if r % 2 == 0 else ("host", "off")):
            late = 0
            if open_loop:
                seconds, tokens, ttfts, history, late = _open_loop(
                    engines[config], messages, arrivals, args.max_tokens)
            else:
                seconds, tokens, ttfts, history = _conversation(
                    engines[config], messages, args.concurrency, args.max_tokens)
                if rate is None and config == "off":  # r == 0: tiers off, closed loop
                    rate = args.load * len(ttfts) / seconds
            histories.append(history)
            if r:
                results[config].append((tokens / seconds, quantile(ttfts, 0.5),
                                        quantile(ttfts, 0.9), late / len(ttfts)))
        assert histories[0] == histories[1], "tiers on and off answered differently"
    rows = []
    off = [statistics.median(x[i] for x in results["off"]) for i in range(3)]
    for config in ("off", "host"):
        tput, p50, p90 = (statistics.median(x[i] for x in results[config]) for i in range(3))
        hits = engines[config].kv.stats().hits_by_medium
        rows.append(f"| {name} | {pool} blocks ({working_set / (pool * args.block_size):.1f}x) "
                    f"| {config} | {tput:.1f} | {p50 * 1000:.0f} | {p90 * 1000:.0f} | "
                    f"{tput / off[0]:.2f}x | {p50 / off[1]:.2f}x | {p90 / off[2]:.2f}x | "
                    f"{hits.get('CPU', 0) / max(1, sum(hits.values())):.0%} |"
                    + (f" {rate:.3g} | {statistics.median(x[3] for x in results[config]):.0%} |"
                       if args.loop == "open" else ""))
    return rows


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    add_conversation_args(p, turns=4)
    p.add_argument("--loop", choices=("closed", "open"), default="closed",
                   help="closed: --concurrency conversations in flight; open: turns arrive "
                        "as a Poisson process (see above)")
    p.add_argument("--load", type=float, default=0.7, help="open loop: the arrival rate as "
                   "this fraction of the turns/s that the tiers-off engine served in the "
                   "closed-loop warm-up round")
    p.add_argument("--rate", type=float, default=None, help="open loop: arrivals per second "
                   "(turns/s) instead of --load")
    args = p.parse_args(argv)
    if args.rate is not None and args.rate <= 0:
        p.error(f"--rate {args.rate}: give arrivals per second > 0")
    if args.loop == "open" and args.rate is None and args.load <= 0:
        p.error(f"--load {args.load}: give a fraction > 0 of the closed-loop rate")
    print(start_conversations(p, args) + ", concurrency "
          f"{args.concurrency} (max_num_seqs), {args.loop} loop"
          + ("" if args.loop == "closed" else f" (rate {args.rate} turns/s" if args.rate else
             f" (rate {args.load} x tiers-off turns/s of the closed-loop warm-up round")
          + ("" if args.loop == "closed" else ")")
          + f", {args.rounds} rounds (+1 warm-up)")
    extra = " arrivals/s | late turns |" if args.loop == "open" else ""
    print("| model | pool (working set / pool) | tiers | out tok/s | TTFT p50 ms | TTFT p90 ms "
          "| tok/s vs off | p50 vs off | p90 vs off | hits from host |" + extra)
    print("|---|---|---|---|---|---|---|---|---|---|" + "---|" * extra.count("|"))
    for name in args.models.split(","):
        for row in bench_model(name.strip(), args):
            print(row, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
