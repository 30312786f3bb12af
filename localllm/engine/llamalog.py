"""llama.cpp's log, routed into Python ``logging`` instead of fd 2.

llama.cpp writes its log to stderr by default, which would scribble over a
Textual screen and interleave with CLI output. ``engine`` installs ``ROUTER`` as
llama.cpp's log callback: it reassembles the fragments into lines, keeps the
recent ones (the planner's accuracy tests read allocation lines from them, and a
failed load quotes llama.cpp's own reason) and forwards each line to the
``localllm.llama`` logger. Pure Python: no llama_cpp import here.
"""

from __future__ import annotations

import collections
import logging
import re
import threading
from collections.abc import Callable

log = logging.getLogger("localllm.llama")

# ggml.h's ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation
# of the previous line. (llama-cpp-python's _logger.py still has the older order.)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class _LogRouter:
    """Reassembles llama.cpp's log fragments into lines and routes them to logging."""

    def __init__(self) -> None:
        self.lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=20000)
        self._buf = ""
        self._level = logging.INFO
        self._lock = threading.Lock()
        self.count = 0  # lines seen so far; marks are positions in this count
        self.listeners: list[Callable[[int, str], None]] = []  # e.g. quantize's progress bar

    def __call__(self, level: int, text: bytes | None, _user: object) -> None:
        if not text:
            return
        with self._lock:
            if level != 5:
                self._level = _LEVELS.get(level, logging.DEBUG)
            self._buf += text.decode("utf-8", errors="replace")
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                self.lines.append((self._level, line))
                self.count += 1
                log.log(self._level, "%s", line)
                for listener in self.listeners:
                    listener(self._level, line)

    def last_error(self) -> str:
        for level, line in reversed(self.lines):
            if level >= logging.ERROR and line.strip():
                return line.strip()
        return ""

    def lines_since(self, mark: int) -> list[tuple[int, str]]:
        """Lines logged after ``mark`` (as far back as the buffer reaches)."""
        n = self.count - mark
        return list(self.lines)[-n:] if n > 0 else []

    def first_error_since(self, mark: int) -> str:
        """The first error llama.cpp logged after ``mark``: the root cause, where the
        last one is often a generic 'failed to load model'. Function-name prefixes
        ('llama_model_load: ') are dropped."""
        for level, line in self.lines_since(mark):
            if level >= logging.ERROR and line.strip():
                return re.sub(r"^(?:[a-z_0-9]+: )+", "", line.strip())
        return self.last_error()

    def mark(self) -> int:
        """A position in the log, to read only what came after it."""
        return self.count


ROUTER = _LogRouter()
