"""A model that is not downloaded, stood in for by its header.

llama.cpp's dry run (``plan.referee``) reads only the metadata and the tensor
table, but refuses a file shorter than its tensors reach. So the header, fetched
with HTTP ranges, is written at the start of a sparse file extended to the
model's full size: measured here, SmolLM2's stub takes 1.7 MB on disk and its dry
run gives the same buffers as the real file (tests/store/test_remote_dry_run.py).
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from localllm import paths


@contextmanager
def header_stubs(parts: list[tuple[str, bytes, int]]) -> Iterator[Path]:
    """Stubs of a split model, one per part (its file name, header, size), in a
    folder of their own (llama.cpp finds the parts by name beside the first);
    yields the first part's path, and removes them all on exit."""
    for name, prefix, size in parts:
        if size < len(prefix):
            raise ValueError(f"a {size}-byte file cannot hold its {len(prefix)}-byte header ({name})")
        if Path(name).name != name or name in (".", ".."):
            raise ValueError(f"{name!r} is not a plain file name")
    folder = paths.ensure_dir(paths.stubs_dir()) / f"split-{hashlib.sha256(parts[0][1]).hexdigest()[:12]}-{os.getpid()}"
    folder.mkdir(exist_ok=True)
    try:
        for name, prefix, size in parts:
            with open(folder / name, "wb") as f:
                f.write(prefix)
                f.truncate(size)
        yield folder / parts[0][0]
    finally:
        for name, _, _ in parts:
            (folder / name).unlink(missing_ok=True)
        folder.rmdir()


@contextmanager
def header_stub(prefix: bytes, size: int) -> Iterator[Path]:
    """A sparse GGUF of ``size`` bytes that starts with ``prefix`` (the header,
    up to the tensor data), under our own stubs folder; removed on exit."""
    if size < len(prefix):
        raise ValueError(f"a {size}-byte model cannot hold its {len(prefix)}-byte header")
    folder = paths.ensure_dir(paths.stubs_dir())
    path = folder / f"{hashlib.sha256(prefix).hexdigest()[:16]}-{os.getpid()}.gguf"
    try:
        with open(path, "wb") as f:
            f.write(prefix)
            f.truncate(size)  # sparse: the tensor data is never written
        yield path
    finally:
        path.unlink(missing_ok=True)
