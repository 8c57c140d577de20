"""The router's parts, built once from its config: the metrics, the policy, the request
hasher, the backend pool and (policy `precise`) the follower of the engines' KV events.
app.py serves them, lifecycle.py starts and stops them, routes.py answers with them."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field

from paged_router.engine_tokenizer import EngineTokenizer
from paged_router.hashing import CharChunkHasher, EngineBlockHasher, TokenBlockHasher
from paged_router.kv_follower import KVEventFollower
from paged_router.metrics import RouterMetrics
from paged_router.policies import Policy, PrecisePolicy, make_policy
from paged_router.pool import BackendPool, normalize_url

logger = logging.getLogger("paged_router")

Hasher = CharChunkHasher | TokenBlockHasher | EngineTokenizer


@dataclass
class RouterConfig:
    backends: list[str] = field(default_factory=list)
    discover: str | None = None          # the engine Service whose EndpointSlices to watch
    namespace: str | None = None
    port_name: str | None = None
    policy: str = "prefix"
    load_factor: float = 0.25
    hit_load_factor: float | None = None  # None: per policy (policies.make_policy)
    cache_balance: float | None | str = "default"  # per policy: policies.CACHE_BALANCE
    chunk_chars: int = 128
    max_chunks: int = 256
    table_size: int = 200_000
    tokenizer: str | None = None
    hash_block_size: int = 16
    # precise policy: backend URL -> (PUB, replay) endpoints; the others ask GET /kv_events
    kv_events_endpoints: dict[str, tuple[str, str | None]] = field(default_factory=dict)
    health_interval: float = 1.0
    connect_timeout: float = 2.0
    api_key: str | None = None
    hold_seconds: float = 0.0            # --cold-start-hold
    max_held: int = 64                   # --cold-start-queue

    def __post_init__(self) -> None:
        if bool(self.backends) == bool(self.discover):
            raise ValueError("give exactly one of --backends URL[,URL...] or --discover SERVICE")


@dataclass
class Router:
    """What one router process holds; `follower` only with the precise policy."""
    config: RouterConfig
    metrics: RouterMetrics
    policy: Policy
    hasher: Hasher
    pool: BackendPool
    follower: KVEventFollower | None = None


def wire(config: RouterConfig) -> Router:
    """The parts, unstarted (lifecycle.lifespan starts them). Raises ValueError on a bad
    setting (the CLI prints it)."""
    metrics = RouterMetrics()
    policy = make_policy(config.policy, load_factor=config.load_factor,
                         hit_load_factor=config.hit_load_factor,
                         cache_balance=config.cache_balance,
                         table_size=config.table_size)
    hasher: Hasher = (
        TokenBlockHasher(config.tokenizer, config.hash_block_size, config.max_chunks)
        if config.tokenizer else CharChunkHasher(config.chunk_chars, config.max_chunks))
    pool = BackendPool(metrics, health_interval=config.health_interval,
                       scrape=config.policy == "least-load")
    pool.set_urls(config.backends)
    router = Router(config, metrics, policy, hasher, pool)
    if isinstance(policy, PrecisePolicy):
        _follow_kv_events(router, policy)
    return router


def _follow_kv_events(router: Router, policy: PrecisePolicy) -> None:
    """Precise: the engines' own block hashes (their tokenizer, GET /tokenizer, unless
    --tokenizer names one) and a follower that keeps the policy's index."""
    config = router.config
    hasher: EngineBlockHasher | EngineTokenizer = (
        EngineBlockHasher(config.tokenizer, config.hash_block_size, config.max_chunks)
        if config.tokenizer else EngineTokenizer(config.hash_block_size, config.max_chunks))
    router.hasher = hasher

    def on_block_size(url: str, size: int) -> None:
        if size != hasher.block_size:
            logger.warning("%s caches blocks of %d tokens, not %d: hashing with %d",
                           url, size, hasher.block_size, size)
            hasher.block_size = size

    router.follower = KVEventFollower(policy.index, metrics=router.metrics,
                                      on_block_size=on_block_size,
                                      endpoints={normalize_url(u): e for u, e in
                                                 config.kv_events_endpoints.items()})
