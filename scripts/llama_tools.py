"""Where llama.cpp's own tools and vendored source are, for the tests and benchmarks.

scripts/build_llama_tools.sh builds them (scripts/install.sh --test runs it) under
``$XDG_CACHE_HOME`` in a folder keyed like the wheel. This module asks that script
for the folders (``--paths``: it builds nothing) instead of computing the key a
second time, so the two can never disagree.
"""

from __future__ import annotations

import functools
import subprocess
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
BUILD = REPO / "scripts" / "build_llama_tools.sh"
FIX = "scripts/install.sh --test builds it (or scripts/build_llama_tools.sh)"


class MissingTool(RuntimeError):
    """A tool or the vendored source is not where build_llama_tools.sh puts it."""


@functools.cache
def _paths() -> dict[str, Path]:
    # cached per process: the environment that decides the key (XDG_CACHE_HOME,
    # CMAKE_ARGS) does not change under a test run or a benchmark
    try:
        out = subprocess.run(["bash", str(BUILD), "--paths"], capture_output=True, text=True, check=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise MissingTool(f"cannot ask {BUILD} where llama.cpp's tools are ({exc}): {FIX}") from exc
    return {k: Path(v) for k, _, v in (line.partition("=") for line in out.splitlines()) if v}


def bin_dir() -> Path:
    return _paths()["bin"]


def source_dir() -> Path:
    """The vendored llama.cpp (``.../vendor/llama.cpp``)."""
    return _paths()["source"]


def tool(name: str) -> Path:
    """The path of ``name`` (llama-bench, llama-server, ...), whether or not it is built."""
    return bin_dir() / name


def require(name: str) -> Path:
    """``name``'s path, or MissingTool with the fix."""
    path = tool(name)
    if not path.is_file():
        raise MissingTool(f"{name} is not built ({path} missing): {FIX}")
    return path


def require_source(relative: str) -> Path:
    """A file of the vendored llama.cpp, or MissingTool with the fix."""
    path = source_dir() / relative
    if not path.is_file():
        raise MissingTool(f"llama.cpp's source is not fetched ({path} missing): {FIX}")
    return path
