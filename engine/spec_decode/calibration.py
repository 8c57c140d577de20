"""How likely each token of a suffix draft is to be accepted, learnt from the drafts verified
so far (torch-free; DraftGate keeps one per proposer when adaptive_draft_knee is set).

A suffix draft estimates its tokens' probabilities from counts (count(child) / count(node)),
which is right about the text it has seen and wrong about the model: a continuation seen
once has "probability 1" however often the model then writes something else. What the
verifier did with earlier drafts says how far to trust each kind of evidence. Every drafted
token gets a key:

- where the draft came from (the service's shared tree, or the request's own tokens),
- how long a match it continues (1, 2, 3-4, 5-8, 9-16, more),
- its count ratio (1, at least 1/2, less) and the count of the node it follows (1, 2-3,
  more): the evidence behind it,
- its position in the draft (1, 2, later).

Per key, decayed counts of the times a token of that key was verified (every token before
it accepted) and accepted. The estimate of P(accepted | the ones before were) backs off
through three levels, each shrunk toward the next by `STRENGTH` pseudo-observations: the
key, the key without its evidence (source, match, position), and a prior, `PRIOR`.
"""
from __future__ import annotations

PRIOR = 0.8  # what a draft token is trusted with before anything was verified
STRENGTH = 4.0  # pseudo-observations of the coarser level in each estimate
CAP = 512.0  # verified counts beyond this halve (the recent past weighs more)

Key = tuple[int, int, int, int, int]  # source, match, ratio, support, position buckets


def _bucket(value: float, bounds: tuple[float, ...]) -> int:
    return next((i for i, b in enumerate(bounds) if value <= b), len(bounds))


def draft_keys(evidence: list[tuple[float, int]], match: int, shared: bool) -> list[Key]:
    """The key of each token of a draft from its per-token (count ratio, node count)."""
    m = _bucket(match, (1, 2, 4, 8, 16))
    return [(int(shared), m, 2 if ratio >= 1.0 else int(ratio >= 0.5),
             _bucket(support, (1, 3)), min(i, 2))
            for i, (ratio, support) in enumerate(evidence)]


class DraftCalibration:
    def __init__(self) -> None:
        # key -> [accepted, verified], at two levels: the whole key and its coarse part
        self._fine: dict[Key, list[float]] = {}
        self._coarse: dict[tuple[int, int, int], list[float]] = {}

    @staticmethod
    def _coarse_key(key: Key) -> tuple[int, int, int]:
        return key[0], key[1], key[4]

    def probability(self, key: Key) -> float:
        """P(a token of `key` is accepted | every token before it in the draft was)."""
        acc, ver = self._coarse.get(self._coarse_key(key), (0.0, 0.0))
        coarse = (acc + STRENGTH * PRIOR) / (ver + STRENGTH)
        acc, ver = self._fine.get(key, (0.0, 0.0))
        return (acc + STRENGTH * coarse) / (ver + STRENGTH)

    def cumulative(self, keys: list[Key]) -> list[float]:
        """P(the first i + 1 tokens all accepted), i = 0 .. len(keys) - 1."""
        out, p = [], 1.0
        for key in keys:
            p *= self.probability(key)
            out.append(p)
        return out

    def observe(self, keys: list[Key], accepted: int) -> None:
        """A draft of these keys was verified and its first `accepted` tokens accepted: those
        count as accepted, the next (if any) as rejected, the rest were never verified."""
        for i, key in enumerate(keys[:accepted + 1]):
            for table, k in ((self._fine, key), (self._coarse, self._coarse_key(key))):
                row = table.setdefault(k, [0.0, 0.0])
                row[0] += i < accepted
                row[1] += 1.0
                if row[1] > CAP:
                    row[0] *= 0.5
                    row[1] *= 0.5
