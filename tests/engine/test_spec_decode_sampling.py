"""Speculative decoding keeps the target distribution: the verifier's draws against the
definition (chi-square on a small vocabulary), seeded requests token-for-token equal to
decoding without speculation, and stops, EOS and max_tokens inside accepted runs."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from engine import LLM, SamplingParams
from engine.sampler import Sampler
from engine.sequence import Sequence
from engine.spec_decode.verifier import verify

CPU = torch.device("cpu")
SPEC = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_max": 3,
        "prompt_lookup_min": 1}


# ---- the verifier against the definition ---------------------------------------------------

def _target(logits: torch.Tensor, temperature: float, top_k: int) -> torch.Tensor:
    """p = softmax(logits / T) over the top_k tokens, renormalised (the definition)."""
    scaled = logits / temperature
    kth = scaled.sort(descending=True).values[top_k - 1]
    return torch.softmax(scaled.masked_fill(scaled < kth, float("-inf")), dim=-1)


def _counts(tokens: list[int], vocab: int) -> torch.Tensor:
    return torch.bincount(torch.tensor(tokens, dtype=torch.int64), minlength=vocab).double()


def _assert_follows(tokens: list[int], p: torch.Tensor) -> None:
    """Pearson's chi-square test of the counts against p (p-value from the chi-square
    survival function, the regularised upper incomplete gamma)."""
    observed = _counts(tokens, p.numel())
    support = p > 0
    assert observed[~support].sum() == 0, "drew a token the target excludes"
    q = p[support].double()
    expected = q / q.sum() * len(tokens)
    statistic = ((observed[support] - expected) ** 2 / expected).sum()
    df = torch.tensor(float(int(support.sum()) - 1), dtype=torch.float64)
    pvalue = float(torch.special.gammaincc(df / 2, statistic / 2))
    assert pvalue > 1e-3, (observed, expected, pvalue)


def test_drafts_are_accepted_with_the_target_probability_and_corrected_from_the_residual():
    """Rows of 2 drafts over a 6-token vocabulary, temperature 0.8, top_k 5, and a presence
    penalty (so the second position's target depends on the first draft being generated):
    the first token out follows p_0 whether or not d_0 was accepted, acceptance happens with
    p_0(d_0), a rejection's token follows the residual (p_0 without d_0, renormalised) and
    after acceptance the next token follows p_1 computed on the draft's history."""
    vocab, rows = 6, 6000
    pos_logits = torch.tensor([[1.0, 0.2, 0.9, -0.5, 0.0, -2.0],
                               [0.1, 1.2, 0.8, 0.3, -1.0, 0.5],
                               [0.0, 0.0, 0.0, 0.0, 0.0, 0.0]])
    drafts = [2, 1]
    params = SamplingParams(temperature=0.8, top_k=5, presence_penalty=0.7)
    seqs = [Sequence(request_id=str(i), token_ids=[4, 5, 3], num_prompt_tokens=2, params=params)
            for i in range(rows)]  # one output token (3) so far
    logits = pos_logits.repeat(rows, 1)
    results = verify(Sampler(eos_token_ids=frozenset(), seed=0, device=CPU), logits, seqs,
                     [drafts] * rows)

    p0 = _target(pos_logits[0] - 0.7 * torch.eye(vocab)[3], 0.8, 5)
    p1 = _target(pos_logits[1] - 0.7 * (torch.eye(vocab)[3] + torch.eye(vocab)[2]), 0.8, 5)
    first = [r.tokens[0][0] for r in results]
    _assert_follows(first, p0)
    accepted = [r for r in results if r.num_accepted >= 1]
    assert all(r.tokens[0][0] == drafts[0] for r in accepted)
    rate = len(accepted) / rows
    assert abs(rate - float(p0[drafts[0]])) < 4 * (rate * (1 - rate) / rows) ** 0.5
    residual = p0.clone()
    residual[drafts[0]] = 0
    _assert_follows([r.tokens[0][0] for r in results if r.num_accepted == 0],
                    residual / residual.sum())
    _assert_follows([r.tokens[1][0] for r in accepted], p1)
    for r in results:  # never a token past the first one that differs from its draft
        assert r.num_accepted == len(r.tokens) - 1
        assert [t for t, _, _ in r.tokens[:-1]] == drafts[:r.num_accepted]


def test_greedy_rows_accept_while_the_argmax_is_the_draft():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0], [0.0, 1.0, 5.0]])
    seq = Sequence(request_id="g", token_ids=[0, 1], num_prompt_tokens=1,
                   params=SamplingParams(temperature=0.0))
    sampler = Sampler(eos_token_ids=frozenset(), seed=0, device=CPU)
    [all_in] = verify(sampler, logits, [seq], [[1, 0]])
    assert [t for t, _, _ in all_in.tokens] == [1, 0, 2] and all_in.num_accepted == 2
    [second_off] = verify(sampler, logits, [seq], [[1, 2]])
    assert [t for t, _, _ in second_off.tokens] == [1, 0] and second_off.num_accepted == 1
    lp = torch.log_softmax(logits, dim=-1)
    assert second_off.tokens[1][1] == pytest.approx(float(lp[1, 0]))  # the target's logprob


# ---- the engine: seeded requests, stops ------------------------------------------------------

_PROMPTS = ["cache block page cache block page cache block page",
            "the model the model the model the model",
            "user token kernel batch user token kernel batch user token",
            "decode prefix system decode prefix system decode"]


def _sampled_params() -> list[SamplingParams]:
    """Seeded rows with every processor, one n=2 row, and unseeded rows between them (low
    temperatures: the tiny random models' distributions are flat, and drafts are accepted
    only where they are peaked)."""
    return [
        SamplingParams(temperature=0.05, seed=11, max_tokens=40, logprobs=2),
        SamplingParams(temperature=0.05, top_k=20, top_p=0.9, min_p=0.05, seed=12,
                       max_tokens=40, presence_penalty=0.01, frequency_penalty=0.01),
        SamplingParams(temperature=0.02, seed=13, n=2, max_tokens=40, repetition_penalty=1.01),
        SamplingParams(temperature=0.05, max_tokens=40),
        SamplingParams(temperature=0.02, seed=14, max_tokens=40, min_tokens=30,
                       stop_token_ids=[5, 9, 17]),
        SamplingParams(temperature=0.8, max_tokens=40),
    ]


def test_seeded_sampling_is_token_for_token_the_same_with_speculation(tiny_checkpoints):
    path = tiny_checkpoints["mistral"]
    prompts = [_PROMPTS[i % len(_PROMPTS)] for i in range(6)]
    runs, accepted = [], {}
    for spec in (None, SPEC):
        llm = LLM(model=path, num_gpu_blocks_override=256, max_model_len=256, dtype="float32",
                  block_size=4, speculative_config=spec)
        commit = llm.llm_engine._commit_verified

        def counting_commit(req, seq, v, *args, commit=commit):
            accepted[seq.request_id] = accepted.get(seq.request_id, 0) + v.num_accepted
            return commit(req, seq, v, *args)

        llm.llm_engine._commit_verified = counting_commit
        runs.append(llm.generate(prompts, _sampled_params()))
    plain, spec_out = runs
    seeded = [i for i, p in enumerate(_sampled_params()) if p.seed is not None]
    assert sum(accepted.get(spec_out[i].request_id, 0) for i in seeded) >= 10, accepted
    for i, params in enumerate(_sampled_params()):
        if params.seed is None:
            assert all(c.finish_reason for c in spec_out[i].outputs)
            continue
        for a, b in zip(plain[i].outputs, spec_out[i].outputs, strict=True):
            assert b.token_ids == a.token_ids, f"request {i}"
            assert (b.finish_reason, b.stop_reason) == (a.finish_reason, a.stop_reason)
            if a.logprobs is not None:  # the target model's logprobs, top ones included
                assert [set(x) for x in b.logprobs] == [set(x) for x in a.logprobs]
                for x, y in zip(a.logprobs, b.logprobs):
                    assert all(abs(x[t] - y[t]) < 1e-4 for t in x)
    n2 = spec_out[2].outputs
    assert n2[0].token_ids != n2[1].token_ids  # sample 1 draws from seed + 1
    assert len(spec_out[4].outputs[0].token_ids) >= 30  # min_tokens held the stop ids back


class OracleProposer:
    """Drafts the reference continuation (all accepted), so the test decides where accepted
    runs lie; `wrong_at` corrupts one draft position to force a rejection there."""

    def __init__(self, references: dict[tuple[int, ...], list[int]], k: int,
                 wrong_at: int | None = None) -> None:
        self.references, self.k, self.wrong_at = references, k, wrong_at
        self.calls: list[tuple[int, list[int]]] = []  # (output length, drafts)

    def propose(self, token_ids: list[int], max_tokens: int | None = None) -> list[int]:
        for prompt, ref in self.references.items():
            n = len(prompt)
            if tuple(token_ids[:n]) == prompt and token_ids[n:] == ref[:len(token_ids) - n]:
                start = len(token_ids) - n
                drafts = ref[start:start + min(self.k, max_tokens or self.k)]
                if self.wrong_at is not None and len(drafts) > self.wrong_at:
                    drafts[self.wrong_at] = (drafts[self.wrong_at] + 1) % 100
                self.calls.append((start, list(drafts)))
                return drafts
        return []

    def draft(self, seq, room: int, batch_size: int) -> list[int]:  # the scheduler's call
        return self.propose(seq.token_ids, room)

    def finished(self, seq) -> None:  # the Proposer protocol's other call: nothing kept
        pass


@pytest.fixture(scope="module")
def greedy_reference(tiny_checkpoints):
    """One prompt's greedy continuation without speculation, and a token of it that first
    appears at output index 2 (inside the first accepted run of 4 oracle drafts: the run
    after the prefill's token covers output indexes 1..4, index 5 being the bonus token)."""
    llm = LLM(model=tiny_checkpoints["llama"], num_gpu_blocks_override=128, max_model_len=128,
              dtype="float32")
    for prompt in _PROMPTS:
        out = llm.generate([prompt], SamplingParams(temperature=0.0, max_tokens=24))[0]
        ref = out.outputs[0].token_ids
        if ref[2] not in ref[:2]:
            return out.prompt_token_ids, ref
    pytest.fail("no prompt whose third token is new")


def _oracle_llm(path, prompt_ids, ref, **kwargs) -> tuple[LLM, OracleProposer]:
    llm = LLM(model=path, num_gpu_blocks_override=128, max_model_len=128, dtype="float32",
              block_size=2, speculative_config=SPEC)
    oracle = OracleProposer({tuple(prompt_ids): ref}, k=4, **kwargs)
    llm.llm_engine.scheduler.proposer = oracle
    return llm, oracle


@pytest.mark.parametrize("stop", ["token", "string", "eos", "max_tokens"])
def test_a_stop_inside_an_accepted_run_ends_the_output_there(stop, tiny_checkpoints,
                                                           greedy_reference, tmp_path):
    prompt_ids, ref = greedy_reference
    path = tiny_checkpoints["llama"]
    params = dict(temperature=0.0, max_tokens=24)
    if stop == "token":
        params["stop_token_ids"] = [ref[2]]
    elif stop == "max_tokens":
        params["max_tokens"] = 3
    elif stop == "eos":  # the same weights, with ref[2] as the model's EOS
        path = tmp_path / "eos"
        shutil.copytree(tiny_checkpoints["llama"], path)
        for name in ("config.json", "generation_config.json"):
            data = json.loads((path / name).read_text())
            data["eos_token_id"] = ref[2]
            (path / name).write_text(json.dumps(data))
    plain = LLM(model=str(path), num_gpu_blocks_override=128, max_model_len=128,
                dtype="float32")
    if stop == "string":
        text = plain.get_tokenizer().decode(ref[:3])
        params["stop"] = [text[-2:]]
        assert text[-2:] not in plain.get_tokenizer().decode(ref[:2])
    params = SamplingParams(**params)
    expected = plain.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0]
    assert expected.token_ids == ref[:3], "the stop lands on output index 2"
    llm, oracle = _oracle_llm(str(path), prompt_ids, ref)
    got = llm.generate([{"prompt_token_ids": prompt_ids}], params)[0].outputs[0]
    assert (got.token_ids, got.text) == (expected.token_ids, expected.text)
    assert (got.finish_reason, got.stop_reason) == (expected.finish_reason,
                                                    expected.stop_reason)
    if stop == "max_tokens":  # drafts stop short of max_tokens: 1 draft + the bonus
        assert oracle.calls == [(1, ref[1:2])]
    else:  # the run held tokens past the stop, and none came out
        assert oracle.calls[0] == (1, ref[1:5])
        assert llm.llm_engine.get_stats().spec_num_accepted_tokens == 4


@pytest.mark.parametrize("wrong_at", [0, 1, 3])
def test_a_rejected_draft_is_replaced_by_the_targets_token(wrong_at, tiny_checkpoints,
                                                           greedy_reference):
    prompt_ids, ref = greedy_reference
    llm, oracle = _oracle_llm(tiny_checkpoints["llama"], prompt_ids, ref, wrong_at=wrong_at)
    out = llm.generate([{"prompt_token_ids": prompt_ids}],
                       SamplingParams(temperature=0.0, max_tokens=24, logprobs=1))[0]
    assert out.outputs[0].token_ids == ref
    stats = llm.llm_engine.get_stats()
    assert stats.spec_num_accepted_tokens_per_pos[wrong_at] == 0
    # a short last run (max_tokens) has no wrong draft and is accepted whole
    assert stats.spec_num_accepted_tokens == sum(
        wrong_at if len(d) > wrong_at else len(d) for _, d in oracle.calls)
    assert stats.spec_num_drafts == len(oracle.calls) > 3
    # each step: the accepted drafts, then the target's own token where the draft was wrong
    assert oracle.calls[1][0] == 1 + wrong_at + 1
