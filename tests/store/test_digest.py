"""A model file's sha256 for Ollama's listings (``localllm.store.digest``):
read once per file version, kept in memory and on disk under localllm's
cache folder, read again when the file changes, taken from the name of a
store's blob without reading it, and computed once for concurrent callers."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import threading
from pathlib import Path

import pytest

from localllm import paths
from localllm.store import digest


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The files hashed (whole reads), in a fresh process's state: nothing in memory."""
    monkeypatch.setattr(digest, "_known", {})
    seen: list[str] = []
    real = digest._hash

    def counted(path, key):
        seen.append(str(path))
        return real(path, key)

    monkeypatch.setattr(digest, "_hash", counted)
    return seen


def test_read_once_then_kept_in_memory_and_on_disk(tmp_path: Path, reads: list[str], monkeypatch: pytest.MonkeyPatch) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"GGUF" + os.urandom(3 * digest.CHUNK // 2))
    want = hashlib.sha256(f.read_bytes()).hexdigest()
    assert digest.sha256(f) == digest.sha256(f) == want and len(want) == 64
    assert reads == [str(f)]
    assert paths.digests_file().is_relative_to(paths.data_dir() / "cache")  # LOCALLLM_HOME's, in tests
    row = json.loads(paths.digests_file().read_text())[str(f)]
    assert row == {"size": f.stat().st_size, "mtime_ns": f.stat().st_mtime_ns, "sha256": want}
    monkeypatch.setattr(digest, "_known", {})  # the next process: from the disk, not read again
    assert digest.sha256(f) == want and reads == [str(f)]
    f.write_bytes(b"GGUF" + os.urandom(100))  # another version of the file: read again
    os.utime(f, ns=(f.stat().st_atime_ns, f.stat().st_mtime_ns + 10**9))
    assert digest.sha256(f) == hashlib.sha256(f.read_bytes()).hexdigest() != want and reads == [str(f)] * 2
    gone = tmp_path / "gone.gguf"
    gone.write_bytes(b"x")
    digest.sha256(gone)
    gone.unlink()
    other = tmp_path / "other.gguf"
    other.write_bytes(b"y")
    digest.sha256(other)  # the next write
    assert str(gone) not in json.loads(paths.digests_file().read_text())  # the row of a file no longer there is dropped


def test_a_damaged_cache_is_computed_again(tmp_path: Path, reads: list[str]) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(b"abc")
    paths.digests_file().parent.mkdir(parents=True)
    paths.digests_file().write_text(json.dumps({str(f): {"size": 3, "mtime_ns": f.stat().st_mtime_ns, "sha256": "not hex"}}))
    assert digest.sha256(f) == hashlib.sha256(b"abc").hexdigest() and reads == [str(f)]
    paths.digests_file().write_text("{")
    assert digest.sha256(tmp_path / "m.gguf") == hashlib.sha256(b"abc").hexdigest()


def test_a_stores_blob_is_named_by_its_sha256_and_not_read(tmp_path: Path, reads: list[str]) -> None:
    hexed = "ab" * 32
    hf = tmp_path / "hf" / "blobs" / hexed
    ollama = tmp_path / "ollama" / "blobs" / f"sha256-{hexed.replace('ab', 'cd')}"
    for blob in (hf, ollama):
        blob.parent.mkdir(parents=True)
        blob.write_bytes(b"weights")
    link = tmp_path / "hf" / "snapshots" / "m.gguf"  # a Hugging Face snapshot links to its blob
    link.parent.mkdir(parents=True)
    link.symlink_to(hf)
    assert digest.sha256(link) == hexed and digest.sha256(ollama) == "cd" * 32 and reads == []


def test_concurrent_callers_share_one_read_and_a_missing_file_has_none(tmp_path: Path, reads: list[str]) -> None:
    f = tmp_path / "m.gguf"
    f.write_bytes(os.urandom(8 * digest.CHUNK))
    got: list[str] = []
    threads = [threading.Thread(target=lambda: got.append(digest.sha256(f))) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(set(got)) == 1 and len(got) == 4 and reads == [str(f)]

    async def both() -> tuple[str | None, str | None]:
        return await digest.digest(f), await digest.digest(tmp_path / "not-assembled-yet.gguf")

    assert asyncio.run(both()) == (got[0], None)
