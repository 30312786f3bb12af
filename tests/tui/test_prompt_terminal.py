"""The prompt box and the clipboard in a real terminal (tmux): a multi-line
paste arrives whole (bracketed paste), and the last code block reaches the
terminal's clipboard through OSC 52."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest

from scripts.tmuxdrive import Tmux, require
from tests.helpers.paths import REPO

pytestmark = pytest.mark.slow


@pytest.fixture(autouse=True)
def _require_tmux() -> None:
    require()  # fails, never skips, without tmux (scripts/install.sh --test installs it)


CODE = "def add(a, b):\n    return a + b\n"
REPLY = ["Here", " is", " the", " code:\n\n", "```python\n", *CODE.splitlines(keepends=True), "```\n", "\nDone."]


def _cockpit(home: Path, model: Path, out: Path, *args: str) -> Tmux:
    env = {"LOCALLLM_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    cmd = [sys.executable, "-m", "tests.helpers.scripted_cockpit", str(model), str(out), *args]
    return Tmux(cmd, env=env, width=120, height=32)


def _written(path: Path, timeout: float = 30.0) -> dict:
    """The helper's JSON, once it has written it (after the cockpit ended)."""
    deadline = time.monotonic() + timeout
    while not (path.exists() and path.read_text().endswith("}")):  # whole
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s: the cockpit never wrote {path} whole")
        time.sleep(0.02)  # polled, the deadline above: a wait on the file, not a fixed sleep
    return json.loads(path.read_text())


def _tmux(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["tmux", *args], capture_output=True, text=True)


def test_a_bracketed_paste_sends_every_line(_isolated_home: Path, synth_model: Path, tmp_path: Path) -> None:
    """``tmux paste-buffer -p`` pastes as a terminal does when the program
    asked for bracketed paste: the lines arrive as one paste, not as Enters."""
    out = tmp_path / "chats.json"
    prompt = "Summarize this list in one line:\n- apples\n- pears\n- plums"
    with _cockpit(_isolated_home, synth_model, out) as t:
        t.wait_for(r"context 1024", timeout=60)
        buffer = f"paste-{t.name}"
        assert _tmux("set-buffer", "-b", buffer, prompt).returncode == 0
        assert _tmux("paste-buffer", "-p", "-d", "-b", buffer, "-t", t.name).returncode == 0
        t.wait_for(r"- plums", timeout=30)  # the box shows the last line, not yet sent
        assert not out.exists()
        t.send("Enter")
        t.wait_for(r"tok4", timeout=30)
        t.send("C-q")
        chats = _written(out)["chats"]
    users = [m["content"] for chat in chats for m in chat if m["role"] == "user"]
    assert users and users[-1] == prompt


def test_the_last_code_block_reaches_the_clipboard_by_osc52(_isolated_home: Path, synth_model: Path, tmp_path: Path) -> None:
    """With ``set-clipboard on`` tmux reads the OSC 52 sequence the cockpit
    writes and keeps what it carries as a paste buffer."""
    reply = tmp_path / "reply.json"
    reply.write_text(json.dumps(REPLY))
    was = _tmux("show-options", "-s", "-v", "set-clipboard").stdout.strip()
    with _cockpit(_isolated_home, synth_model, tmp_path / "chats.json", str(reply)) as t:
        assert _tmux("set-option", "-s", "set-clipboard", "on").returncode == 0
        t.wait_for(r"context 1024", timeout=60)
        before = _tmux("list-buffers", "-F", "#{buffer_name}").stdout.split()
        t.send("Show me code", literal=True)
        t.send("Enter")
        t.wait_for(r"Done\.", timeout=30)
        t.send("C-n")
        t.wait_for(r"copied the last code block \(python, 2 lines\)", timeout=30)
        new = [b for b in _tmux("list-buffers", "-F", "#{buffer_name}").stdout.split() if b not in before]
        assert new, "tmux got no OSC 52 sequence"
        copied = _tmux("show-buffer", "-b", new[0]).stdout
        _tmux("delete-buffer", "-b", new[0])
        t.send("C-q")
    if was:
        _tmux("set-option", "-s", "set-clipboard", was)  # the tmux server as it was
    assert copied == CODE


def test_keys_typed_while_a_model_loads_leave_no_stray_character(_isolated_home: Path, synth_model: Path, tmp_path: Path) -> None:
    """The load stalls the terminal's reading thread (the GIL held in C), so
    "hello", Esc, Ctrl+J, End and "world" arrive in one read; Textual cannot
    parse Esc + Ctrl+J + the End key's sequence and types that Esc as "^"
    (``hello^``). The box keeps what was typed and nothing else."""
    out = tmp_path / "out.json"
    with _cockpit(_isolated_home, synth_model, out, "--stall") as t:
        _written(Path(f"{out}.stall"), 60)
        t.send("hello", literal=True)
        t.send("Escape")
        t.send("C-j")
        t.send("End")
        t.send("world", literal=True)
        typed = time.time()
        t.wait_for(r"context 1024", timeout=60)
        t.send("Enter")
        t.wait_for(r"you › hello", timeout=30)
        screen = t.screen()
        t.send("C-q")
        result = _written(out)
    start, end = result["stall"]
    assert start < typed < end  # the keys came while the reader stalled
    assert "hello^" not in screen
    # rendered for the reply, and once more if the reply ended before the quit (its KV cache kept: issue 61)
    assert {m["content"] for chat in result["chats"] for m in chat if m["role"] == "user"} == {"hello\nworld"}


LIST_REPLY = ["# Fruits\n\n", "- Banana\n", "- Apple\n", "- Grapefruit\n", "- Rosemary\n", "- Sage\n\n", "```python\n", "x = 1\n", "```\n",
              "\nDone."]


def test_a_finished_reply_stays_in_its_column_at_120x40(_isolated_home: Path, synth_model: Path, tmp_path: Path) -> None:
    """Issue 45 item 3: at 120×40 a finished reply's Markdown list was painted over
    the figures panel beside it (Rich pads a list item to the width, and the
    strip was told the text's shorter length, so it was never cropped), and it
    stayed behind the F1 help. Every row of the figures panel holds only its own
    text after the reply is drawn as Markdown."""
    reply = tmp_path / "reply.json"
    reply.write_text(json.dumps(LIST_REPLY))
    env = {"LOCALLLM_HOME": str(_isolated_home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}
    cmd = [sys.executable, "-m", "tests.helpers.scripted_cockpit", str(synth_model), str(tmp_path / "chats.json"), str(reply)]
    with Tmux(cmd, env=env, width=120, height=40) as t:
        t.wait_for(r"context 1024", timeout=60)
        t.send("fruits please", literal=True)
        t.send("Enter")
        t.wait_for(r"•\s+Sage", timeout=30)  # drawn as Markdown (a bullet), which follows the last token
        screen = t.screen().splitlines()
        tops = [i for i, line in enumerate(screen) if "╭" in line]
        assert tops, "\n".join(screen)
        left = screen[tops[0]].index("╭")  # the figures panels' left edge
        inside = False
        for i, line in enumerate(screen):  # every row of a panel keeps its left border: nothing painted over it
            if i in tops:
                inside = True
            if inside:
                assert len(line) > left and line[left] in "│╭╰", f"row {i} lost the panel's border:\n" + "\n".join(screen)
            if "╰" in line:
                inside = False
        panel = [line[left:] for line in screen if len(line) > left]
        for word in ("Banana", "Grapefruit", "Rosemary", "Sage", "x = 1"):
            assert not any(word in row for row in panel), "\n".join(screen)
        assert "Latency" in "\n".join(panel) and "Memory" in "\n".join(panel)
        assert any("Banana" in line[:left] for line in screen), "\n".join(screen)  # drawn, in its own column
        # F1's help is a centred box: beside it the panels show through, each row still
        # ending in its right border and holding none of the reply (it stayed there before)
        right = max(len(line) for line in screen) - 1
        t.send("F1")
        t.wait_for(r"Esc, F1 or q closes", timeout=30)
        helped = t.screen().splitlines()
        box = next(line for line in helped if "Help: keys" in line).index("╮")  # the help box's right edge
        assert box < right, "\n".join(helped)
        beside = [line[box + 1:] for line in helped[tops[0]:] if len(line) > box + 1]
        for word in ("Banana", "Grapefruit", "Rosemary", "Sage", "x = 1"):
            assert not any(word in row for row in beside), "\n".join(helped)
        ends = [line[right] for line in helped[tops[0]:] if len(line) > right and line[right].strip()]
        assert ends and all(ch in "│╮╯" for ch in ends), "\n".join(helped)
        t.send("Escape")
        t.wait_for_absent(r"Esc, F1 or q closes", timeout=30)
        t.send("C-q")
