"""A command run with bounds: its time, its output's size, and its whole process
group, as llama-server's ``run_subprocess`` (tools/server/server-tools.cpp) runs
one, with what it leaves open closed.

- The command gets a session (and so a process group) of its own; at its end,
  on its timeout, or when the caller stops waiting (the client went away, the
  server is stopping), the whole group is killed: a ``sleep 999 &`` it left
  behind neither outlives the call nor holds the pipe open, which would keep
  the reader waiting for an end of file that never comes.
- The output is read as it comes (``on_chunk`` sees it at once, for a stream)
  and kept up to ``max_output`` bytes; past that it is still drained, so the
  command never blocks on a full pipe, and ``[output truncated]`` is added.
- stdin is closed at once, or fed ``stdin`` from a thread of its own (a command
  that writes while it reads cannot deadlock against us).
"""

from __future__ import annotations

import codecs
import os
import selectors
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

AFTER_EXIT_S = 0.5  # once the command itself has exited: how long what it started may still write to the pipe
TICK_S = 0.1


@dataclass
class Result:
    output: str
    exit_code: int = -1
    timed_out: bool = False
    truncated: bool = False
    data: bytes = b""  # the output's bytes as they came (a file read through an isolate may not be text)


def run(argv: Sequence[str], *, max_output: int, timeout: float, cwd: str | None = None, stdin: bytes | None = None,
        combine_stderr: bool = True, on_chunk: Callable[[str], bool] | None = None, stop: threading.Event | None = None) -> Result:
    """Run ``argv`` (no shell unless it is one), at most ``timeout`` seconds. ``on_chunk(text)``
    returning False, or ``stop`` being set, ends it early (killed, its output so far returned)."""
    try:
        proc = subprocess.Popen(list(argv), stdin=subprocess.PIPE if stdin is not None else subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT if combine_stderr else subprocess.DEVNULL, cwd=cwd or None,
                                start_new_session=True, close_fds=True)
    except OSError as exc:
        why = exc.strerror or type(exc).__name__
        return Result(f"failed to spawn process: {why}" + (f" (working directory {cwd!r})" if cwd and isinstance(exc, FileNotFoundError) else ""))
    if stdin is not None:
        threading.Thread(target=_feed, args=(proc, stdin), name="localllm-tool-stdin", daemon=True).start()
    assert proc.stdout is not None
    fd = proc.stdout.fileno()
    os.set_blocking(fd, False)
    decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
    kept = bytearray()
    truncated = timed_out = cut = False
    deadline = time.monotonic() + max(0.0, timeout)
    exited_at: float | None = None
    with selectors.DefaultSelector() as sel:
        sel.register(fd, selectors.EVENT_READ)
        while True:
            now = time.monotonic()
            if now >= deadline:
                timed_out = True
                break
            if stop is not None and stop.is_set():
                break
            if exited_at is None and proc.poll() is not None:
                exited_at = now
            if exited_at is not None and now - exited_at > AFTER_EXIT_S:
                break
            if not sel.select(min(TICK_S, deadline - now)):
                continue
            try:
                data = os.read(fd, 65536)
            except BlockingIOError:
                continue
            except OSError:
                break
            if not data:
                break
            if truncated:
                continue  # drained, not kept: a full pipe would block the command
            room = max_output - len(kept)
            piece = data[:room] if len(data) > room else data
            truncated = len(data) > room
            kept += piece
            if on_chunk is not None and piece and not on_chunk(decoder.decode(piece)):
                cut = True
                break
    # the end of its output: the command is exiting (or closed its output and runs on): waited for, to its deadline
    while not cut and not timed_out and proc.poll() is None and not (stop is not None and stop.is_set()):
        if time.monotonic() >= deadline:
            timed_out = True
            break
        try:
            proc.wait(timeout=TICK_S)
        except subprocess.TimeoutExpired:
            pass
    _kill_group(proc)
    proc.stdout.close()
    try:
        code = proc.wait(timeout=5)
    except subprocess.TimeoutExpired:  # pragma: no cover - a process that survives SIGKILL (uninterruptible I/O)
        code = -1
    text = bytes(kept).decode("utf-8", errors="replace")
    if truncated:
        text += "\n[output truncated]"
    return Result(text, code, timed_out, truncated, bytes(kept))


def _feed(proc: subprocess.Popen, data: bytes) -> None:
    assert proc.stdin is not None
    try:
        proc.stdin.write(data)
    except OSError:
        pass  # the command stopped reading: its exit code says what happened
    finally:
        try:
            proc.stdin.close()
        except OSError:
            pass


def _kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the command's process group (its session: the command and whatever it started)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
