"""A model file's sha256 (64 hex digits), the ``digest`` Ollama's ``/api/tags``,
``/api/ps`` and ``/api/show`` give. Clients tell models apart by it: llm-ollama
takes the names that share a digest for one model, so a null digest on every
model made them one, and another model answered (issue 59).

Hashing reads the whole file (seconds a GB), so a digest is computed once per
file version, keyed by path, size and mtime: kept in memory, and on disk in
``paths.digests_file()`` for the next processes (the router's children, the
next start). A file its store already names by its sha256 (a Hugging Face
cache blob, an Ollama blob) is not read. ``digest`` hashes in a worker thread,
so a listing never blocks the event loop; concurrent callers share one read.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import re
import threading
from pathlib import Path

from localllm import paths
from localllm.util import atomic

CHUNK = 1 << 20
_BLOB = re.compile(r"(?:sha256-)?([0-9a-f]{64})")  # an Ollama blob's name, a Hugging Face LFS blob's
Key = tuple[str, int, int]  # path, size, mtime_ns

_known: dict[Key, str] = {}
_gates: dict[Key, threading.Lock] = {}
_lock = threading.Lock()


def key_of(path: str | Path) -> Key:
    """What a digest is kept by; OSError when the file cannot be read."""
    st = os.stat(path)
    return (str(path), st.st_size, st.st_mtime_ns)


def known(path: str | Path) -> str | None:
    """``path``'s digest if this process has it for the file as it is now (no reading)."""
    try:
        return _known.get(key_of(path))
    except OSError:
        return None


def sha256(path: str | Path) -> str:
    """Blocking: ``path``'s sha256, read once per file version (OSError if it cannot be)."""
    key = key_of(path)
    with _lock:
        hit = _known.get(key)
        if hit is not None:
            return hit
        gate = _gates.setdefault(key, threading.Lock())
    with gate:  # a second caller waits for the first one's read instead of reading the file again
        hit = _known.get(key)
        if hit is None:
            hit = _by_name(path) or _from_disk(key) or _hash(path, key)
            with _lock:
                _known[key] = hit
    with _lock:
        _gates.pop(key, None)
    return hit


async def digest(path: str | Path | None) -> str | None:
    """``path``'s sha256, read in a worker thread the first time; None for a file
    that is not there (a built-in model not assembled yet) or cannot be read."""
    if path is None:
        return None
    hit = known(path)
    if hit is not None:
        return hit
    try:
        return await asyncio.to_thread(sha256, path)
    except OSError:
        return None


def _by_name(path: str | Path) -> str | None:
    """The sha256 a store named the file by: ``blobs/sha256-HEX`` (Ollama's),
    ``blobs/HEX`` (a Hugging Face cache's LFS file, a snapshot's link to it)."""
    real = Path(os.path.realpath(path))
    m = _BLOB.fullmatch(real.name)
    return m.group(1) if m and real.parent.name == "blobs" else None


def _hash(path: str | Path, key: Key) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    hexed = h.hexdigest()
    _to_disk(key, hexed)
    return hexed


def _read() -> dict:
    try:
        data = json.loads(paths.digests_file().read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}  # none yet, or damaged: computed again
    return data if isinstance(data, dict) else {}


def _from_disk(key: Key) -> str | None:
    row = _read().get(key[0])
    if isinstance(row, dict) and row.get("size") == key[1] and row.get("mtime_ns") == key[2]:
        value = row.get("sha256")
        if isinstance(value, str) and _BLOB.fullmatch(value) and not value.startswith("sha256-"):
            return value
    return None


def _to_disk(key: Key, value: str) -> None:
    """Kept for the next processes; the rows of files gone are dropped. A cache
    that cannot be written only means hashing again next time."""
    data = {p: row for p, row in _read().items() if p != key[0] and os.path.exists(p)}
    data[key[0]] = {"size": key[1], "mtime_ns": key[2], "sha256": value}
    try:
        atomic.write_json(paths.digests_file(), data)
    except OSError:
        pass
