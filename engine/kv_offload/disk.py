"""The disk tier: one file per block in a directory that several engines may share.

A file's name is a digest of (namespace, block hash); the namespace digests everything
that makes one block's KV differ between engines: the model (its config and the SHA-256 of
each weight file's content, wherever the files lie), dtype, block size, the layer layout
and the format version. Its bytes:

    header  magic "PKVB", format version, dtype, block shape, namespace, key, payload
            length, CRC-32 of the payload (HEADER below)
    payload the block's KV, [2, layers, block_size, kv_heads, head_dim] in dtype

Writers write a temporary file and `os.replace` it, so a reader sees a whole file or none.
A file that is short, corrupt (CRC) or of another format/namespace is a miss, never KV.
A failed write (a full disk: ENOSPC, or any OSError) skips that block, counts it and logs
once. The size bound holds with several writers: a writer re-lists the directory (sizes of
names it has seen are remembered) after every RELIST_SHARE of the bound it has written, and
whenever the last listing plus its own writes since exceed the bound; when the listed total
does, it deletes the least recently used files (oldest mtime; a hit refreshes it) until
TRIM_SHARE of the bound is free (in whole blocks), so that the writes after it do not trim
again: finding the oldest stats every file (7 ms a write at a full 0.1 GiB of 64-KiB blocks,
97 ms at 1 GiB, when every write past the bound trimmed to the bound exactly), and a listing
costs about 0.7 us a file (1 ms at 0.1 GiB, 11 ms at 1 GiB, when every write re-listed). A
lone writer's bound is exact; n writers sharing a directory see each other's files at their
next listing, so the directory may pass the bound by up to n x RELIST_SHARE of it (the
operator's emptyDir is one replica's, with 10 % headroom over the bound).
"""
from __future__ import annotations

import hashlib
import itertools
import logging
import os
import struct
import time
import zlib
from pathlib import Path

import torch

from engine.kv_offload.model_identity import model_identity

logger = logging.getLogger("engine.kv_offload")

FORMAT_VERSION = 1
MAGIC = b"PKVB"
SUFFIX = ".kvb"
# magic, version, dtype name, block shape (5 dims), namespace, key, payload bytes, crc32
HEADER = struct.Struct("<4sH16s5I32s32sQI")
STALE_TMP_SECONDS = 300  # a temporary file this old belongs to a writer that died
TRIM_SHARE = 0.1  # of the bound a trim frees, in whole blocks (none below ten blocks' bound)
RELIST_SHARE = 0.01  # of the bound a writer writes between two listings (at least a file)


def trim_target(capacity_bytes: int, file_bytes: int) -> int:
    """What a trim brings the directory down to: the bound less TRIM_SHARE of it, rounded
    down to whole block files (the bound itself when that share is under one file)."""
    return capacity_bytes - int(capacity_bytes * TRIM_SHARE) // file_bytes * file_bytes


def namespace_digest(*, model_path: str, dtype: str, block_shape: tuple[int, ...],
                     cache_dir: str | os.PathLike | None = None) -> bytes:
    """What must match for two engines to share a block (see the module docstring). The
    model counts by its content (engine/kv_offload/model_identity.py), not its path, so
    replicas that hold the same checkpoint in different places share their blocks;
    `cache_dir` keeps the weight files' digests."""
    h = hashlib.sha256(f"paged-kv v{FORMAT_VERSION}|{dtype}|{block_shape}".encode())
    h.update(model_identity(model_path, cache_dir))
    return h.digest()


class DiskTier:
    def __init__(self, root: str | os.PathLike, capacity_bytes: int, *, namespace: bytes,
                 block_shape: tuple[int, ...], dtype: torch.dtype) -> None:
        self.root = Path(root)
        try:
            self.root.mkdir(parents=True, exist_ok=True)
            probe = self.root / f".tmp-probe-{os.getpid()}"
            probe.write_bytes(b"")
            probe.unlink()
        except OSError as exc:
            raise ValueError(f"kv_disk_dir {str(root)!r} is not a writable directory ({exc}); "
                             "choose another --kv-disk-dir") from None
        self.capacity_bytes = capacity_bytes
        self.namespace = namespace
        self.block_shape = tuple(block_shape)
        self.dtype = dtype
        self._dtype_name = str(dtype).removeprefix("torch.").encode()
        self.payload_bytes = torch.Size(block_shape).numel() * torch.empty((), dtype=dtype
                                                                           ).element_size()
        self.file_bytes = HEADER.size + self.payload_bytes
        self._tmp_ids = itertools.count()
        # counters: worker thread (writes) and step thread (reads) each own theirs
        self.blocks_written = self.bytes_written = 0
        self.write_failures = 0    # OSError on write (a full disk ...)
        self.writes_skipped = 0    # the bound leaves no room for one block
        self.files_evicted = 0
        self.blocks_read = self.bytes_read = 0
        self.bad_files = {"truncated": 0, "corrupt": 0, "foreign": 0}
        self._sizes: dict[str, int] = {}  # file name -> bytes, as of the last scan
        # the last listing's total plus this writer's files since (usage_bytes), and those
        self.relist_bytes = max(self.file_bytes, int(capacity_bytes * RELIST_SHARE))
        self._unlisted = 0
        self.listings = 0
        self.usage_bytes = 0
        self.usage_bytes = self._scan_and_trim()
        self._warned = False

    # ---- names -----------------------------------------------------------------------------
    def _key(self, block_hash: bytes) -> bytes:
        return hashlib.sha256(self.namespace + block_hash).digest()

    def path_for(self, block_hash: bytes) -> Path:
        return self.root / (self._key(block_hash).hex() + SUFFIX)

    def has(self, block_hash: bytes) -> bool:
        """A file under the block's name is there (written by any engine on the directory;
        read and checked only by a load)."""
        return self.path_for(block_hash).exists()

    # ---- write (worker thread) -----------------------------------------------------------------
    def write(self, block_hash: bytes, block: torch.Tensor) -> bool:
        """Stores one block; False when skipped (no room, or the write failed)."""
        if self.file_bytes > self.capacity_bytes:
            self.writes_skipped += 1
            self._warn_once(f"kv_disk_size {self.capacity_bytes} bytes is smaller than one "
                            f"block file ({self.file_bytes} bytes): nothing is stored on disk")
            return False
        path = self.path_for(block_hash)
        payload = block.detach().to("cpu").contiguous().view(torch.uint8).numpy().tobytes()
        assert len(payload) == self.payload_bytes
        header = HEADER.pack(MAGIC, FORMAT_VERSION, self._dtype_name, *self.block_shape,
                             self.namespace, self._key(block_hash), len(payload),
                             zlib.crc32(payload))
        tmp = self.root / f".tmp-{os.getpid()}-{next(self._tmp_ids)}{SUFFIX}"
        try:
            self._write_file(tmp, header + payload)
            os.replace(tmp, path)
        except OSError as exc:
            self.write_failures += 1
            self._warn_once(f"the disk KV tier could not write to {self.root} ({exc}); "
                            "blocks are skipped while writes fail")
            try:
                tmp.unlink()
            except OSError:
                pass
            return False
        self.blocks_written += 1
        self.bytes_written += self.file_bytes
        self._unlisted += self.file_bytes
        self.usage_bytes += self.file_bytes   # a name written again: one file over till listed
        if self._unlisted >= self.relist_bytes or self.usage_bytes > self.capacity_bytes:
            self.usage_bytes, self._unlisted = self._scan_and_trim(), 0
        return True

    @staticmethod
    def _write_file(path: Path, data: bytes) -> None:
        with open(path, "wb") as f:
            f.write(data)

    def _scan_and_trim(self) -> int:
        """Re-reads the directory (every writer's files), deletes the least recently used
        until the total is down to trim_target once it is over the bound; returns the
        total. A file's size is read once (a name is a digest of its content's key, so the
        size stays); the times only when the bound is exceeded: a write lists the
        directory, it does not stat every file."""
        try:
            names = os.listdir(self.root)
        except OSError:
            return self.usage_bytes
        self.listings += 1
        sizes, total, now = {}, 0, time.time()
        for name in names:
            if name.startswith(".tmp-"):
                st = _stat(self.root / name)
                if st is not None and now - st.st_mtime > STALE_TMP_SECONDS:
                    _unlink(self.root / name)
            elif name.endswith(SUFFIX):
                size = self._sizes.get(name)
                if size is None:
                    st = _stat(self.root / name)
                    if st is None:
                        continue  # another writer removed it
                    size = st.st_size
                sizes[name] = size
                total += size
        self._sizes = sizes
        if total > self.capacity_bytes:
            target = trim_target(self.capacity_bytes, self.file_bytes)
            files = []
            for name, size in sizes.items():
                st = _stat(self.root / name)
                if st is not None:
                    files.append((st.st_mtime, name, size))
            files.sort()
            for _, name, size in files:
                if total <= target:
                    break
                if _unlink(self.root / name):
                    self.files_evicted += 1
                total -= size  # gone, whoever removed it
                del self._sizes[name]
        return total

    def _warn_once(self, message: str) -> None:
        if not self._warned:
            self._warned = True
            logger.warning(message)

    # ---- read (step thread) ----------------------------------------------------------------
    def read(self, block_hash: bytes) -> torch.Tensor | None:
        """The block's KV, or None: no file, or one that is short, corrupt or foreign."""
        path = self.path_for(block_hash)
        try:
            with open(path, "rb") as f:
                raw = f.read(self.file_bytes + 1)
        except OSError:
            return None
        if len(raw) < HEADER.size:
            return self._bad(path, "truncated")
        magic, version, dtype, *rest = HEADER.unpack_from(raw)
        shape, (namespace, key, length, crc) = tuple(rest[:5]), rest[5:]
        if (magic, version, dtype.rstrip(b"\0"), shape, namespace, key) != (
                MAGIC, FORMAT_VERSION, self._dtype_name, self.block_shape, self.namespace,
                self._key(block_hash)) or length != self.payload_bytes:
            self.bad_files["foreign"] += 1
            return None  # another engine's format: not ours to delete
        payload = raw[HEADER.size:]
        if len(payload) != length:
            return self._bad(path, "truncated")
        if zlib.crc32(payload) != crc:
            return self._bad(path, "corrupt")
        try:
            os.utime(path)  # recently used: the bound removes it last
        except OSError:
            pass
        self.blocks_read += 1
        self.bytes_read += len(raw)
        return torch.frombuffer(bytearray(payload), dtype=self.dtype).view(self.block_shape)

    def _bad(self, path: Path, why: str) -> None:
        self.bad_files[why] += 1
        _unlink(path)
        return None


def _stat(path: Path) -> os.stat_result | None:
    try:
        return path.stat()
    except OSError:
        return None


def _unlink(path: str | os.PathLike) -> bool:
    try:
        os.unlink(path)
        return True
    except OSError:
        return False
