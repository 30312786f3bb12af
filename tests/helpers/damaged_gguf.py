"""Damaged GGUF files for tests, made with scripts/fuzz_gguf.py's parser."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

from scripts.fuzz_gguf import parse, serialize


def mutated(synth: Path, tmp_path: Path, name: str, change: Callable[[Any], Any]) -> Path:
    """A copy of ``synth`` named ``name`` with ``change`` applied to its parsed form."""
    m = change(parse(synth))
    out = tmp_path / name
    out.write_bytes(serialize(m))
    return out
