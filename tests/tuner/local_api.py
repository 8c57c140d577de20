"""The local API server (localcluster/api) in this process, over HTTP, with the chart's
CRDs: for tests of the tuner's in-cluster calls through the real kubernetes client."""
from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator

import pytest
from kubernetes import client

from localcluster.commands import apply_crds


@pytest.fixture(scope="module")
def api_url() -> Iterator[str]:
    """The local API server on a free port, in a thread of its own, the CRDs applied."""
    import kmock

    from localcluster.api import ApiServer

    started, url = threading.Event(), []
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    async def serve() -> None:
        async with ApiServer() as api, kmock.Server(api) as server:
            url.append(str(server.url).rstrip("/"))
            started.set()
            await stop.wait()

    thread = threading.Thread(target=loop.run_until_complete, args=(serve(),), daemon=True)
    thread.start()
    assert started.wait(30), "the API server did not start"
    try:
        apply_crds(url[0])
        yield url[0]
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(30)


def kube_client(url: str) -> client.ApiClient:
    configuration = client.Configuration()
    configuration.host = url
    return client.ApiClient(configuration)
