"""What bench_kv_offload.py and bench_kv_multiturn.py share: the model a name stands for (the
bench model at the context length asked for), quantiles, and the open-loop arrival schedule.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

BENCH_POSITIONS = 2048  # the bench model's max_position_embeddings (bench_offline.py)


def model_path(name: str, max_len: int = BENCH_POSITIONS) -> str:
    """A checkpoint for `name` whose context holds `max_len` tokens.

    "bench" is bench_offline.py's ~23M random-weight Llama. Its config allows 2,048
    positions; for a longer `max_len` the same model (same seed, so the same weights:
    a Llama has no learned position table, only RoPE) is written once more with
    max_position_embeddings raised to the next multiple of 2,048. Any other name
    (a checkpoint dir or builtin://NAME) is used as it is, after checking that its
    config allows `max_len`.
    """
    from engine.builtin_models import model_cache_root

    if name == "bench":
        if max_len <= BENCH_POSITIONS:
            from benchmarks.bench_offline import build_bench_model

            return str(build_bench_model(model_cache_root()))
        from engine.builtin_models import build_once
        from engine.default_model import build_checkpoint

        positions = -(-max_len // BENCH_POSITIONS) * BENCH_POSITIONS
        # the arguments of bench_offline.build_bench_model, but for the positions
        return str(build_once(model_cache_root() / f"bench-llama-23m-pos{positions}-v1",
                              lambda tmp: build_checkpoint(
                                  tmp, hidden_size=512, num_layers=8, num_heads=8,
                                  num_kv_heads=4, intermediate_size=1376,
                                  max_position_embeddings=positions, seed=0)))
    from engine.builtin_models import ensure_builtin, is_builtin

    path = str(ensure_builtin(name)) if is_builtin(name) else name
    allowed = max_positions(path)
    if allowed is not None and max_len > allowed:
        raise ValueError(f"{name}: the longest request, {max_len} tokens, exceeds its "
                         f"max_position_embeddings={allowed}; ask for at least "
                         f"{max_len - allowed} fewer tokens (--prefix, or the turns' sizes)")
    return path


def max_positions(path: str) -> int | None:
    """max_position_embeddings from a checkpoint dir's config.json (None if not there)."""
    config = Path(path) / "config.json"
    if not config.is_file():
        return None
    data = json.loads(config.read_text())
    data = data.get("text_config", data)
    return data.get("max_position_embeddings")


def quantile(values: list[float], q: float) -> float:
    """The q-quantile as the value at rank floor(q * n) of the sorted values."""
    if not values:
        raise ValueError("quantile of no values")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def open_loop_schedule(conversations: int, turns: int, rate: float, seed: int
                       ) -> list[list[float]]:
    """When each turn is due, in seconds from the start: arrivals[c][t].

    One Poisson process of `rate` turns per second (exponential gaps, seeded) for all
    conversations together; its k-th arrival is turn k // conversations of conversation
    k % conversations, so every conversation's turns come in order, `conversations`
    arrivals apart (on average conversations / rate seconds).
    """
    if rate <= 0:
        raise ValueError(f"the open-loop rate must be > 0 turns/s, got {rate}")
    if conversations < 1 or turns < 1:
        raise ValueError("need at least one conversation and one turn")
    rng = random.Random(seed)
    arrivals = [[0.0] * turns for _ in range(conversations)]
    now = 0.0
    for k in range(conversations * turns):
        now += rng.expovariate(rate)
        arrivals[k % conversations][k // conversations] = now
    return arrivals


def add_conversation_args(p, turns: int) -> None:
    """The arguments of the multi-turn benchmarks (bench_kv_multiturn.py,
    bench_kv_eviction.py): models, conversations and their shape, rounds, threads."""
    p.add_argument("--models", default="bench")
    p.add_argument("--conversations", type=int, default=8)
    p.add_argument("--turns", type=int, default=turns)
    p.add_argument("--concurrency", type=int, default=2)
    p.add_argument("--system-tokens", type=int, default=256)
    p.add_argument("--user-tokens", type=int, default=96)
    p.add_argument("--max-tokens", type=int, default=16)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None)


def start_conversations(p, args) -> str:
    """Refuses --rounds below 1, applies --threads; returns the header's opening: torch,
    threads, dtype and device, then the conversations' shape."""
    if args.rounds < 1:
        p.error(f"--rounds {args.rounds}: give at least 1 (medians over counted rounds)")
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    return (f"torch {torch.__version__}, {torch.get_num_threads()} threads, float32, CPU; "
            f"{args.conversations} conversations x {args.turns} turns")
