"""Chained prefix hashes of a request, stable across processes and machines.

Hash i covers chunks 0..i of the prompt (each chunk's digest folds in the one before),
so two prompts share hash i exactly when they share their first i+1 chunks: the same
chaining the engine's prefix cache applies to token blocks. By default the chunks are
fixed runs of characters, which needs no model files; `TokenBlockHasher` hashes blocks of
token ids instead, as the engine does, from a `tokenizers` tokenizer.json.
Python's built-in `hash()` is salted per process; blake2b is not.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

from engine.block_hash import external_hash, full_block_hashes

DIGEST_BYTES = 8


def digest(data: bytes, parent: int = 0) -> int:
    h = hashlib.blake2b(data, digest_size=DIGEST_BYTES,
                        key=parent.to_bytes(DIGEST_BYTES, "big") if parent else b"")
    return int.from_bytes(h.digest(), "big")


def chained(chunks: Iterable[bytes]) -> list[int]:
    out: list[int] = []
    parent = 0
    for chunk in chunks:
        parent = digest(chunk, parent)
        out.append(parent)
    return out


def _content_text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # OpenAI content parts: keep the text ones, in order
        return "".join(part.get("text", "") for part in content if isinstance(part, dict))
    return "" if content is None else str(content)


def request_text(body: dict[str, Any]) -> str:
    """The text whose prefix decides routing: the prompt, or the chat messages in order."""
    messages = body.get("messages")
    if isinstance(messages, list):
        return "".join(f"{m.get('role', '')}\n{_content_text(m.get('content'))}\x1e"
                       for m in messages if isinstance(m, dict))
    prompt = body.get("prompt")
    if isinstance(prompt, list) and prompt:
        if all(isinstance(t, int) for t in prompt):  # one prompt given as token ids
            return ",".join(map(str, prompt))
        prompt = prompt[0]  # a batch: route by its first prompt
        if isinstance(prompt, list):
            return ",".join(map(str, prompt))
    return prompt if isinstance(prompt, str) else ""


class CharChunkHasher:
    """Hashes fixed-size character chunks; a trailing partial chunk counts only when the
    whole text is shorter than one chunk (so short prompts still route by content)."""

    def __init__(self, chunk_chars: int = 128, max_chunks: int = 256) -> None:
        if chunk_chars < 1 or max_chunks < 1:
            raise ValueError("chunk size and max chunks must be >= 1")
        self.chunk_chars, self.max_chunks = chunk_chars, max_chunks

    def hashes(self, text: str) -> list[int]:
        data, step = text[: self.chunk_chars * self.max_chunks], self.chunk_chars
        if len(data) < step:
            return chained([data.encode()]) if data else []
        return chained(data[i * step:(i + 1) * step].encode() for i in range(len(data) // step))

    def request_hashes(self, body: dict[str, Any]) -> list[int]:
        return self.hashes(request_text(body))


# What the router needs of a checkpoint to hash as its engines do (no weights).
TOKENIZER_PATTERNS = ["tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
                      "special_tokens_map.json"]


def tokenizer_location(model: str) -> Path:
    """--tokenizer as the engines' model argument: a directory or tokenizer.json, a
    `builtin://NAME` (built into the model cache on first use, as the engine does), or a
    Hugging Face hub id (only its tokenizer files are fetched)."""
    from engine.builtin_models import ensure_builtin, is_builtin

    if is_builtin(model):
        return ensure_builtin(model)
    path = Path(model).expanduser()
    if path.exists() or model.startswith((".", "/", "~")) or model.count("/") != 1:
        return path  # a local path (a missing one is reported by the caller)
    try:
        from huggingface_hub import snapshot_download
        return Path(snapshot_download(model, allow_patterns=TOKENIZER_PATTERNS))
    except Exception as exc:  # network, auth, unknown id
        raise ValueError(f"--tokenizer {model}: not a local path and not fetched from the hub "
                         f"({type(exc).__name__}: {exc}); give the engines' model directory"
                         ) from exc


class TokenBlockHasher:
    """Hashes blocks of `block_size` token ids of what the engine will compute: a chat
    request rendered with the model's chat template (as the engine's `apply_chat_template`
    with the generation prompt), a text prompt encoded with the special tokens (BOS), token
    ids as given. So the router's blocks are the engine's prefix-cache blocks.

    Loads a Hugging Face `tokenizer.json` with the `tokenizers` package and the template
    (`chat_template.jinja`, or `chat_template` in tokenizer_config.json) with jinja2's
    sandbox, both imported here only (the default character mode needs neither). Without
    a template, chat requests hash their messages' text.
    """

    def __init__(self, tokenizer_path: str, block_size: int = 16, max_chunks: int = 256) -> None:
        from tokenizers import Tokenizer  # optional mode: imported lazily

        path = tokenizer_location(tokenizer_path)
        folder = path if path.is_dir() else path.parent
        if path.is_dir():
            path = path / "tokenizer.json"
        if not path.is_file():
            raise ValueError(f"--tokenizer: no tokenizer.json at {tokenizer_path}; give a "
                             "model directory or the file itself")
        if block_size < 1:
            raise ValueError("--hash-block-size must be >= 1")
        self.tokenizer = Tokenizer.from_file(str(path))
        self.block_size, self.max_chunks = block_size, max_chunks
        self.template, self.special = _chat_template(folder)

    def hashes(self, text: str, *, add_special_tokens: bool = False) -> list[int]:
        return self.block_hashes(self.tokenizer.encode(
            text, add_special_tokens=add_special_tokens).ids)

    def block_hashes(self, ids: Sequence[int]) -> list[int]:
        ids = ids[: self.block_size * self.max_chunks]
        n = len(ids) // self.block_size
        blocks = [ids[i * self.block_size:(i + 1) * self.block_size] for i in range(n)]
        if not blocks and ids:
            blocks = [ids]
        return chained(b"".join(t.to_bytes(4, "little") for t in block) for block in blocks)

    def request_hashes(self, body: dict[str, Any]) -> list[int]:
        return self.block_hashes(self.token_ids(body))

    def token_ids(self, body: dict[str, Any]) -> list[int]:
        """The prompt's token ids as the engine will compute them."""
        def encode(text: str, special: bool = False) -> list[int]:
            return self.tokenizer.encode(text, add_special_tokens=special).ids

        messages = body.get("messages")
        if isinstance(messages, list) and self.template is not None:
            conversation = [{"role": m.get("role", ""), "content": _content_text(m.get("content"))}
                            for m in messages if isinstance(m, dict)]
            try:
                text = self.template.render(messages=conversation, add_generation_prompt=True,
                                            **self.special)
            except Exception:  # noqa: BLE001 - the engine will answer 400; route by text
                return encode(request_text(body))
            return encode(text)  # the template carries its own special tokens
        prompt = body.get("prompt")
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], list):
            prompt = prompt[0]  # a batch of id lists: route by the first
        if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
            return list(prompt)
        if isinstance(prompt, list) and prompt and isinstance(prompt[0], str):
            prompt = prompt[0]
        if isinstance(prompt, str):
            return encode(prompt, special=True)
        return encode(request_text(body))


class EngineBlockHasher(TokenBlockHasher):
    """The engine's own prefix-cache block hashes of a request (engine/block_hash.py, as KV
    events publish them), for the `precise` policy: the token ids as TokenBlockHasher
    computes them, the request's `cache_salt`, the engines' block size."""

    def request_hashes(self, body: dict[str, Any]) -> list[int]:
        salt = body.get("cache_salt")
        return [external_hash(h) for h in full_block_hashes(
            self.token_ids(body), self.block_size, salt if isinstance(salt, str) else None,
            self.max_chunks)]


def _chat_template(folder: Path) -> tuple[Any, dict[str, Any]]:
    """The model's chat template compiled in jinja2's sandbox (as transformers renders it:
    trim_blocks, lstrip_blocks) and its special-token strings, or (None, {})."""
    import json

    config: dict[str, Any] = {}
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        pass
    source = config.get("chat_template")
    if isinstance(source, list):  # named templates: the default one
        source = next((t.get("template") for t in source if t.get("name") == "default"), None)
    jinja_file = folder / "chat_template.jinja"
    if jinja_file.is_file():
        source = jinja_file.read_text()
    if not isinstance(source, str):
        return None, {}
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise ValueError(message)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.globals["raise_exception"] = raise_exception
    special = {}
    for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
        value = config.get(name)
        if isinstance(value, dict):
            value = value.get("content")
        special[name] = value if isinstance(value, str) else ""
    return env.from_string(source), special


def ring_point(key: str | bytes) -> int:
    """A position on the consistent-hash ring."""
    return digest(key.encode() if isinstance(key, str) else key)
