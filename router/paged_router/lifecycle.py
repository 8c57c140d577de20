"""The router's start and stop (Starlette's lifespan): the forwarder, the EndpointSlice
watcher (--discover), the pool's health checks and (precise) the KV-event follower, stopped
in the reverse order."""
from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING

from starlette.applications import Starlette

from paged_router.engine_tokenizer import EngineTokenizer
from paged_router.proxy import Forwarder
from paged_router.wiring import Router

if TYPE_CHECKING:
    from paged_router.discovery import EndpointSliceWatcher


async def follow_backends(router: Router) -> None:
    """The index follows exactly the backends the pool offers now."""
    follower, pool, hasher = router.follower, router.pool, router.hasher
    assert follower is not None
    while True:
        follower.track(b.url for b in pool.available())
        if isinstance(hasher, EngineTokenizer) and not hasher.ready and pool.available():
            await hasher.fetch(b.url for b in pool.available())
        await asyncio.sleep(0.1)


async def start_watcher(router: Router) -> EndpointSliceWatcher | None:
    """--discover: the EndpointSlices' ready pods become the pool's backends."""
    config, follower = router.config, router.follower
    if not config.discover:
        return None
    from paged_router.discovery import EndpointSliceWatcher  # the kubernetes client: only here

    # precise: the slices' kv-events / kv-replay ports are each engine's event
    # endpoints, kept in the follower's own table (GET /kv_events otherwise)
    watcher = EndpointSliceWatcher(
        config.discover, router.pool, namespace=config.namespace, port_name=config.port_name,
        kv_events_endpoints=None if follower is None else follower.static)
    await watcher.start()
    return watcher


@contextlib.asynccontextmanager
async def lifespan(app: Starlette) -> AsyncIterator[None]:
    router: Router = app.state.router
    config, pool, follower = router.config, router.pool, router.follower
    forwarder = app.state.forwarder = Forwarder(pool, router.policy, router.hasher,
                                                router.metrics,
                                                connect_timeout=config.connect_timeout,
                                                hold_seconds=config.hold_seconds,
                                                max_held=config.max_held)
    watcher = await start_watcher(router)
    await pool.start()
    if follower is not None:
        follower.track(b.url for b in pool.available())  # before /health can answer
    following = asyncio.create_task(follow_backends(router)) if follower else None
    try:
        yield
    finally:
        if following is not None:
            following.cancel()
            await follower.stop()
        await pool.stop()
        if watcher is not None:
            await watcher.stop()
        await forwarder.aclose()
