"""What the scheduler asks of a speculative proposer, and the one place that builds one.

The scheduler holds a `Proposer`; it never knows which method drafts. A method is a class
with `from_config(speculative_config)` and the two calls below, registered by its
`method` name in `METHODS` (module:class, imported on first use so that a method's
dependencies load only when it is chosen). A new method (a draft model, say) is a new
class and one line here; the scheduler and the engine do not change.
"""
from __future__ import annotations

import importlib
from typing import Protocol, runtime_checkable

from engine.sequence import Sequence


@runtime_checkable
class Proposer(Protocol):
    num_speculative_tokens: int  # most drafts one sequence verifies in one step

    def draft(self, seq: Sequence, room: int, batch_size: int) -> list[int]:
        """Drafts to verify after running decode `seq`'s last token in this step: at most
        `room` (the scheduler's budget, max_tokens and max_model_len already applied), in
        a step with `batch_size` running sequences. [] when it has nothing to offer."""
        ...

    def finished(self, seq: Sequence) -> None:
        """`seq` left the engine (finished, aborted): what the proposer kept of it may go,
        or be learnt from. Called once per sequence; must not block a step."""
        ...


# method -> "module:Class"; the settings table's `method` choices name the same keys
METHODS: dict[str, str] = {
    "ngram": "engine.spec_decode.ngram_proposer:NgramProposer",
    "suffix": "engine.spec_decode.suffix_proposer:SuffixProposer",
}


def make_proposer(config: dict | None) -> Proposer | None:
    """The proposer for a checked EngineConfig.speculative_config (None: speculation off)."""
    if not config:
        return None
    method = config.get("method", "ngram")
    if method not in METHODS:
        raise ValueError(f"speculative_config.method must be one of {', '.join(METHODS)}, "
                         f"got {method!r}")
    module, _, name = METHODS[method].partition(":")
    proposer = getattr(importlib.import_module(module), name).from_config(config)
    assert isinstance(proposer, Proposer), f"{METHODS[method]} is not a Proposer"
    return proposer
