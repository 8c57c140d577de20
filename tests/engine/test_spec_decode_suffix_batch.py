"""Suffix decoding in a mixed batch: salted and unsalted requests, n = 2 samples and rows too
short to draft share steps; greedy output equals the engine's without speculation, over two
rounds (the second drafts from the first's outputs), and every draft a salted request got is
text of its own tokens or of earlier outputs of its own salt."""
from __future__ import annotations

import pytest

from engine import LLM, SamplingParams
from test_spec_decode import _prompts, _record_steps

SUFFIX = {"method": "suffix", "num_speculative_tokens": 4, "suffix_decoding_max_tree_depth": 12,
          "suffix_decoding_min_token_prob": 0.0}
SALTS = ["tenant-a", "tenant-b", None]


def _contains(text: list[int], part: list[int]) -> bool:
    n = len(part)
    return any(text[i:i + n] == part for i in range(len(text) - n + 1))


@pytest.fixture(scope="module")
def batch(tiny_checkpoints):
    """Each salt its own prompts (the tokens of different texts); every third request with
    n = 2, every fifth one token long (no room for drafts)."""
    tok = LLM(model=tiny_checkpoints["qwen2"], num_gpu_blocks_override=64,
              dtype="float32").get_tokenizer()
    texts = _prompts()
    prompts, params = [], []
    for i, text in enumerate(texts[:9]):
        prompts.append({"prompt_token_ids": tok(text).input_ids, "cache_salt": SALTS[i % 3]})
        params.append(SamplingParams(temperature=0.0, max_tokens=1 if i % 5 == 4 else 24,
                                     n=2 if i % 3 == 1 else 1))
    return prompts, params


def _outputs(outs) -> list[list[list[int]]]:
    return [[c.token_ids for c in o.outputs] for o in outs]


def test_mixed_batch_matches_the_engine_without_speculation_and_salts_stay_apart(
        tiny_checkpoints, batch):
    prompts, params = batch
    kwargs = dict(model=tiny_checkpoints["qwen2"], num_gpu_blocks_override=256,
                  max_model_len=256, dtype="float32", block_size=4)
    plain = LLM(**kwargs)
    expected = [_outputs(plain.generate(prompts, params)) for _ in range(2)]
    assert expected[0] == expected[1]

    llm = LLM(speculative_config=SUFFIX, **kwargs)
    shapes = _record_steps(llm)
    proposer = llm.llm_engine.scheduler.proposer
    finished: dict[str | None, list[list[int]]] = {s: [] for s in SALTS}
    drafts: list[tuple[str | None, list[int], list[int]]] = []
    draft, done = proposer.draft, proposer.finished

    def recording_draft(seq, room, batch_size):
        out = draft(seq, room, batch_size)
        if out:
            sources = [list(seq.token_ids)] + [list(t) for t in finished[seq.cache_salt]]
            drafts.append((seq.cache_salt, out, sources))
        return out

    def recording_finished(seq):
        finished[seq.cache_salt].append(list(seq.output_token_ids))
        done(seq)

    proposer.draft, proposer.finished = recording_draft, recording_finished
    for round_ in range(2):
        assert _outputs(llm.generate(prompts, params)) == expected[round_], round_
    stats = llm.llm_engine.get_stats()
    assert stats.spec_num_accepted_tokens > 0
    assert any(spec and plain_rows for spec, plain_rows, _ in shapes), "rows with and without"
    # the trees hold each salt's outputs only: as many tokens as that salt's samples wrote
    proposer.cache.flush()
    for salt in SALTS:
        assert proposer.cache.trees[salt].root.count == sum(map(len, finished[salt])), salt
    # every draft is text its own request or its own salt's earlier outputs hold, and some
    # came from those outputs (the second round)
    from_outputs = 0
    for salt, out, sources in drafts:
        assert any(_contains(src, out) for src in sources), (salt, out)
        from_outputs += not _contains(sources[0], out)
    assert from_outputs > 0
