"""End to end in a real terminal: tmux runs the cockpit, we type and read the screen."""

from __future__ import annotations

import re
import sys

import pytest

from scripts.tmuxdrive import Tmux, available
from tests.conftest import REPO

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not available(), reason="tmux is not installed (apt-get install tmux)")]


def _env(home) -> dict[str, str]:
    return {"LOCALLLM_HOME": str(home), "PYTHONPATH": str(REPO), "TERM": "xterm-256color"}


def test_bare_localllm_opens_the_cockpit(_isolated_home) -> None:
    with Tmux([sys.executable, "-m", "localllm"], env=_env(_isolated_home)) as t:
        t.wait_for(r"SmolLM2-135M-Instruct\.Q4_1\.gguf · context \d+", timeout=120)
        screen = t.screen()
        assert "Latency" in screen and "Memory" in screen and "Message (Enter to send" in screen
        t.send("C-q")


def test_chat_in_a_terminal_shows_numbers(_isolated_home) -> None:
    cmd = [sys.executable, "-m", "localllm", "tui", "--temp", "0", "--system", "Answer in one short sentence.", "--vram", "4GiB", "--ctx", "2048"]
    with Tmux(cmd, env=_env(_isolated_home)) as t:
        t.wait_for(r"context 2048 · KV f16/f16", timeout=120)
        t.send("What is the capital of France?", literal=True)
        t.send("Enter")
        t.wait_for(r"slow (start|stream)", timeout=120)
        screen = t.screen()
        assert "Paris" in screen
        ttft = float(re.search(r"TTFT ([\d.]+) ms", screen).group(1))
        p50, p95 = (float(x) for x in re.search(r"ITL p50 ([\d.]+) ms · p95 ([\d.]+) ms", screen).groups())
        decode = float(re.search(r"decode ([\d.]+) t/s", screen).group(1))
        used = int(re.search(r"context (\d+) of 2048", screen).group(1))
        kv_now = re.search(r"KV now ([\d.]+) (KiB|MiB)", screen)
        assert ttft > 0 and 0 < p50 <= p95 and decode > 0 and used > 0 and kv_now
        assert "GPU budget (--vram) 4.00 GiB" in screen
        t.send("C-q")
