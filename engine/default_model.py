"""Random-weight checkpoints built deterministically (Llama, Qwen2, Mistral).

`builtin://default` (builtin_models.py) is `build_checkpoint` with its defaults: written
once, in standard Hugging Face format, to the model cache and then loaded through the same
path as any other local checkpoint. Tests and benchmarks build other shapes with it.
"""
from __future__ import annotations

import json
import random
from pathlib import Path

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_WORDS = (
    "the a an of to in is was for on that with as by at from it this be are or have has "
    "model token cache block page memory request server kernel batch prefix system user "
    "assistant prompt answer question code function return value list data time query "
    "attention layer head sequence decode prefill schedule queue latency throughput "
    "hello world please summarize explain write python class import def if else while "
    "document context example result test error config cluster pod node deploy service"
).split()


def _corpus(seed: int, lines: int = 4000) -> list[str]:
    rng = random.Random(seed)
    out = []
    for _ in range(lines):
        words = [rng.choice(_WORDS) for _ in range(rng.randint(4, 24))]
        out.append(" ".join(words) + rng.choice([".", "?", "!", ":", ""]))
    out.append("0123456789 ()[]{}<>=+-*/,;'\"#_\n\t")
    return out


def build_tokenizer(vocab_size: int = 2048, seed: int = 0):
    """Byte-level BPE trained in-process on a seeded corpus, with a chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(_corpus(seed), trainer=trainer)
    return PreTrainedTokenizerFast(
        tokenizer_object=tok, eos_token="<|im_end|>", bos_token=None,
        pad_token="<|endoftext|>", unk_token=None, chat_template=CHAT_TEMPLATE,
        model_max_length=2048)


def build_checkpoint(path: Path, *, architecture: str = "llama", hidden_size: int = 256,
                     num_layers: int = 4, num_heads: int = 8, num_kv_heads: int = 4,
                     intermediate_size: int = 688, vocab_size: int = 2048,
                     max_position_embeddings: int = 2048, seed: int = 0,
                     extra_config: dict | None = None) -> Path:
    """Write a random-weight checkpoint of the given family to `path` (HF format)."""
    import torch
    import transformers

    tokenizer = build_tokenizer(vocab_size, seed)
    family = {
        "llama": (transformers.LlamaConfig, transformers.LlamaForCausalLM),
        "qwen2": (transformers.Qwen2Config, transformers.Qwen2ForCausalLM),
        "mistral": (transformers.MistralConfig, transformers.MistralForCausalLM),
    }
    if architecture not in family:
        raise ValueError(f"architecture must be one of {sorted(family)}, got {architecture!r}")
    config_cls, model_cls = family[architecture]
    config = config_cls(
        vocab_size=len(tokenizer), hidden_size=hidden_size, num_hidden_layers=num_layers,
        num_attention_heads=num_heads, num_key_value_heads=num_kv_heads,
        intermediate_size=intermediate_size, max_position_embeddings=max_position_embeddings,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None, tie_word_embeddings=False, initializer_range=0.05,
        **(extra_config or {}))
    torch.manual_seed(seed)
    model = model_cls(config).eval()
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    gen = {"eos_token_id": tokenizer.eos_token_id, "pad_token_id": tokenizer.pad_token_id,
           "do_sample": False}
    (path / "generation_config.json").write_text(json.dumps(gen, indent=2))
    return path
