"""One model, one process: a child is today's ``localllm serve PATH``.

llama.cpp aborts the process on some errors (a failed assert, a bad file past
the checks), and a model's memory is only given back whole when its process
ends; so each model runs in a ``serve`` of its own, on a loopback port the OS
picks, and the router proxies to it (llama-server's router and Ollama do the
same). A child:

- listens on ``127.0.0.1:0`` and requires the router's internal key, given in
  its environment (``LOCALLLM_API_KEY``), not on its command line, where any
  user of the machine could read it (``/proc/PID/cmdline``);
- reads no config file (``LOCALLLM_CONFIG`` points at a file that does not
  exist): the router already applied the user's, and passes the options on;
- says its URL on stderr (``serving NAME on http://127.0.0.1:PORT/v1 (...)``,
  the line the tests wait for too); its other lines reach the router's stderr
  with the model's name in front;
- stops as serve stops: SIGINT drains its requests, a second SIGINT ends them
  with an error, SIGKILL after ``STOP_S``; on Linux it gets SIGTERM when the
  router dies (``PR_SET_PDEATHSIG``), so no model is left holding memory.
"""

from __future__ import annotations

import asyncio
import collections
import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from localllm.util.fmt import safe

if TYPE_CHECKING:
    from localllm.router.residency import Need

READY = re.compile(r"serving (.+?) on (http://\S+?)/v1 \(")
# serve's one line per request it answered (serve.app.ServeState.log): a client's outcome, not the process's error
ANSWERED = re.compile(r'^(GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS) /|^\{"method": ')
STOP_S = 35.0  # serve drains for up to 30 s (serve.lifecycle.GRACE_S) before it ends what is left
MAX_LINE = 64 * 1024  # a longer stderr line is cut: it is for people to read


class ChildFailed(Exception):
    """The child exited, or never said it was serving: the message has its last error line."""


@dataclass(frozen=True)
class Spawn:
    """How to start a child: ``head`` + [PATH, "--alias", NAME, ...] + its options:
    ``per_model(NAME)`` where given (the model's config table and preset section
    over serve's options: ``commands.serve_models``), else ``options``."""

    head: tuple[str, ...]  # [python, -m, localllm, (-v), serve]
    options: tuple[str, ...]  # the per-model options the user gave serve
    key: str  # the internal API key
    config: str  # a config file path that does not exist
    env: dict[str, str] = field(default_factory=lambda: dict(os.environ))
    per_model: Callable[[str], tuple[str, ...]] | None = None

    def argv(self, name: str, path: Path) -> list[str]:
        options = self.per_model(name) if self.per_model is not None else self.options
        return [*self.head, str(path), "--alias", name, "--host", "127.0.0.1", "--port", "0", *options]

    @property
    def spares(self) -> bool:
        """Whether a child can start as a spare (``localllm.spare``): when it is ``python -m localllm ...``."""
        return len(self.head) >= 3 and self.head[1:3] == ("-m", "localllm")

    def spare_argv(self) -> list[str]:
        return [self.head[0], "-m", "localllm.spare"]

    def spare_line(self, name: str, path: Path) -> bytes:
        """What a spare is told: the child's command line after ``python -m localllm``."""
        return json.dumps({"argv": self.argv(name, path)[3:]}).encode() + b"\n"

    def environ(self) -> dict[str, str]:
        # LOCALLLM_ROUTER_CHILD: serve ends with os._exit once stopped (commands.serve.ROUTER_CHILD: a switch's stop time)
        return {**self.env, "LOCALLLM_API_KEY": self.key, "LOCALLLM_CONFIG": self.config, "LOCALLLM_ROUTER_CHILD": "1"}


Say = Callable[[str], None]


class Child:
    """One model's ``serve`` process, from start to exit. ``state``: loading,
    loaded, stopping, stopped. The pool (``localllm.router.pool``) decides when."""

    def __init__(self, name: str, say: Say, *, json_log: bool = False) -> None:
        self.name = name
        self.say = say
        self.json_log = json_log
        self.state = "loading"
        self.url: str | None = None
        self.pid: int | None = None
        self.path: Path | None = None
        self.plan: Any = None  # the prepare.LoadPlan its load was fitted with (the router's memory plan), or None
        self.need: Need | None = None  # that plan's bytes (GPU, CPU), counted against the budget while it is resident
        self.in_flight = 0  # requests using it (or waiting for its load)
        self.last_used = time.monotonic()
        self.expires_at: float | None = None  # monotonic; None: never
        self.expires_wall: float | None = None  # the same, as wall time for /api/ps
        self.started = time.monotonic()
        self.lines: collections.deque[str] = collections.deque(maxlen=20)
        self.n_lines = 0  # lines ever read: ``mark()`` before a request, ``ending(since)`` after it
        self.ready: asyncio.Future[str] = asyncio.get_running_loop().create_future()
        self.ready.add_done_callback(lambda f: f.cancelled() or f.exception())  # read by whoever waits; never "never retrieved"
        self.exited = asyncio.Event()
        self.spawned = asyncio.Event()  # set once the process exists, or once it is known it never will
        self.returncode: int | None = None
        self._proc: asyncio.subprocess.Process | None = None
        self._stop_asked = False

    @property
    def last_error(self) -> str:
        """The child's last error line (else its last line), without serve's prefix.
        The lines serve logs for the requests it answered are left out: a client's
        400 ("invalid_request_error") is not why the process failed."""
        return self._last_error(self.lines)

    def mark(self) -> int:
        """Where its output stands now, for ``ending(since=...)``."""
        return self.n_lines

    def ending(self, since: int = 0) -> str:
        """How the process ended, for people: the signal that killed it, or its exit
        code and its last error line among those read after ``since``."""
        rc = self.returncode
        if rc is not None and rc < 0:
            try:
                return f"code {rc}, killed by {signal.Signals(-rc).name}"
            except ValueError:
                return f"code {rc}, killed by signal {-rc}"
        recent = list(self.lines)[max(0, len(self.lines) - (self.n_lines - since)):]
        return f"code {rc}: {self._last_error(recent)}" if recent else f"code {rc}, saying nothing"

    @staticmethod
    def _last_error(lines) -> str:
        own = [_bare(line) for line in lines if not ANSWERED.match(_bare(line))]
        for line in reversed(own):
            if "error" in line.lower():
                return line
        return own[-1] if own else "no output"

    async def start(self, spawn: Spawn, path: Path, on_exit: Callable[[Child], None],
                    spare: asyncio.subprocess.Process | None = None) -> None:
        """Start the process (or hand ``spare``, a ``localllm.spare`` process, its
        command line) and follow its stderr; ``ready`` resolves to its URL."""
        self.path = path
        if spare is not None:
            assert spare.stdin is not None  # started with a pipe (pool.Spares)
            try:
                spare.stdin.write(spawn.spare_line(self.name, path))
                await spare.stdin.drain()
                spare.stdin.close()
            except (BrokenPipeError, ConnectionResetError):
                spare = None  # it died since it was started: start a child as before
        self._proc = spare or await asyncio.create_subprocess_exec(
            *spawn.argv(self.name, path), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=spawn.environ(), preexec_fn=_die_with_parent(), limit=MAX_LINE)
        self.pid = self._proc.pid
        self._follower = asyncio.get_running_loop().create_task(self._follow(on_exit))
        self.spawned.set()
        if self._stop_asked:  # stopped while it was being started
            self.interrupt()

    def abandon(self) -> None:
        """The process was never started (the load failed before): the child is over."""
        self.state = "stopped"
        self.spawned.set()
        self.exited.set()

    async def _follow(self, on_exit: Callable[[Child], None]) -> None:
        proc = self._proc
        assert proc is not None and proc.stderr is not None
        pending = b""
        while True:
            chunk = await proc.stderr.read(65536)
            if not chunk:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            pending = pending[-MAX_LINE:]
            for raw in lines:
                self._line(raw[:MAX_LINE].decode("utf-8", "replace").rstrip("\r"))
        if pending:
            self._line(pending.decode("utf-8", "replace"))
        self.returncode = await proc.wait()
        self.state = "stopped"
        if not self.ready.done():
            self.ready.set_exception(ChildFailed(f"{self.name} did not load (exit code {self.returncode}): {self.last_error}"))
        self.exited.set()
        on_exit(self)

    def _line(self, line: str) -> None:
        self.lines.append(line)
        self.n_lines += 1
        m = READY.search(line) if not self.ready.done() else None
        if m:
            self.url = m.group(2)
            self.state = "loaded"
            self.ready.set_result(self.url)
            return
        if not self.ready.done() and _bare(line).startswith("listening on "):
            return  # serve's "requests get 503 until loaded": not so behind the router, which holds them; its "loaded" line says the URL
        self._forward(line)

    def _forward(self, line: str) -> None:
        """The child's line on the router's stderr, naming the model (a JSON line
        gets a ``model`` field instead, so --json stays one object a line)."""
        if self.json_log and line.startswith("{"):
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
            if isinstance(obj, dict):
                print(json.dumps({"model": self.name, **obj}), file=sys.stderr, flush=True)
                return
        print(f"localllm: {safe(self.name)}: {safe(_bare(line))}", file=sys.stderr, flush=True)

    @property
    def running(self) -> bool:
        return self._proc is not None and self.returncode is None

    def interrupt(self) -> None:
        """SIGINT: the first drains the child's requests, a second ends them with an error."""
        if self.running and self._proc is not None:
            try:
                self._proc.send_signal(signal.SIGINT)
            except ProcessLookupError:
                pass

    async def stop(self, timeout: float = STOP_S) -> None:
        """Stop the process (draining what runs) and wait for it; SIGKILL past ``timeout``."""
        self.state = "stopping" if self.state != "stopped" else self.state
        first = not self._stop_asked
        self._stop_asked = True
        await self.spawned.wait()
        if self._proc is None:
            return
        if first:
            self.interrupt()
        try:
            await asyncio.wait_for(self.exited.wait(), timeout)
        except asyncio.TimeoutError:
            if self.running:
                self.say(f"{self.name} did not stop within {timeout:g} s: killed")
                self._proc.kill()
            await self.exited.wait()

    @property
    def stop_asked(self) -> bool:
        return self._stop_asked


class Spares:
    """One ``localllm.spare`` process kept started ahead of need (see its docstring):
    ``take`` hands it over and starts the next in the background."""

    def __init__(self, spawn: Spawn) -> None:
        self.spawn = spawn
        self.enabled = spawn.spares
        self._next: asyncio.Task[asyncio.subprocess.Process] | None = None

    def start(self) -> None:
        if self.enabled and self._next is None:
            self._next = asyncio.get_running_loop().create_task(self._launch())

    async def _launch(self) -> asyncio.subprocess.Process:
        return await asyncio.create_subprocess_exec(
            *self.spawn.spare_argv(), stdin=subprocess.PIPE, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
            env=self.spawn.environ(), preexec_fn=_die_with_parent(), limit=MAX_LINE)

    async def take(self) -> asyncio.subprocess.Process | None:
        """The spare, if it is started and alive (then the next one starts); else None."""
        task, self._next = self._next, None
        self.start()
        if task is None:
            return None
        try:
            proc = await task
        except OSError:
            return None
        return proc if proc.returncode is None else None

    async def close(self) -> None:
        task, self._next = self._next, None
        self.enabled = False
        if task is None:
            return
        try:
            proc = await task
        except (OSError, asyncio.CancelledError):
            return
        if proc.returncode is None:
            proc.kill()
        await proc.wait()


def _bare(line: str) -> str:
    return line.removeprefix("localllm: ")


def _die_with_parent() -> Callable[[], None] | None:
    """A preexec function that makes the child get SIGTERM when the router dies
    (Linux's PR_SET_PDEATHSIG); None elsewhere. The C function is looked up here,
    in the router, so the forked child only calls it."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes  # lazy: Linux only, once per child

    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    parent = os.getpid()

    def preexec() -> None:
        prctl(1, int(signal.SIGTERM))  # PR_SET_PDEATHSIG
        if os.getppid() != parent:  # the router died before the call
            os.kill(os.getpid(), signal.SIGTERM)

    return preexec
