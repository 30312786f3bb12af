"""Drive a terminal program in a real terminal (tmux): start, type, read the screen.

Used by the end-to-end TUI test and by scripts/bench_tui.py.
"""

from __future__ import annotations

import re
import shlex
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from typing import Any


def require() -> None:
    """tmux is here, or RuntimeError with the fix. The terminal tests call it and
    fail without tmux, never skip: scripts/install.sh --test installs it, so its
    absence is a set-up fault to report, not a reason to pass."""
    if shutil.which("tmux") is None:
        raise RuntimeError("tmux is not on PATH: scripts/install.sh --test installs it (or apt-get install tmux, brew install tmux)")


class Tmux:
    def __init__(self, command: list[str], *, width: int = 140, height: int = 40, env: dict[str, str] | None = None) -> None:
        self.name = f"localllm-{uuid.uuid4().hex[:8]}"
        exports = " ".join(f"{k}={shlex.quote(v)}" for k, v in (env or {}).items())
        # COLUMNS/LINES from the calling process (pytest sets them) would override the terminal's size.
        line = f"env -u COLUMNS -u LINES {exports} " + " ".join(shlex.quote(c) for c in command)
        # A detached session can keep the server's default size (80x24): size the
        # window first, then start the program in it, so it sees the size at once.
        for attempt in range(5):  # the server may be exiting after the last session closed: retry
            r = subprocess.run(["tmux", "new-session", "-d", "-s", self.name, "-x", str(width), "-y", str(height), "sleep 3600"], capture_output=True)
            if r.returncode == 0:
                break
            time.sleep(0.2 * (attempt + 1))
        else:
            raise RuntimeError(f"tmux could not start a session: {r.stderr.decode(errors='replace').strip()}")
        subprocess.run(["tmux", "set-option", "-t", self.name, "window-size", "manual"], capture_output=True)
        subprocess.run(["tmux", "resize-window", "-t", self.name, "-x", str(width), "-y", str(height)], capture_output=True)
        subprocess.run(["tmux", "respawn-pane", "-k", "-t", self.name, line], check=True)

    def send(self, *keys: str, literal: bool = False) -> None:
        subprocess.run(["tmux", "send-keys", "-t", self.name, *(["-l"] if literal else []), *keys], check=True)

    def pane_pid(self) -> int | None:
        """The process id of the program in the pane (None if tmux cannot say)."""
        out = subprocess.run(["tmux", "display-message", "-p", "-t", self.name, "#{pane_pid}"], capture_output=True, text=True).stdout.strip()
        return int(out) if out.isdigit() else None

    def screen(self, history: bool = False) -> str:
        """The visible screen, or with ``history`` everything the pane has shown."""
        start = ["-S", "-"] if history else []
        return subprocess.run(["tmux", "capture-pane", "-p", *start, "-t", self.name], capture_output=True, text=True).stdout

    def clear_history(self) -> None:
        """Blank the screen and forget what scrolled off it: ``screen(history=True)``
        then holds only what the program prints from here on."""
        subprocess.run(["tmux", "send-keys", "-R", "-t", self.name], capture_output=True)
        subprocess.run(["tmux", "clear-history", "-t", self.name], capture_output=True)

    def wait_for(self, pattern: str, timeout: float = 60.0, interval: float = 0.1, history: bool = False) -> re.Match[str]:
        """Poll the screen every ``interval`` seconds until ``pattern`` shows. Each
        poll starts a tmux client (a few ms of CPU): a benchmark polls slowly
        while the program under test computes."""
        m = self._poll(lambda screen: re.search(pattern, screen), timeout, interval, history)
        if m is None:
            raise TimeoutError(f"{pattern!r} did not appear; the screen was:\n{self.screen()}")
        return m

    def wait_for_absent(self, pattern: str, timeout: float = 60.0, interval: float = 0.1) -> None:
        """Poll until ``pattern`` is no longer on the screen."""
        if self._poll(lambda screen: not re.search(pattern, screen), timeout, interval, False) is None:
            raise TimeoutError(f"{pattern!r} stayed on the screen:\n{self.screen()}")

    def _poll(self, found: Callable[[str], Any], timeout: float, interval: float, history: bool) -> Any:
        """The first truthy ``found(screen)`` within ``timeout`` seconds, or None."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            result = found(self.screen(history=history))
            if result:
                return result
            time.sleep(interval)
        return None

    def close(self) -> None:
        subprocess.run(["tmux", "kill-session", "-t", self.name], capture_output=True)

    def __enter__(self) -> Tmux:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
