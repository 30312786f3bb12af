"""The terminal's approval of a call (``chat --tools``, ``run --tools``)."""

from __future__ import annotations

import argparse
import io

import pytest

from localllm.commands import tools_cli
from localllm.mcp.agent import Decision, ToolCall

CALL = ToolCall("call_1", "add", "tiny", {"a": 1, "b": "\x1b[31m"})


class Tty(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.mark.parametrize(("typed", "decision"), [("o\n", Decision.ONCE), ("maybe\nalways\n", Decision.ALWAYS),
                                                 ("d\n", Decision.DENY), ("", Decision.DENY)])
def test_the_choice_is_read_from_the_terminal(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], typed: str,
                                               decision: Decision) -> None:
    monkeypatch.setattr("sys.stdin", Tty(typed))
    assert tools_cli.approver(argparse.Namespace(yes_tools=False))(CALL) is decision
    err = capsys.readouterr().err
    assert "[tool call] tiny/add" in err and '"a": 1' in err and "[o]nce, [a]lways for this session, [d]eny" in err
    assert "\x1b" not in err  # the arguments come from the model: escaped


def test_yes_tools_and_no_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr("sys.stdin", io.StringIO("o\n"))
    assert tools_cli.approver(argparse.Namespace(yes_tools=True))(CALL) is Decision.ONCE
    assert tools_cli.approver(argparse.Namespace(yes_tools=False))(CALL) is Decision.REFUSE
