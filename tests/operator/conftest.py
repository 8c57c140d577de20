"""Fixtures: an emulated API server (kmock) and the real operator running against it."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import kmock
import pytest
import pytest_asyncio
from operator_harness import RESOURCES, Cluster, Operator


@pytest_asyncio.fixture()
async def cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with Cluster() as emulator, kmock.Server(emulator) as server:
        for resource, info in RESOURCES.items():
            emulator.declare(resource, **info)
        kubeconfig = tmp_path / "kubeconfig"
        kubeconfig.write_text(
            "apiVersion: v1\nkind: Config\ncurrent-context: test\n"
            f"clusters: [{{name: test, cluster: {{server: '{server.url}'}}}}]\n"
            "users: [{name: test, user: {token: test-token}}]\n"
            "contexts: [{name: test, context: {cluster: test, user: test}}]\n")
        monkeypatch.setenv("KUBECONFIG", str(kubeconfig))
        monkeypatch.setenv("PAGED_OPERATOR_RESYNC_SECONDS", "0.3")
        monkeypatch.setenv("PAGED_OPERATOR_DISCOVERY_TTL_SECONDS", "0.2")
        emulator.client = server.client  # an HTTP client for the test's own API calls
        yield emulator


@pytest_asyncio.fixture()
async def operator(cluster: Cluster) -> AsyncIterator[Operator]:
    op = Operator()
    await op.start()
    try:
        yield op
    finally:
        await op.stop()
