"""llama.cpp's own tools, the tests' and benchmarks' anchors: built by
scripts/install.sh --test, found under $XDG_CACHE_HOME in a folder keyed like the
wheel, and never assumed: a test that needs one fails naming the fix."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from scripts import llama_tools
from tests.helpers.paths import REPO

TOOLS = ("llama-bench", "llama-server", "llama-perplexity", "llama-quantize")


def _paths(env: dict[str, str]) -> dict[str, str]:
    out = subprocess.run(["bash", str(REPO / "scripts" / "build_llama_tools.sh"), "--paths"], capture_output=True, text=True, check=True,
                         env={**os.environ, **env}).stdout
    return dict(line.split("=", 1) for line in out.splitlines())


def test_the_set_up_built_every_tool_and_fetched_the_source() -> None:
    for name in TOOLS:
        assert os.access(llama_tools.require(name), os.X_OK), name
    assert "project(\"llama.cpp\"" in llama_tools.require_source("CMakeLists.txt").read_text()


def test_the_folders_follow_xdg_cache_home_and_are_keyed_like_the_wheel(tmp_path: Path) -> None:
    here = _paths({"XDG_CACHE_HOME": str(tmp_path)})
    assert Path(here["bin"]).is_relative_to(tmp_path / "localllm" / "llama.cpp-tools")
    assert Path(here["source"]).is_relative_to(tmp_path / "localllm" / "llama.cpp-tools")
    # install.sh adds RPC to CMAKE_ARGS for the wheel; the tools always have it: the same build
    assert _paths({"XDG_CACHE_HOME": str(tmp_path), "CMAKE_ARGS": "-DGGML_RPC=ON"}) == here
    other = _paths({"XDG_CACHE_HOME": str(tmp_path), "CMAKE_ARGS": "-DGGML_CUDA=on"})
    assert other["bin"] != here["bin"] and other["source"] == here["source"]  # another build, one source per version


def test_a_missing_tool_is_an_error_naming_the_set_up(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    llama_tools._paths.cache_clear()
    try:
        with pytest.raises(llama_tools.MissingTool, match=r"llama-bench is not built \(.*\): scripts/install.sh --test builds it"):
            llama_tools.require("llama-bench")
        with pytest.raises(llama_tools.MissingTool, match=r"llama.cpp's source is not fetched .*scripts/install.sh --test"):
            llama_tools.require_source("common/common.h")
    finally:
        llama_tools._paths.cache_clear()


def test_nothing_finds_the_tools_by_a_path_of_its_own() -> None:
    """Every script and test asks scripts/llama_tools.py (or build_llama_tools.sh):
    none spells the cache folder, which would ignore XDG_CACHE_HOME and the key."""
    spelled = [str(p.relative_to(REPO)) for folder in ("scripts", "tests", "localllm") for p in (REPO / folder).rglob("*.py")
               if "llama.cpp-tools" in p.read_text(encoding="utf-8") and p.name != Path(__file__).name]
    assert spelled == []
