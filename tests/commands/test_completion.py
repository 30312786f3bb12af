"""Tab never runs code: model names come from file names on disk, and the bash
completion inserts each one escaped, as itself, whatever shell syntax it holds
(issue 45 item 1: compgen -W expanded ``$(touch pwned).gguf`` and ran it)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli

HOSTILE = ["$(touch pwned)", "`touch pwned2`", "$((6*7))", "it's \"quoted\"", "with space", "glob*?[a]", "semi;touch pwned3", "back\\slash"]


@pytest.fixture
def hostile_folder(tmp_path: Path) -> Path:
    folder = tmp_path / "models"
    folder.mkdir()
    src = write_llama_gguf(tmp_path / "src.gguf", SynthSpec())
    for name in [*HOSTILE, "new\nline", "esc\x1b[31mred"]:
        shutil.copy(src, folder / f"{name}.gguf")
    assert cli("add", str(folder)).returncode == 0
    return folder


def _complete(script: Path, tmp_path: Path, *words: str) -> list[str]:
    """The words bash's completion offers for ``words`` (the last one being typed),
    each as the shell reads it back when the line runs (eval of the inserted text)."""
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "localllm").write_text(f"#!/bin/sh\nexec {sys.executable} -m localllm \"$@\"\n")
    (shim / "localllm").chmod(0o755)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    array = " ".join(f"'{w}'" for w in words)
    body = (f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _localllm; "
            'for r in "${COMPREPLY[@]}"; do eval "w=($r)"; [ "${#w[@]}" = 1 ] || echo "SPLIT $r"; printf "%s\\0" "${w[0]}"; done')
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True, cwd=cwd,
                         env={**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"})
    assert "SPLIT" not in out.stdout, out.stdout
    return [w for w in out.stdout.split("\0") if w]


def test_hostile_model_names_complete_as_themselves_and_run_nothing(hostile_folder: Path, tmp_path: Path) -> None:
    script = tmp_path / "c.bash"
    script.write_text(cli("completion", "bash").stdout)
    offered = _complete(script, tmp_path, "localllm", "run", "")
    for name in HOSTILE:
        assert name in offered, (name, offered)
    assert not [p for p in tmp_path.rglob("pwned*")], "a name ran as a command"
    # a prefix typed with shell syntax matches as plain text
    assert sorted(_complete(script, tmp_path, "localllm", "run", "$(t")) == ["$(touch pwned)"]
    assert sorted(_complete(script, tmp_path, "localllm", "run", "$(")) == ["$((6*7))", "$(touch pwned)"]
    assert not [p for p in tmp_path.rglob("pwned*")]


def test_names_with_control_characters_are_left_out(hostile_folder: Path) -> None:
    names = cli("completion", "--names").stdout.splitlines()
    assert "$(touch pwned)" in names
    assert not [n for n in names if "line" in n or "red" in n], names  # a newline would make two names, an escape draws
