"""The suffix-decoding tree's memory after many requests (bench_spec_decode.py
--suffix-memory N): N finished requests of the agentic workload go into one SuffixCache
(vLLM's defaults: depth 24, 10,000 cached requests), and the table gives what tracemalloc
counts the cache holding at checkpoints: the cached requests and tokens, the nodes spelt
out, MiB and bytes per cached token.

A request's output is what an agent writes (loadtests/workloads/agentic.py): its tool call
in the Hermes scaffolding, `<tool_call>{"name": ..., "arguments": ...}</tool_call>`, with
the session's seeded arguments, then a final answer of 48-128 words every few calls,
tokenized by the model's tokenizer (scaffolding repeats; arguments and answers vary).
Beyond 10,000 requests the FIFO forgets the oldest, so the figure levels off there.
"""
from __future__ import annotations

import random
import time
import tracemalloc


def outputs(tokenizer, count: int, seed: int = 0):
    """`count` agentic outputs as token ids: tool calls, a final answer after 2-5 calls."""
    from loadtests.workloads.agentic import ANSWER_TOKENS, STEPS, _seeded_call, call_text
    from loadtests.workloads.base import words

    rng = random.Random(seed)
    calls_left = rng.randint(*STEPS)
    for _ in range(count):
        if calls_left:
            text, calls_left = call_text(_seeded_call(rng)), calls_left - 1
        else:
            text, calls_left = words(rng, rng.randint(*ANSWER_TOKENS)), rng.randint(*STEPS)
        yield tokenizer.encode(text, add_special_tokens=False)


def run(tokenizer, requests: int, checkpoints: tuple[int, ...] = (1_000, 5_000, 10_000),
        max_cached: int = 10_000) -> None:
    from engine.spec_decode.suffix_tree import SuffixCache

    marks = sorted({c for c in checkpoints if c < requests} | {requests})
    print(f"# suffix tree memory: {requests} agentic outputs, depth 24, at most {max_cached} "
          "requests cached (tracemalloc)")
    print("| requests added | cached requests | cached tokens | nodes | MiB | bytes per "
          "cached token | s elapsed, tokenizing included |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    cache = SuffixCache(max_depth=24, max_cached_requests=max_cached)
    added, start = 0, time.perf_counter()
    for tokens in outputs(tokenizer, requests):
        cache.add(None, tokens)
        cache.work()  # what each draft call does: a bounded slice of the queue
        added += 1
        if added in marks:
            cache.flush()
            used = tracemalloc.get_traced_memory()[0] - base
            tokens_cached = cache.num_cached_tokens
            print(f"| {added} | {len(cache.cached)} | {tokens_cached} | {cache.num_nodes} | "
                  f"{used / 2**20:.1f} | {used / tokens_cached:.0f} | "
                  f"{time.perf_counter() - start:.1f} |", flush=True)
    tracemalloc.stop()
