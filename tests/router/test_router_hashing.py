"""Prefix hashes: chained, stable across processes, order-sensitive; the hash ring."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from paged_router.hashing import CharChunkHasher, TokenBlockHasher, request_text
from paged_router.ring import HashRing

SYSTEM = "You are a helpful assistant for ACME. " * 20  # ~760 characters


def test_hashes_are_the_same_in_another_process_with_another_hash_seed():
    hasher = CharChunkHasher(chunk_chars=64)
    here = hasher.hashes(SYSTEM + "question?")
    code = ("import json; from paged_router.hashing import CharChunkHasher; "
            f"print(json.dumps(CharChunkHasher(chunk_chars=64).hashes({SYSTEM + 'question?'!r})))")
    for seed in ("1", "2"):
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                             env={**os.environ, "PYTHONHASHSEED": seed}, check=True).stdout
        assert json.loads(out) == here


def test_hashes_are_chained_so_shared_prefixes_share_exactly_their_hashes():
    hasher = CharChunkHasher(chunk_chars=64)
    a = hasher.hashes(SYSTEM + "What is the refund policy for orders over 100 dollars, please?")
    b = hasher.hashes(SYSTEM + "Where is my parcel? It was due last week and has not arrived!")
    shared = len(SYSTEM) // 64
    assert len(a) == len(b) == (len(SYSTEM) + 62) // 64
    assert a[:shared] == b[:shared]
    assert all(x != y for x, y in zip(a[shared:], b[shared:]))
    # a chunk equal to an earlier one still hashes differently (the chain folds it in)
    assert len(set(hasher.hashes("x" * 64 * 4))) == 4


def test_short_prompts_get_one_hash_and_long_ones_are_capped():
    hasher = CharChunkHasher(chunk_chars=64, max_chunks=3)
    assert len(hasher.hashes("hi")) == 1
    assert hasher.hashes("hi") != hasher.hashes("ho")
    assert hasher.hashes("") == []
    assert len(hasher.hashes("y" * 10_000)) == 3


def test_chat_messages_hash_in_order_with_their_roles():
    m1 = {"role": "system", "content": SYSTEM}
    m2 = {"role": "user", "content": [{"type": "text", "text": "hello"}]}
    assert request_text({"messages": [m1, m2]}).startswith("system\n" + SYSTEM)
    assert request_text({"messages": [m1, m2]}) != request_text({"messages": [m2, m1]})
    assert request_text({"messages": [{"role": "user", "content": "a"}]}) != \
        request_text({"messages": [{"role": "assistant", "content": "a"}]})
    assert request_text({"prompt": "abc"}) == "abc"
    assert request_text({"prompt": ["first", "second"]}) == "first"
    assert request_text({"prompt": [1, 2, 3]}) == "1,2,3"
    assert request_text({}) == ""


def test_token_block_mode_hashes_whole_blocks_of_token_ids(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers

    vocab = {w: i for i, w in enumerate("[UNK] the cat sat on a mat dog ran".split())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.save(str(tmp_path / "tokenizer.json"))
    hasher = TokenBlockHasher(str(tmp_path), block_size=2)
    a = hasher.hashes("the cat sat on a mat")       # 6 tokens: 3 blocks
    b = hasher.hashes("the cat sat on the dog ran")  # 7 tokens: 3 full blocks
    assert len(a) == len(b) == 3 and a[:2] == b[:2] and a[2] != b[2]
    # spacing differs, tokens do not: same hashes (the point of token mode)
    assert hasher.hashes("the   cat sat") [:1] == a[:1]


def test_token_mode_text_prompts_get_the_special_tokens_the_engine_adds(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, processors

    vocab = {w: i for i, w in enumerate("[UNK] [BOS] the cat sat on a mat".split())}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.post_processor = processors.TemplateProcessing(single="[BOS] $A",
                                                       special_tokens=[("[BOS]", 1)])
    tok.save(str(tmp_path / "tokenizer.json"))
    hasher = TokenBlockHasher(str(tmp_path), block_size=2)
    assert hasher.request_hashes({"prompt": "the cat sat"}) == hasher.block_hashes([1, 2, 3, 4])
    # no chat template here: chat requests fall back to hashing their text
    assert hasher.request_hashes({"messages": [{"role": "user", "content": "the cat"}]}) == \
        hasher.hashes(request_text({"messages": [{"role": "user", "content": "the cat"}]}))


def test_ring_moves_only_the_removed_nodes_keys():
    nodes = [f"http://127.0.0.{i}:8000" for i in range(2, 6)]
    ring = HashRing(nodes)
    keys = list(range(0, 1 << 64, (1 << 64) // 400))
    before = {k: ring.walk(k)[0] for k in keys}
    owners = set(before.values())
    assert owners == set(nodes)  # every node owns some keys
    ring.set_nodes(nodes[:-1])
    after = {k: ring.walk(k)[0] for k in keys}
    moved = [k for k in keys if before[k] != after[k]]
    assert moved and all(before[k] == nodes[-1] for k in moved)
    assert sorted(ring.walk(keys[7])) == sorted(nodes[:-1])  # the walk visits each once


@pytest.mark.parametrize("model", ["builtin://default", "builtin://smollm2-135m-instruct"])
def test_token_mode_hashes_the_blocks_the_engine_computes(model):
    """Chat requests through the model's chat template (generation prompt on), text prompts
    with the special tokens, id prompts as given: the same ids transformers' tokenizer gives
    the engine, so the router's block hashes are the engine's prefix-cache blocks."""
    from transformers import AutoTokenizer

    from engine.model_loader import resolve_model_path

    path = resolve_model_path(model)
    hasher = TokenBlockHasher(str(path), block_size=4)
    engine_tok = AutoTokenizer.from_pretrained(path)
    messages = [{"role": "system", "content": "You are the support bot of a shoe shop."},
                {"role": "user", "content": [{"type": "text", "text": "Where is my order?"}]}]
    flat = [messages[0], {"role": "user", "content": "Where is my order?"}]
    ids = engine_tok.apply_chat_template(flat, add_generation_prompt=True, tokenize=True,
                                         return_dict=True)["input_ids"]
    assert hasher.request_hashes({"messages": messages}) == hasher.block_hashes(list(ids))
    prompt = "Once upon a time, in a shoe shop far away, there lived"
    ids = engine_tok.encode(prompt, add_special_tokens=True)
    assert hasher.request_hashes({"prompt": prompt}) == hasher.block_hashes(ids)
    assert hasher.request_hashes({"prompt": [5, 6, 7, 8, 9]}) == hasher.block_hashes(
        [5, 6, 7, 8, 9])
    # the same system prompt, another question: the leading blocks are shared
    other = hasher.request_hashes({"messages": [messages[0],
                                                {"role": "user", "content": "Refund?"}]})
    assert other[:2] == hasher.request_hashes({"messages": messages})[:2]


def test_the_tokenizer_may_be_named_as_the_engines_model(monkeypatch, tmp_path):
    """--tokenizer takes what the operator gives the engines: builtin://NAME resolves to the
    built-in checkpoint (hashing as from its directory); a hub id that cannot be fetched is
    a clear error naming the flag; a missing local path says what to give."""
    from engine.model_loader import resolve_model_path

    body = {"messages": [{"role": "user", "content": "Where is my order? " * 8}]}
    by_name = TokenBlockHasher("builtin://default", block_size=4)
    by_dir = TokenBlockHasher(str(resolve_model_path("builtin://default")), block_size=4)
    assert by_name.token_ids(body) == by_dir.token_ids(body) and by_name.token_ids(body)
    assert by_name.request_hashes(body) == by_dir.request_hashes(body)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with pytest.raises(ValueError, match="--tokenizer nobody/no-such-model: not a local path"):
        TokenBlockHasher("nobody/no-such-model")
    with pytest.raises(ValueError, match="no tokenizer.json at"):
        TokenBlockHasher(str(tmp_path / "missing"))
