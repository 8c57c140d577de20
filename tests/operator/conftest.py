"""Fixtures: an emulated API server (kmock) and the real operator running against it."""
from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest
import pytest_asyncio
from operator_harness import Cluster, Operator, emulated


@pytest_asyncio.fixture()
async def cluster(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> AsyncIterator[Cluster]:
    async with emulated(Cluster, tmp_path, monkeypatch) as emulator:
        yield emulator


@pytest_asyncio.fixture()
async def operator(cluster: Cluster) -> AsyncIterator[Operator]:
    op = Operator()
    await op.start()
    try:
        yield op
    finally:
        await op.stop()
