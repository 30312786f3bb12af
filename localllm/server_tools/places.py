"""Where a tool's files and commands are: the host, or an isolate the
``x-tool-runtime`` header names (a running docker or podman container, or a
host reached over ssh), as llama-server's ``tools_io`` classes do.

The header is untrusted text that lands on a command line, so it is checked
as llama-server checks it: a container id or ssh target that starts with
``-`` would be read as an option (``--privileged``, ``-oProxyCommand=...``
runs a command on this host); only ``[A-Za-z0-9._-]`` (and ``@`` for ssh) pass.
An unknown scheme is refused, never run on the host instead. A runtime that
would start a container (``docker:IMAGE``) is refused too: a call only attaches.

An isolate runs every operation as a POSIX command (``sh``, ``cat``, ``wc``,
``find``, ``timeout``); values travel as arguments (``"$1"``), never spliced
into a script, and ssh's remote shell gets one single-quoted word.
"""

from __future__ import annotations

import os
import posixpath
import re
import stat
import threading
import time
from dataclasses import dataclass, field

from localllm.server_tools import grep_worker, proc
from localllm.server_tools.base import Context, RuntimeRefused

LIST_TIMEOUT_S = 15.0  # one listing, git or walked (llama-server's SERVER_TOOL_LIST_ENTRIES_TIMEOUT)
GIT_MAX_OUTPUT = 8 * 1024 * 1024
MAX_ENTRIES = 200_000  # a listing's entries kept: a tree past this is reported truncated, not held in memory
ISOLATE_TIMEOUT_S = 15.0  # an auxiliary isolate command (stat, cat, mkdir)
READ_MAX = 32 * 1024 * 1024  # the most of one file a tool reads
# reported, never walked into: they can be enormous (llama-server's SERVER_TOOL_JUNK_DIR_NAMES)
JUNK_DIRS = frozenset({".git", ".svn", ".hg", "node_modules", "__pycache__", ".venv", "venv", "dist", "build", "target", ".cache", ".idea",
                       ".vscode"})
_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*")
_SSH = re.compile(r"[A-Za-z0-9._@][A-Za-z0-9._@-]*")
ENGINES = ("docker", "podman")


@dataclass
class Listing:
    entries: list[tuple[str, bool]] = field(default_factory=list)  # ('/'-separated path relative to the base, is a directory)
    error: str = ""
    truncated: bool = False


class Io:
    """The host: paths resolved against ``cwd`` (the server's own when None), ``~`` expanded."""

    def __init__(self, cwd: str | None, stop: threading.Event | None = None) -> None:
        self.cwd, self.stop = cwd, stop

    def resolve(self, path: str) -> str:
        p = os.path.expanduser(path) if path.startswith("~") else path
        if not os.path.isabs(p):
            p = os.path.join(self.cwd or os.getcwd(), p)
        return os.path.normpath(p)

    def is_dir(self, path: str) -> bool:
        return os.path.isdir(self.resolve(path))

    def is_file(self, path: str) -> bool:
        return os.path.isfile(self.resolve(path))

    def size(self, path: str) -> int | None:
        try:
            st = os.stat(self.resolve(path))
        except (OSError, ValueError):
            return None
        return st.st_size if stat.S_ISREG(st.st_mode) else None  # a device or a FIFO has no size to trust, and may never end

    def read(self, path: str, limit: int = READ_MAX) -> bytes | None:
        """The file's bytes (a regular file only, at most ``limit``), or None."""
        return grep_worker.read_regular(self.resolve(path), limit)

    def write(self, path: str, data: bytes) -> bool:
        full = self.resolve(path)
        try:
            os.makedirs(os.path.dirname(full) or ".", exist_ok=True)
            fd = os.open(full, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0), 0o666)
        except (OSError, ValueError):
            return False
        try:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                return False
            os.set_blocking(fd, True)
            with os.fdopen(fd, "wb", closefd=False) as f:
                f.write(data)
            return True
        except OSError:
            return False
        finally:
            os.close(fd)

    def run(self, argv: list[str], *, max_output: int, timeout: float, on_chunk=None) -> proc.Result:
        return proc.run(argv, max_output=max_output, timeout=timeout, cwd=self.cwd, on_chunk=on_chunk, stop=self.stop)

    def list(self, base: str, max_depth: int, kind: str) -> Listing:
        """``base``'s entries (``kind``: file, dir or all), down to ``max_depth`` levels (0: all):
        git's own list of files where ``base`` is in a work tree (ignored files left out), else a walk."""
        if not os.path.isdir(base):
            return Listing(error="path does not exist or is not a directory")
        deadline = time.monotonic() + LIST_TIMEOUT_S
        if kind == "file":
            # fsmonitor off: a folder's own .git/config could name a command for git to run (a hook-like escalation from reading)
            res = proc.run(["git", "-c", "core.fsmonitor=false", "-C", base, "ls-files", "--cached", "--others", "--exclude-standard"],
                           max_output=GIT_MAX_OUTPUT, timeout=LIST_TIMEOUT_S, stop=self.stop)
            if res.exit_code == 0 and not res.timed_out and not res.truncated:
                out = Listing()
                for line in res.output.splitlines():
                    rel = line.rstrip("\r").replace("\\", "/")
                    if rel and (max_depth <= 0 or rel.count("/") + 1 <= max_depth) and os.path.isfile(os.path.join(base, rel)):
                        out.entries.append((rel, False))
                return out
        return self._walk(base, max_depth, kind, deadline)

    def _walk(self, base: str, max_depth: int, kind: str, deadline: float) -> Listing:
        out = Listing()
        stack: list[tuple[str, str, int]] = [(base, "", 0)]
        while stack:
            folder, rel, depth = stack.pop()
            try:
                with os.scandir(folder) as it:
                    for entry in it:
                        if time.monotonic() >= deadline or len(out.entries) >= MAX_ENTRIES or (self.stop is not None and self.stop.is_set()):
                            out.truncated = True
                            return out
                        name = f"{rel}/{entry.name}" if rel else entry.name
                        try:
                            is_dir = entry.is_dir()
                            if is_dir:
                                if kind in ("dir", "all"):
                                    out.entries.append((name, True))
                                # a link may point back up and loop for ever: listed, never walked
                                if entry.name not in JUNK_DIRS and not entry.is_symlink() and (max_depth <= 0 or depth + 1 < max_depth):
                                    stack.append((entry.path, name, depth + 1))
                            elif kind in ("file", "all") and entry.is_file():
                                out.entries.append((name, False))
                        except OSError:
                            continue
            except OSError:
                out.truncated = True  # a folder that cannot be read: the caller is told the list is incomplete
        return out


class Isolate(Io):
    """Every operation as a POSIX command in a container or on a remote host; paths are POSIX."""

    def __init__(self, head: list[str], target: str, cwd: str | None, *, ssh: bool, stop: threading.Event | None = None) -> None:
        super().__init__(cwd, stop)
        self.head, self.target, self.ssh = head, target, ssh  # head: ssh and its options, or the container engine

    def argv(self, inner: list[str], *, stdin: bool) -> list[str]:
        if self.ssh:  # the remote shell parses its command line again: one quoted word
            return [*self.head, *([] if stdin else ["-n"]), self.target, " ".join(_quote(a) for a in inner)]
        return [*self.head, "exec", *(["-i"] if stdin else []), self.target, *inner]

    def resolve(self, path: str) -> str:
        return path if not self.cwd or path.startswith("/") else posixpath.join(self.cwd, path)

    def _exec(self, inner: list[str], max_output: int = 4096, combine: bool = True, data: bytes | None = None) -> proc.Result:
        return proc.run(self.argv(inner, stdin=data is not None), max_output=max_output, timeout=ISOLATE_TIMEOUT_S,
                        combine_stderr=combine, stdin=data, stop=self.stop)

    def _test(self, flag: str, path: str) -> bool:
        r = self._exec(["sh", "-c", f'[ {flag} "$1" ]', "_", self.resolve(path)])
        return r.exit_code == 0 and not r.timed_out

    def is_dir(self, path: str) -> bool:
        return self._test("-d", path)

    def is_file(self, path: str) -> bool:
        return self._test("-f", path)

    def size(self, path: str) -> int | None:
        r = self._exec(["sh", "-c", '[ -f "$1" ] && wc -c < "$1"', "_", self.resolve(path)], 64)
        text = r.output.strip()
        return int(text) if r.exit_code == 0 and not r.timed_out and text.isdigit() else None

    def read(self, path: str, limit: int = READ_MAX) -> bytes | None:
        r = self._exec(["sh", "-c", '[ -f "$1" ] && head -c "$2" -- "$1"', "_", self.resolve(path), str(limit)], limit, combine=False)
        return r.data if r.exit_code == 0 and not r.timed_out else None

    def write(self, path: str, data: bytes) -> bool:
        r = self._exec(["sh", "-c", 'mkdir -p "$(dirname "$1")" && cat > "$1"', "_", self.resolve(path)], data=data)
        return r.exit_code == 0 and not r.timed_out

    def run(self, argv: list[str], *, max_output: int, timeout: float, on_chunk=None) -> proc.Result:
        # an in-isolate timeout: killing our client does not kill what runs inside
        inner = ["timeout", f"{int(timeout)}s", *argv]
        if self.cwd:
            inner = ["sh", "-c", 'cd "$1" || exit 127; shift; exec "$@"', "_", self.cwd, *inner]
        return proc.run(self.argv(inner, stdin=True), max_output=max_output, timeout=timeout + 5, on_chunk=on_chunk, stop=self.stop)

    def list(self, base: str, max_depth: int, kind: str) -> Listing:
        full = self.resolve(base)
        if not self.is_dir(base):
            return Listing(error="path does not exist or is not a directory")
        if kind == "file":
            r = self._exec(["sh", "-c", 'cd "$1" && git -c core.fsmonitor=false ls-files --cached --others --exclude-standard', "_", full], GIT_MAX_OUTPUT)
            if r.exit_code == 0 and not r.timed_out and not r.truncated:
                return Listing([(rel, False) for rel in _lines(r.output, False) if max_depth <= 0 or rel.count("/") + 1 <= max_depth])
        out = Listing()
        prune = " -o ".join(f"-name {n}" for n in sorted(JUNK_DIRS))
        for is_dir in ((True,) if kind == "dir" else (False,) if kind == "file" else (True, False)):
            cmd = 'cd "$1" && find . -mindepth 1' + (f" -maxdepth {max_depth}" if max_depth > 0 else "") + f" \\( {prune} \\) -prune"
            cmd += " -print -o -type d -print" if is_dir else " -o -type f -print"
            r = self._exec(["sh", "-c", cmd, "_", full], GIT_MAX_OUTPUT)
            out.truncated = out.truncated or r.timed_out or r.truncated
            out.entries += [(rel, is_dir) for rel in _lines(r.output, True)][:MAX_ENTRIES]
        return out


def _lines(text: str, strip_dot: bool) -> list[str]:
    out = []
    for line in text.splitlines():
        line = line.rstrip("\r")
        if strip_dot and line.startswith("./"):
            line = line[2:]
        if line and line != "[output truncated]":
            out.append(line.replace("\\", "/"))
    return out


def _quote(arg: str) -> str:
    return "'" + arg.replace("'", "'\\''") + "'"


def io_for(ctx: Context, stop: threading.Event | None = None) -> Io:
    """The place ``ctx`` names: the host when no runtime is given; else an attached
    container or an ssh host, checked (``RuntimeRefused``: llama-server's words)."""
    runtime = ctx.runtime
    if not runtime:
        return Io(ctx.cwd, stop)
    for engine in ENGINES:
        if runtime.startswith(f"{engine}-container:"):
            cid = runtime[len(engine) + len("-container:"):]
            if not _ID.fullmatch(cid):
                raise RuntimeRefused(f"invalid container id: {cid[:200]}")
            return Isolate([engine], cid, ctx.cwd, ssh=False, stop=stop)
        if runtime.startswith(f"{engine}:"):
            raise RuntimeRefused(f"tool runtime must name a running container: {runtime[:200]}")
    if runtime.startswith("ssh:"):
        target = runtime[4:]
        if not _SSH.fullmatch(target):
            raise RuntimeRefused(f"invalid ssh target: {target[:200]}")
        # no console here, so a prompt would hang the call: keys only, and a host key trusted beforehand
        return Isolate(["ssh", "-o", "BatchMode=yes", "-o", "PasswordAuthentication=no", "-o", "KbdInteractiveAuthentication=no",
                        "-o", "StrictHostKeyChecking=yes"], target, ctx.cwd, ssh=True, stop=stop)
    raise RuntimeRefused(f"unknown tool runtime: {runtime[:200]}")
