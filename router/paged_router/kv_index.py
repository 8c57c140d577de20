"""Where every cached prefix block is: an index fed by the engines' KV events.

`KVIndex` maps a block hash (engine/block_hash.py's `external_hash`) to the backends whose
prefix cache holds it, and counts what each backend lost recently.
`router/paged_router/kv_follower.py` keeps it current from the engines' event streams; both
run in the router's event loop, so the index needs no lock.
"""
from __future__ import annotations

from collections.abc import Iterable, Sequence

from engine.block_hash import event_hash
from engine.kv_event_wire import AllBlocksCleared, BlockRemoved, BlockStored, Event
from engine.kv_medium import Medium


class KVIndex:
    """Block hash -> the backends holding it, and in which tiers (`medium`: GPU, CPU, Disk;
    an event without one is the device's). A backend holds a hash while any of its tiers
    does: the host tier dropping its copy leaves the device's, and the other way round.

    It also counts, per backend, the blocks it lost recently (removed from its last tier),
    decaying by half each time the backends together store as many new blocks as they all
    hold (a clock of the fleet's own work, not of seconds). `demand(url)`, the blocks held
    plus those, is what a backend was asked to keep: a full pool that evicts its tenants in
    turn holds no more blocks than a full one that does not, but its demand is higher."""

    def __init__(self) -> None:
        self.holders: dict[int, dict[str, set[str]]] = {}  # hash -> backend -> its tiers
        self.blocks: dict[str, set[int]] = {}  # backend -> hashes it holds (in any tier)
        self.held_total = 0  # blocks held, summed over backends
        self._age = 0.0  # half-lives passed so far (stores / blocks held at the time)
        self._lost: dict[str, tuple[float, float]] = {}  # url -> (count, _age at last change)

    def store(self, url: str, hashes: Iterable[int], medium: str | None = None) -> None:
        mine = self.blocks.setdefault(url, set())
        new = 0
        for h in hashes:
            self.holders.setdefault(h, {}).setdefault(url, set()).add(medium or Medium.GPU)
            if h not in mine:
                mine.add(h)
                new += 1
        self.held_total += new
        self._age += new / max(self.held_total, 1)

    def evicted(self, url: str) -> float:
        """Blocks this backend lost recently, decayed (see the class)."""
        count, at = self._lost.get(url, (0.0, 0.0))
        return count * 0.5 ** (self._age - at)

    def demand(self, url: str) -> float:
        """Blocks held plus blocks lost recently: the footprint bound's measure."""
        return self.size(url) + self.evicted(url)

    def remove(self, url: str, hashes: Iterable[int], medium: str | None = None) -> None:
        mine, lost = self.blocks.get(url, set()), 0
        for h in hashes:
            by_url = self.holders.get(h)
            tiers = by_url.get(url) if by_url is not None else None
            if tiers is None:
                continue
            tiers.discard(medium or Medium.GPU)
            if tiers:
                continue  # still in another of this backend's tiers
            del by_url[url]
            if not by_url:
                del self.holders[h]
            mine.discard(h)
            lost += 1
        self.held_total -= lost
        if lost:
            self._lost[url] = (self.evicted(url) + lost, self._age)

    def clear(self, url: str) -> None:
        """Forget what this backend holds and lost (a restart, a resync, a snapshot)."""
        for h in self.blocks.get(url, ()):
            by_url = self.holders.get(h)
            if by_url is not None:
                by_url.pop(url, None)
                if not by_url:
                    del self.holders[h]
        self.held_total -= len(self.blocks.get(url, ()))
        self.blocks.get(url, set()).clear()
        self._lost.pop(url, None)

    def drop(self, url: str) -> None:
        self.clear(url)
        self.blocks.pop(url, None)

    def apply(self, url: str, events: Sequence[Event]) -> None:
        for event in events:
            if isinstance(event, BlockStored):
                self.store(url, (event_hash(h) for h in event.block_hashes), event.where)
            elif isinstance(event, BlockRemoved):
                self.remove(url, (event_hash(h) for h in event.block_hashes), event.where)
            elif isinstance(event, AllBlocksCleared):
                self.clear(url)

    def prefix_blocks(self, hashes: Sequence[int], urls: Iterable[str]) -> dict[str, int]:
        """For each backend, how many of the request's leading blocks it holds."""
        held = dict.fromkeys(urls, 0)
        alive = set(held)
        for i, h in enumerate(hashes):
            alive = alive.intersection(self.holders.get(h, ()))
            if not alive:
                break
            for url in alive:
                held[url] = i + 1
        return held

    def leading_media(self, hashes: Sequence[int], held: dict[str, int]
                      ) -> dict[str, tuple[int, int]]:
        """For each backend, of the leading blocks it holds (`held`, from prefix_blocks),
        how many are on its device and how many (of the rest) on its host tier."""
        out = {}
        for url, n in held.items():
            device = host = 0
            for h in hashes[:n]:
                tiers = self.holders[h][url]
                if Medium.GPU in tiers:
                    device += 1
                elif Medium.CPU in tiers:
                    host += 1
            out[url] = (device, host)
        return out

    def size(self, url: str) -> int:
        return len(self.blocks.get(url, ()))
