"""The terminal tests cannot pass by being skipped: without tmux they fail with
the fix, and scripts/install.sh --test is what installs tmux (and curl)."""

from __future__ import annotations

import re

import pytest

from scripts import tmuxdrive
from tests.helpers.paths import REPO


def test_without_tmux_the_terminal_tests_fail_naming_the_fix(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tmuxdrive.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match=r"tmux is not on PATH: scripts/install.sh --test installs it"):
        tmuxdrive.require()


def test_the_test_set_up_installs_what_the_tests_run() -> None:
    """install.sh --test checks (and as root installs) tmux, curl, zsh, fish, espeak-ng, sox and lame (the audio
    tests' speech), and builds llama.cpp's tools; CI runs nothing else before the README's test command."""
    text = (REPO / "scripts" / "install.sh").read_text(encoding="utf-8")
    assert re.search(r"for need in tmux curl zsh fish espeak-ng sox lame; do", text)
    assert re.search(r'"\$here/scripts/build_llama_tools.sh"', text)
    ci = [line for line in (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines() if line and not line.startswith("#")]
    assert "scripts/install.sh --test" in ci and "apt-get" not in "\n".join(ci)
