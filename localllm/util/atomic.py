"""Write a file so that a crash leaves the old version or the new one, never half.

The one atomic-write helper: every file localllm writes whole goes through
here, the registry, saved sessions, prompt-cache state, the Hugging Face
cache's refs and verified blobs, the assembled built-in model and quantize's
output. Bytes go to a temporary file beside the target (same file system, so
the rename is atomic), are flushed to disk, and ``os.replace`` swaps it in.

- ``write_bytes``/``write_text``/``write_json``: localllm has the bytes.
- ``replacing``: another writer (llama.cpp's quantizer, a package's assembler)
  needs a path; it writes the temporary file, which is swapped in when the
  block ends without error and deleted otherwise.
- ``commit``: a temporary file that must outlive failures (a resumable
  download) is swapped in once it is complete and checked.

Temporary names are unique per call (not just per process) unless the caller
names one, so two threads or processes writing the same target never share one.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any


def write_bytes(target: Path, data: bytes) -> Path:
    """``data`` to a temporary file beside ``target``, fsync, then ``os.replace``."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(name, target)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise
    _fsync_dir(target.parent)
    return target


def write_text(target: Path, text: str) -> Path:
    """UTF-8 text written atomically."""
    return write_bytes(target, text.encode("utf-8"))


def write_json(target: Path, data: Any) -> Path:
    """JSON (UTF-8, non-ASCII kept) written atomically."""
    return write_bytes(target, json.dumps(data, ensure_ascii=False, indent=1).encode("utf-8"))


def commit(tmp: Path, target: Path) -> Path:
    """Flush the finished temporary file ``tmp`` to disk and swap it in as ``target``."""
    with open(tmp, "rb+") as fh:
        os.fsync(fh.fileno())
    os.replace(tmp, target)
    _fsync_dir(Path(target).parent)
    return Path(target)


@contextmanager
def replacing(target: Path, tmp_name: str | None = None) -> Iterator[Path]:
    """Yield a temporary path beside ``target`` for another writer to fill; when
    the block ends without error it becomes ``target`` (``commit``), otherwise
    it is deleted. ``tmp_name`` names it (a name other code recognises, such as
    quantize's ``.<name>.partial-<pid>``); by default the name is unique and
    the file does not exist yet."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    if tmp_name is None:
        fd, name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.tmp-")
        os.close(fd)
        tmp = Path(name)
        tmp.unlink()  # a writer may refuse to overwrite; the unique name stays ours
    else:
        tmp = target.with_name(tmp_name)
    try:
        yield tmp
        commit(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)


def _fsync_dir(folder: Path) -> None:
    """Make the rename itself durable where the platform allows (not on Windows)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)
