"""The runtime tests' fixture: who reads a GGUF header, and how often."""

from __future__ import annotations

import sys
from pathlib import Path
from types import FrameType

import pytest

from localllm.modelfile import gguf_file


@pytest.fixture
def header_reads(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """The module of every read of a GGUF header from now on: ``read_header``
    reads each part through ``gguf_file._read_one``, whoever imported it, so
    counting there counts them all (the parse itself is kept per file version)."""
    seen: list[str] = []
    real = gguf_file._read_one

    def counted(path: Path) -> gguf_file.GGUFHeader:
        frame: FrameType | None = sys._getframe(1)
        while frame is not None and frame.f_globals.get("__name__") == gguf_file.__name__:
            frame = frame.f_back
        seen.append(frame.f_globals.get("__name__", "?") if frame is not None else "?")
        return real(path)

    monkeypatch.setattr(gguf_file, "_read_one", counted)
    return seen
