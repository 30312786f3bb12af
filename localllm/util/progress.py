"""One kind of progress bar, for ``pull`` (bytes) and ``quantize`` (tensors).

On a terminal it is rich's bar on stderr (rich comes with Textual): the label,
the bar, the percentage, done/total and the time left, redrawn in place. When
stderr is not a terminal (a pipe, a log file, a test) it prints plain lines instead, so a
log shows progress without carriage returns: one where it starts, one at the
end (100%), and between them one at 25%, 50% and 75% when ``interval``
seconds have passed since the last line (a quick run prints two lines, so an
error that follows stays the last line of a short message). Disabled
(``--json``), it prints nothing. stdout is never touched.
"""

from __future__ import annotations

import sys
import time
from typing import Any, TextIO

from localllm.util.fmt import safe
from localllm.util.units import format_size


class Bar:
    """Progress of ``total`` units (``unit="bytes"`` or a noun such as "tensors")."""

    def __init__(self, label: str, total: int, *, unit: str = "bytes", done: int = 0, enabled: bool = True,
                 stream: TextIO | None = None, tty: bool | None = None, interval: float = 5.0) -> None:

        self.label = safe(label)
        self.total = max(int(total), 0)
        self.unit = unit
        self.done = done
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = enabled
        is_tty = self.stream.isatty() if tty is None else tty
        self._shown = -1  # the last quarter printed as a plain line
        self._interval = interval
        self._last = 0.0  # when it was printed
        self._rich: Any = None
        self._task: Any = None
        if enabled and is_tty:
            self._rich, self._task = self._start_rich()
        self.update(done)

    def _start_rich(self) -> tuple[Any, Any]:
        from rich.console import Console
        from rich.progress import (
            BarColumn,
            DownloadColumn,
            MofNCompleteColumn,
            Progress,
            TaskProgressColumn,
            TextColumn,
            TimeRemainingColumn,
            TransferSpeedColumn,
        )

        count = [DownloadColumn(binary_units=True), TransferSpeedColumn()] if self.unit == "bytes" else [MofNCompleteColumn(), TextColumn(self.unit)]
        progress = Progress(
            TextColumn("{task.description}", markup=False), BarColumn(), TaskProgressColumn(), *count, TimeRemainingColumn(),
            console=Console(file=self.stream, highlight=False), transient=False,
        )
        progress.start()
        return progress, progress.add_task(self.label[-40:], total=self.total or None, completed=self.done)

    def update(self, done: int, detail: str | None = None) -> None:
        """Move to ``done`` units (``detail``: what is being worked on, on a terminal)."""
        self.done = done
        if not self.enabled:
            return
        if self._rich is not None:
            desc = self.label[-40:] if detail is None else f"{self.label} {detail[:40]:<40}"
            self._rich.update(self._task, completed=done, description=desc)
            return
        quarter = 4 * done // self.total if self.total else 4
        now = time.monotonic()
        if quarter > self._shown and (self._shown < 0 or quarter == 4 or now - self._last >= self._interval):
            self._shown, self._last = quarter, now
            pct = 100 * done // self.total if self.total else 100
            print(f"{self.label}: {self._count(done)} ({pct}%)", file=self.stream, flush=True)

    def advance(self, n: int) -> None:
        self.update(self.done + n)

    def restart(self) -> None:
        """Back to nothing done (the server ignored a resume)."""
        self._shown = -1
        if self._rich is not None:
            self._rich.reset(self._task, total=self.total or None)
        self.update(0)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.update(self._task, description=self.label[-40:])  # the last line left on screen: no stale detail
            self._rich.stop()
            self._rich = None

    def _count(self, n: int) -> str:
        if self.unit == "bytes":
            return f"{format_size(n)} of {format_size(self.total)}"
        return f"{n}/{self.total} {self.unit}"

    def __enter__(self) -> Bar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
