"""What the model is, for the disk tier's namespace: its content, not where it lies.

Replicas that share a disk directory rarely load the model from the same place: each pod
downloads into its own volume, a node's cache and a PVC mount it at different paths, and a
re-download gets new file times. Blocks are the same KV whenever the weights and the
config are the same, so the identity is the config's bytes and a SHA-256 of each weight
file's content (its name and size beside it):

- a file in the Hugging Face cache (a symlink into `blobs/`) is named by the SHA-256 of its
  content (the Git LFS object id), so the name is the digest and nothing is read;
- any other weight file is read and hashed once, and the digest is kept in
  `<cache_dir>/<key>.json` (the disk tier's directory, so the replicas sharing it share the
  work), the key being the file's resolved path, device, inode, size, mtime and ctime.
  Writing to a file changes its ctime, which `touch` cannot set back, so a file rewritten
  in place is hashed again.

Hashing runs at about 1–2 GB/s from the page cache (the engine has just read the weights),
once per copy of the model; a SmolLM2-135M checkpoint takes a fraction of a second.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path

WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf")
_SHA256_NAME = re.compile(r"[0-9a-f]{64}")
_CHUNK = 1 << 22


def model_identity(model_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None
                   ) -> bytes:
    """SHA-256 over config.json's bytes and each weight file's (name, size, content digest),
    in name order; the same for every copy of the same checkpoint, wherever it lies."""
    root = Path(model_path)
    h = hashlib.sha256(b"paged-model-identity v1")
    for path in sorted(root.iterdir(), key=lambda p: p.name):
        if path.name == "config.json":
            h.update(b"config\0" + path.read_bytes())
        elif path.suffix in WEIGHT_SUFFIXES and path.is_file():
            size = path.stat().st_size
            h.update(f"\0{path.name}\0{size}\0{content_digest(path, cache_dir)}".encode())
    return h.digest()


def content_digest(path: Path, cache_dir: str | os.PathLike | None = None) -> str:
    """The hex SHA-256 of the file's content: the Hugging Face blob's name, the cached
    digest of this very file, or read and hashed now (and cached when `cache_dir` is set)."""
    real = path.resolve()
    if real.parent.name == "blobs" and _SHA256_NAME.fullmatch(real.name):
        return real.name
    st = real.stat()
    key = hashlib.sha256(f"{real}|{st.st_dev}|{st.st_ino}|{st.st_size}|{st.st_mtime_ns}|"
                         f"{st.st_ctime_ns}".encode()).hexdigest()
    cached = Path(cache_dir) / f"{key}.json" if cache_dir is not None else None
    if cached is not None:
        try:
            digest = json.loads(cached.read_text())["sha256"]
            if _SHA256_NAME.fullmatch(digest):
                return digest
        except (OSError, ValueError, KeyError, TypeError):
            pass  # none yet, or unreadable: hash it
    digest = hash_file(real)
    if cached is not None:
        try:
            cached.parent.mkdir(parents=True, exist_ok=True)
            tmp = cached.with_name(f".tmp-{os.getpid()}-{cached.name}")
            tmp.write_text(json.dumps({"path": str(real), "size": st.st_size,
                                       "sha256": digest}))
            os.replace(tmp, cached)
        except OSError:
            pass  # a read-only directory: hash again next time
    return digest


def hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()
