"""grep_search's matching, run as a process of its own (``python -I grep_worker.py``).

Why a process: the pattern comes from the model, and Python's ``re`` backtracks
(``(a+)+$`` against a long line takes for ever) while holding the GIL, which
would freeze the whole server, its event loop included, with no way to stop
it. A process is killed at its deadline (``search.GREP_TIMEOUT_S``).

It reads one JSON object on stdin: ``pattern``, ``flags`` (``re`` flags),
``ctx`` (context lines), ``num`` (line numbers), ``max`` (matches), ``files``
(``[{"path": host path, or "text": the content read through an isolate,
"show": the name printed}]``), and writes ``{"text", "total", "limit"}``.
It imports nothing but the standard library (it runs outside the package).
"""

from __future__ import annotations

import json
import os
import re
import stat
import sys

READ_MAX = 32 * 1024 * 1024
OUT_MAX = 512 * 1024  # the text's bound: past it, the rest of the matches are counted, not printed
LINE_MAX = 4096  # one printed line (a minified file is one line of megabytes)


def read_regular(path: str, limit: int = READ_MAX) -> bytes | None:
    """A regular file's bytes (at most ``limit``), or None: opened without blocking, so
    that a FIFO cannot hold the reader, and a device or a FIFO never read. Here
    because this file imports nothing of the package; the host's file tools
    (``places.Host.read``) read through it too."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError):
        return None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            return None
        with os.fdopen(fd, "rb", closefd=False) as f:
            return f.read(limit)
    except OSError:
        return None
    finally:
        os.close(fd)


def _read(path: str) -> str | None:
    data = read_regular(path)
    return None if data is None else data.decode("utf-8", errors="replace")


def search(job: dict) -> dict:
    pattern = re.compile(job["pattern"], job["flags"])
    ctx, num, most = job["ctx"], job["num"] or job["ctx"] > 0, job["max"]
    out: list[str] = []
    size = total = 0
    limit = False
    for f in job["files"]:
        if limit:
            break
        text = f.get("text")
        if text is None:
            text = _read(f["path"])
        if text is None:
            continue
        lines = text.split("\n")
        if lines and lines[-1] == "":
            lines.pop()
        show = f["show"]
        for i, line in enumerate(lines):
            if total >= most:
                limit = True
                break
            if not pattern.search(line):
                continue
            total += 1
            if size > OUT_MAX:
                continue
            for j in range(max(0, i - ctx), min(len(lines) - 1, i + ctx) + 1):
                mark = ":" if j == i else "-"
                text_j = lines[j] if len(lines[j]) <= LINE_MAX else lines[j][:LINE_MAX] + " [line truncated]"
                piece = f"{show}{mark}{f'{j + 1}{mark}' if num else ''}{text_j}\n"
                out.append(piece)
                size += len(piece)
            if ctx > 0:
                out.append("--\n")
    if size > OUT_MAX:
        out.append("[output truncated]\n")
    return {"text": "".join(out), "total": total, "limit": limit}


def main() -> int:
    job = json.loads(sys.stdin.buffer.read())
    sys.stdout.write(json.dumps(search(job)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
