"""Consistent hashing with virtual nodes: a key's walk around the ring.

Adding or removing one backend moves only the keys whose nearest point it owned, so the
prefixes cached on the other replicas keep landing where they are cached.
"""
from __future__ import annotations

import bisect
from collections.abc import Iterable

from paged_router.hashing import ring_point


class HashRing:
    def __init__(self, nodes: Iterable[str] = (), replicas: int = 100) -> None:
        self.replicas = replicas
        self._points: list[int] = []
        self._owners: list[str] = []
        self._nodes: frozenset[str] = frozenset()
        self.set_nodes(nodes)

    @property
    def nodes(self) -> frozenset[str]:
        return self._nodes

    def set_nodes(self, nodes: Iterable[str]) -> None:
        nodes = frozenset(nodes)
        if nodes == self._nodes:
            return
        pairs = sorted((ring_point(f"{node}#{i}"), node) for node in nodes
                       for i in range(self.replicas))
        self._points = [p for p, _ in pairs]
        self._owners = [n for _, n in pairs]
        self._nodes = nodes

    def walk(self, key: int) -> list[str]:
        """Every node once, in ring order from the first point at or after `key`."""
        if not self._points:
            return []
        start = bisect.bisect_left(self._points, key % (1 << 64))
        seen: list[str] = []
        total = len(self._points)
        for i in range(total):
            owner = self._owners[(start + i) % total]
            if owner not in seen:
                seen.append(owner)
                if len(seen) == len(self._nodes):
                    break
        return seen
