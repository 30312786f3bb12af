"""CI cannot pass the terminal tests by skipping them: .ci/run always requires
tmux, and without it the guard raises instead of reporting "not available"."""

from __future__ import annotations

import re

import pytest

from scripts import tmuxdrive
from tests.helpers.paths import REPO


def test_without_tmux_the_guard_fires_where_tmux_is_required(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(tmuxdrive.shutil, "which", lambda name: None)
    monkeypatch.setenv("LOCALLLM_REQUIRE_TMUX", "1")
    with pytest.raises(RuntimeError, match="tmux is required here"):
        tmuxdrive.available()
    monkeypatch.delenv("LOCALLLM_REQUIRE_TMUX")
    assert tmuxdrive.available() is False


def test_ci_requires_tmux_unconditionally() -> None:
    """The export stands on its own line, not behind a test that tmux is present."""
    lines = (REPO / ".ci" / "run").read_text(encoding="utf-8").splitlines()
    assert any(re.fullmatch(r"export LOCALLLM_REQUIRE_TMUX=1", line) for line in lines)
