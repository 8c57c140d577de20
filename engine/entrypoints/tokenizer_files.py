"""What `GET /tokenizer` serves: the files a router needs to hash requests as this engine
tokenizes them (router/paged_router/hashing.py reads the same names from a model folder), so
`--policy precise` needs no `--tokenizer` of its own.

`tokenizer.json` is the fast tokenizer as Hugging Face's `tokenizers` saves it;
`tokenizer_config.json` carries the chat template this server renders (its
`--chat-template` when given, else the tokenizer's) and the special-token strings the
template refers to. No weights, nothing else of the checkpoint.
"""
from __future__ import annotations

import json
from typing import Any

SPECIAL_TOKENS = ("bos_token", "eos_token", "pad_token", "unk_token")


def tokenizer_files(tokenizer: Any, chat_template: str | None = None) -> dict[str, str]:
    """{file name: its text}; ValueError for a tokenizer without a fast backend."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is None:
        raise ValueError("this engine's tokenizer has no fast (tokenizers) backend: give the "
                         "router --tokenizer MODEL")
    template = chat_template if chat_template is not None else tokenizer.chat_template
    if isinstance(template, dict):   # named templates, as tokenizer_config.json lists them
        template = [{"name": name, "template": text} for name, text in template.items()]
    config: dict[str, Any] = {name: getattr(tokenizer, name, None) for name in SPECIAL_TOKENS}
    config["chat_template"] = template
    return {"tokenizer.json": backend.to_str(),
            "tokenizer_config.json": json.dumps(config)}
