"""Tab never runs code: model names come from file names on disk, and the bash
completion inserts each one escaped, as itself, whatever shell syntax it holds
(issue 45 item 1: compgen -W expanded ``$(touch pwned).gguf`` and ran it)."""

from __future__ import annotations

import os
import re
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
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    array = " ".join(f"'{w}'" for w in words)
    body = (f"source {script}; COMP_WORDS=({array}); COMP_CWORD={len(words) - 1}; _localllm; "
            'for r in "${COMPREPLY[@]}"; do eval "w=($r)"; [ "${#w[@]}" = 1 ] || echo "SPLIT $r"; printf "%s\\0" "${w[0]}"; done')
    out = subprocess.run(["bash", "-c", body], capture_output=True, text=True, check=True, cwd=cwd, env=_shim(tmp_path))
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


def _shim(tmp_path: Path) -> dict[str, str]:
    shim = tmp_path / "bin"
    shim.mkdir(exist_ok=True)
    (shim / "localllm").write_text(f"#!/bin/sh\nexec {sys.executable} -m localllm \"$@\"\n")
    (shim / "localllm").chmod(0o755)
    return {**os.environ, "PATH": f"{shim}:{os.environ['PATH']}"}


@pytest.mark.slow
def test_fish_offers_hostile_names_as_themselves_and_runs_nothing(hostile_folder: Path, tmp_path: Path) -> None:
    """fish's own completion engine (``complete -C``) on the script: each name is a
    candidate as it is (fish escapes what it inserts), and none ran."""
    fish = shutil.which("fish")
    assert fish, "fish is not installed: scripts/install.sh --test installs it"
    script = tmp_path / "c.fish"
    script.write_text(cli("completion", "fish").stdout)
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    out = subprocess.run([fish, "--no-config", "-c", f"source {script}; complete -C 'localllm run '"], capture_output=True, text=True,
                         check=True, cwd=cwd, env=_shim(tmp_path)).stdout
    offered = [line.split("\t")[0] for line in out.splitlines()]
    for name in HOSTILE:
        assert name in offered, (name, offered)
    assert not [p for p in tmp_path.rglob("pwned*")], "a name ran as a command"


@pytest.mark.slow
def test_zsh_lists_and_inserts_hostile_names_escaped_and_runs_nothing(hostile_folder: Path, tmp_path: Path) -> None:
    """zsh (the bash function through bashcompinit), with a real Tab in a real
    terminal (tmux): the list shows every name, one inserted is escaped once, and
    nothing ran."""
    from scripts.tmuxdrive import Tmux, require

    require()
    zsh = shutil.which("zsh")
    assert zsh, "zsh is not installed: scripts/install.sh --test installs it"
    script = tmp_path / "c.zsh"
    script.write_text(cli("completion", "zsh").stdout)
    zdot = tmp_path / "zdot"
    zdot.mkdir()
    (zdot / ".zshrc").write_text(f"autoload -U compinit && compinit -u\nsource {script}\nPROMPT='> '\n")
    cwd = tmp_path / "cwd"
    cwd.mkdir(exist_ok=True)
    env = {k: v for k, v in _shim(tmp_path).items() if k in ("PATH", "LOCALLLM_HOME", "HOME", "LANG")}
    with Tmux(["sh", "-c", f"cd {cwd} && exec {zsh} -i"], env={**env, "ZDOTDIR": str(zdot), "TERM": "xterm-256color"}, width=150,
              height=30) as t:
        t.wait_for(r"^>", timeout=20)  # the prompt (capture-pane drops its trailing space)
        t.send("localllm run w", literal=True)
        t.send("Tab")
        t.wait_for(re.escape("localllm run with\\ space"), timeout=20)
        t.send("C-u")
        t.send("localllm run i", literal=True)
        t.send("Tab")
        t.wait_for(re.escape("localllm run it\\'s\\ \\\"quoted\\\""), timeout=20)
        t.send("C-u")
        t.send("localllm run ", literal=True)
        t.send("Tab")
        t.wait_for(re.escape("touch\\ pwned2"), timeout=20)  # the list of every name, the hostile ones escaped
    assert not [p for p in tmp_path.rglob("pwned*")], "a name ran as a command"
