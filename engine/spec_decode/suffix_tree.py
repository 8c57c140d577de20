"""Suffix decoding's global memory: a depth-limited suffix tree per `cache_salt` over the
outputs of finished requests, the oldest forgotten first (torch-free).

A tree holds, for every cached output and every start position s, the path of its tokens
s .. s + depth - 1 (vLLM's suffix_decoding_max_tree_depth); a node's `count` is how many of
those paths pass through it, so the probability of a continuation t after the path to a
node is child(t).count / node.count. Drafting walks the longest match of the request's last
tokens and then the most frequent children.

Memory: a path that only one occurrence takes below some node is not spelt out as nodes; the
node keeps a `tail`, a reference into that occurrence's token list (tokens at..end, each
with count 1), and turns its first token into a node only when a second occurrence walks
there. So a text no other text repeats costs one node per token, and only substrings seen
twice or more have nodes of their own (at most `depth` nodes per cached token, reached only
by text that repeats itself everywhere). A node is ~72 bytes plus ~200 for a children dict;
benchmarks/bench_spec_decode.py --suffix-memory N measures it after N requests.

Adding and forgetting outputs never blocks a step: `SuffixCache.add` only queues the
request, and `work()` (called by the proposer once per draft) inserts or removes a bounded
number of its suffixes, O(depth) each, with more per call while a backlog builds up: a
request of n tokens costs O(n * depth) in all, spread over later calls.
"""
from __future__ import annotations

from collections import deque


class _Node:
    __slots__ = ("count", "children", "tail", "at", "end")

    def __init__(self, count: int) -> None:
        self.count = count
        self.children: dict[int, _Node] | None = None
        self.tail: list[int] | None = None  # tail[at:end]: a chain of count-1 nodes below
        # `at` and `end` are set with a tail and read only while there is one


class SuffixTree:
    def __init__(self, max_depth: int) -> None:
        assert max_depth >= 1
        self.max_depth = max_depth
        self.root = _Node(0)
        self.num_nodes = 1  # nodes spelt out (tails not counted)

    def add(self, tokens: list[int], start: int) -> None:
        """Insert the path tokens[start : start + max_depth]."""
        end = min(len(tokens), start + self.max_depth)
        node = self.root
        node.count += 1
        for i in range(start, end):
            if node.tail is not None:
                self._expand(node)
            if node.children is None:
                node.children = {}
            child = node.children.get(tokens[i])
            if child is None:
                child = node.children[tokens[i]] = _Node(1)
                self.num_nodes += 1
                if i + 1 < end:
                    child.tail, child.at, child.end = tokens, i + 1, end
                return
            child.count += 1
            node = child

    def remove(self, tokens: list[int], start: int) -> None:
        """Take out a path added before (the same tokens and start)."""
        end = min(len(tokens), start + self.max_depth)
        node = self.root
        node.count -= 1
        for i in range(start, end):
            if node.tail is not None:  # the one occurrence below node is this one
                node.tail = None
                return
            child = node.children[tokens[i]]
            child.count -= 1
            if child.count == 0:
                del node.children[tokens[i]]
                if not node.children:
                    node.children = None
                self.num_nodes -= self._size(child)
                return
            node = child

    def _expand(self, node: _Node) -> None:
        """Spell out the first token of node's tail as a node of its own."""
        tokens, at, end = node.tail, node.at, node.end
        child = _Node(1)
        if at + 1 < end:
            child.tail, child.at, child.end = tokens, at + 1, end
        node.children, node.tail = {tokens[at]: child}, None
        self.num_nodes += 1

    @staticmethod
    def _size(node: _Node) -> int:
        """Nodes in a subtree whose root's count just fell to 0 (a chain: one path)."""
        size = 1
        while node.children:
            node = next(iter(node.children.values()))
            size += 1
        return size

    def _walk(self, pattern: list[int]) -> tuple[_Node, int] | None:
        """Where the path `pattern` ends: (node, tail tokens of node's tail consumed)."""
        node, used = self.root, 0
        for t in pattern:
            if node.tail is not None:
                if node.at + used < node.end and node.tail[node.at + used] == t:
                    used += 1
                    continue
                return None
            child = node.children.get(t) if node.children else None
            if child is None:
                return None
            node, used = child, 0
        return node, used

    def longest_match(self, context: list[int]) -> int:
        """Longest m <= max_depth with context[-m:] a path (0: none). A path's suffixes are
        paths too, so presence falls monotonically with m: binary search."""
        lo, hi = 0, min(len(context), self.max_depth)
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._walk(context[len(context) - mid:]) is not None:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def continuation(self, pattern: list[int], limit: int, min_prob: float
                     ) -> tuple[list[int], float, list[tuple[float, int]]]:
        """The most frequent continuation of path `pattern`: up to `limit` tokens while the
        estimated probability of the whole draft so far stays >= min_prob; with its score,
        the sum of those probabilities (the expected number of tokens accepted), and per
        token the evidence behind it: (count(child) / count(node), count(node))."""
        where = self._walk(pattern)
        if where is None:
            return [], 0.0, []
        node, used = where
        out: list[int] = []
        evidence: list[tuple[float, int]] = []
        prob, score = 1.0, 0.0
        while len(out) < limit:
            if node.tail is not None:
                if node.at + used >= node.end:
                    break
                ratio, support = (1.0 / node.count, node.count) if used == 0 else (1.0, 1)
                token = node.tail[node.at + used]
                used += 1
            elif node.children:
                # most frequent child; among equals the smallest token (deterministic)
                token, child = max(node.children.items(), key=lambda kv: (kv[1].count, -kv[0]))
                ratio, support = child.count / node.count, node.count
                node, used = child, 0
            else:
                break
            prob *= ratio
            if prob < min_prob:
                break
            out.append(token)
            evidence.append((ratio, support))
            score += prob
        return out, score, evidence

    def counts(self) -> dict[tuple[int, ...], int]:
        """Every path and its count, tails spelt out (for tests and inspection)."""
        out: dict[tuple[int, ...], int] = {}
        stack = [((), self.root)]
        while stack:
            path, node = stack.pop()
            if path:
                out[path] = node.count
            if node.tail is not None:
                for i in range(node.at, node.end):
                    path = path + (node.tail[i],)
                    out[path] = 1
            for t, child in (node.children or {}).items():
                stack.append((path + (t,), child))
        return out


class SuffixCache:
    """The global trees, one per cache_salt (None is one tenant too: requests without a
    salt), and the FIFO that bounds how many finished requests they hold."""

    WORK_PER_CALL = 32  # suffixes inserted or removed per work() call, plus backlog / 16

    def __init__(self, max_depth: int, max_cached_requests: int) -> None:
        self.max_depth = max_depth
        self.max_cached_requests = max_cached_requests
        self.trees: dict[str | None, SuffixTree] = {}
        self.cached: deque[tuple[str | None, list[int]]] = deque()  # oldest first
        self._jobs: deque[list] = deque()  # [adding, salt, tokens, next start]
        self.backlog = 0  # suffixes queued, not yet inserted or removed

    def add(self, salt: str | None, tokens: list[int]) -> None:
        """Queue a finished request's output; forget the oldest beyond the limit. O(1)
        besides copying the tokens."""
        if not tokens or self.max_cached_requests == 0:
            return
        tokens = list(tokens)
        self.cached.append((salt, tokens))
        self._queue(True, salt, tokens)
        if len(self.cached) > self.max_cached_requests:
            self._queue(False, *self.cached.popleft())

    def _queue(self, adding: bool, salt: str | None, tokens: list[int]) -> None:
        self._jobs.append([adding, salt, tokens, 0])
        self.backlog += len(tokens)

    def work(self, budget: int | None = None) -> None:
        """Insert or remove up to `budget` queued suffixes, in the order queued."""
        budget = self.WORK_PER_CALL + self.backlog // 16 if budget is None else budget
        while budget > 0 and self._jobs:
            job = self._jobs[0]
            adding, salt, tokens, start = job
            tree = self.trees.get(salt)
            if tree is None:
                tree = self.trees[salt] = SuffixTree(self.max_depth)
            stop = min(len(tokens), start + budget)
            step = tree.add if adding else tree.remove
            for s in range(start, stop):
                step(tokens, s)
            budget -= stop - start
            self.backlog -= stop - start
            job[3] = stop
            if stop == len(tokens):
                self._jobs.popleft()
                if tree.root.count == 0:
                    del self.trees[salt]

    def flush(self) -> None:
        self.work(self.backlog)

    @property
    def num_nodes(self) -> int:
        return sum(t.num_nodes for t in self.trees.values())

    @property
    def num_cached_tokens(self) -> int:
        return sum(len(tokens) for _, tokens in self.cached)
