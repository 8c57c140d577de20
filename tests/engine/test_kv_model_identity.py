"""The disk tier's namespace names the model by its content (engine/kv_offload/model_identity.py):
the same checkpoint anywhere shares blocks, a changed one never does, however its files'
sizes and times look."""
from __future__ import annotations

import hashlib
import json
import os
import shutil

import pytest

from engine.kv_offload import model_identity as mi
from engine.kv_offload.disk import namespace_digest

WEIGHTS = bytes(range(256)) * 4096  # 1 MiB


def checkpoint(root, weights: bytes = WEIGHTS, config: dict | None = None):
    root.mkdir(parents=True)
    (root / "config.json").write_text(json.dumps(config or {"hidden_size": 64}))
    (root / "model.safetensors").write_bytes(weights)
    (root / "tokenizer.json").write_text("{}")
    return root


def namespace(root, cache_dir=None) -> bytes:
    return namespace_digest(model_path=str(root), dtype="float32", block_shape=(2, 2, 16, 2, 8),
                            cache_dir=cache_dir)


def rewrite_in_place(path, data: bytes) -> None:
    """New content of the same size, its mtime set back as it was."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.write(data)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_size == st.st_size and os.stat(path).st_mtime_ns == st.st_mtime_ns


def test_a_copy_elsewhere_with_other_times_is_the_same_model(tmp_path):
    a = checkpoint(tmp_path / "a")
    b = tmp_path / "pod-2" / "models" / "b"
    shutil.copytree(a, b, copy_function=shutil.copy)
    os.utime(b / "model.safetensors", ns=(1, 1))
    assert namespace(a) == namespace(b)
    # a file that is neither config nor weights (the tokenizer) does not change the KV
    (b / "tokenizer.json").write_text('{"other": 1}')
    assert namespace(a) == namespace(b)


def test_other_weights_of_the_same_size_and_time_or_another_config_are_another_model(tmp_path):
    a = checkpoint(tmp_path / "a")
    before = namespace(a)
    changed = bytearray(WEIGHTS)
    changed[len(changed) // 2 + 7] ^= 1  # one bit, in the middle of the file
    rewrite_in_place(a / "model.safetensors", bytes(changed))
    assert namespace(a) != before
    b = checkpoint(tmp_path / "b", config={"hidden_size": 64, "rope_theta": 1e6})
    c = checkpoint(tmp_path / "c")
    assert namespace(b) != namespace(c)
    # and the layout or dtype count as before
    assert namespace_digest(model_path=str(c), dtype="bfloat16",
                            block_shape=(2, 2, 16, 2, 8)) != namespace(c)
    assert namespace_digest(model_path=str(c), dtype="float32",
                            block_shape=(2, 2, 1, 2, 8)) != namespace(c)


def test_a_hugging_face_cache_blob_is_named_by_its_digest_and_not_read(tmp_path, monkeypatch):
    plain = checkpoint(tmp_path / "plain")
    digest = hashlib.sha256(WEIGHTS).hexdigest()
    repo = tmp_path / "hub" / "models--org--tiny"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / digest).write_bytes(WEIGHTS)
    snapshot = repo / "snapshots" / "0123abcd"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").write_text((plain / "config.json").read_text())
    (snapshot / "model.safetensors").symlink_to(f"../../blobs/{digest}")
    expected = namespace(plain)

    def no_reading(path):
        raise AssertionError(f"{path} was read: the blob's name is its digest")

    monkeypatch.setattr(mi, "hash_file", no_reading)
    assert namespace(snapshot) == expected


def test_a_digest_is_computed_once_per_file_and_again_after_a_rewrite(tmp_path, monkeypatch):
    model, cache = checkpoint(tmp_path / "m"), tmp_path / "kv" / ".model-ids"
    reads = []
    real_hash = mi.hash_file
    monkeypatch.setattr(mi, "hash_file", lambda path: reads.append(path) or real_hash(path))
    first = namespace(model, cache)
    assert namespace(model, cache) == first and len(reads) == 1
    assert len(list(cache.glob("*.json"))) == 1
    # without the cache every engine start reads it again
    namespace(model)
    assert len(reads) == 2
    # rewritten in place with its mtime set back: its ctime moved, so it is read again
    changed = bytearray(WEIGHTS)
    changed[3] ^= 0xFF
    rewrite_in_place(model / "model.safetensors", bytes(changed))
    assert namespace(model, cache) != first and len(reads) == 3


def test_a_damaged_cache_entry_is_recomputed_not_trusted(tmp_path):
    model, cache = checkpoint(tmp_path / "m"), tmp_path / ".model-ids"
    first = namespace(model, cache)
    (entry,) = cache.glob("*.json")
    entry.write_text('{"sha256": "not a digest"}')
    assert namespace(model, cache) == first
    entry.write_text("{truncated")
    assert namespace(model, cache) == first


@pytest.mark.parametrize("suffix", [".bin", ".pt", ".gguf"])
def test_every_weight_format_counts(tmp_path, suffix):
    a = checkpoint(tmp_path / "a")
    b = checkpoint(tmp_path / "b")
    (a / f"extra{suffix}").write_bytes(b"1" * 10)
    (b / f"extra{suffix}").write_bytes(b"2" * 10)
    assert namespace(a) != namespace(b)
