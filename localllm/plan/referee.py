"""llama.cpp as the referee: its dry run of a load, in a child process.

``localllm.engine.dryrun`` loads with ``no_alloc`` and ``load_mode = NONE``, as
llama.cpp's own ``--fit`` does (common/fit.cpp): it reads only the header,
simulates every allocation and logs the compute and output buffers it would
allocate on each device, exact for any architecture. Run here in a child
process under a time limit, so that a llama.cpp abort (a config it cannot
build) or a hang costs the figure, never the command.

The child stays for the next dry run of this process, and ends after
``IDLE_S`` seconds without one (or with this process): its start and its
import of llama.cpp took 0.35-0.4 s of every dry run, the dry run itself 0.06 s
(SmolLM2). A process that plans several loads (the router, the cockpit,
``plan``'s refits, a test worker) pays the start once. A dry run over RPC
workers gets a child of its own: llama.cpp keeps a connection per endpoint for
the life of the process, and a worker that restarted must be met afresh.
"""

from __future__ import annotations

import atexit
import json
import os
import selectors
import subprocess
import sys
import threading
import time
from pathlib import Path

from localllm.engine_api import DryRun, LoadConfig

TIMEOUT_S = 60.0
IDLE_S = 60.0  # the warm child's life without a request

_lock = threading.Lock()  # one request at a time on the warm child
_warm: subprocess.Popen | None = None
_owner = 0  # the process that started it: a forked child starts its own, not a second writer on the same pipe


def dry_run(path: Path, config: LoadConfig, timeout: float = TIMEOUT_S) -> DryRun:
    """llama.cpp's dry run of loading ``path`` with ``config``, in a child process
    under ``timeout`` seconds: its compute and output buffers per device, or its
    reason for refusing the config (an abort included), or why no figure came."""
    request = json.dumps({"path": str(Path(path).absolute()), "config": config.to_dict()}) + "\n"
    if config.rpc_servers:
        proc = _start(idle=0.0)
        try:
            return _ask(proc, request, timeout, time.perf_counter())
        finally:
            _end(proc)
    global _warm, _owner
    with _lock:
        for attempt in range(2):
            t0 = time.perf_counter()
            if _warm is None or _owner != os.getpid() or _warm.poll() is not None:
                _warm, _owner = _start(idle=IDLE_S), os.getpid()
            proc = _warm
            result = _ask(proc, request, timeout, t0)
            if proc.poll() is None:
                return result
            _end(proc)
            _warm = None
            if proc.returncode != 0 or attempt:  # an abort, a crash: the answer stands
                return result
            # exit 0 without an answer: the child ended idle just as the request came; start another
        return result


@atexit.register
def _close() -> None:
    """The warm child ends with this process (it would at stdin's end anyway)."""
    global _warm
    if _warm is not None and _owner == os.getpid():
        _end(_warm)
    _warm = None


def child_pid() -> int | None:
    """The warm child's process id, while it runs (the tests check it is reused)."""
    return _warm.pid if _warm is not None and _warm.poll() is None else None


def _start(idle: float) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "localllm.engine.dryrun", "serve", str(idle)], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, bufsize=0, start_new_session=False)


def _end(proc: subprocess.Popen) -> None:
    """Close the child's pipes and reap it (stdin closed: it ends)."""
    for f in (proc.stdin, proc.stdout, proc.stderr):
        try:
            f.close()  # type: ignore[union-attr]
        except OSError:
            pass
    try:
        proc.wait(timeout=5)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


def _ask(proc: subprocess.Popen, request: str, timeout: float, t0: float) -> DryRun:
    """Send one request and read its answer line within ``timeout``, draining the
    child's stderr meanwhile (llama.cpp's assertion is read from it on an abort)."""
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    try:
        proc.stdin.write(request.encode())
    except (BrokenPipeError, OSError):
        proc.wait()
        return DryRun(failed="llama.cpp's dry run ended before the request", seconds=time.perf_counter() - t0)
    out, err = bytearray(), bytearray()
    open_fds = 2
    deadline = t0 + timeout
    with selectors.DefaultSelector() as sel:
        sel.register(proc.stdout, selectors.EVENT_READ, out)
        sel.register(proc.stderr, selectors.EVENT_READ, err)
        while open_fds:
            left = deadline - time.perf_counter()
            if left <= 0:
                proc.kill()
                proc.wait()
                return DryRun(failed=f"llama.cpp's dry run took over {timeout:.0f} s", seconds=time.perf_counter() - t0)
            for key, _ in sel.select(left):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    open_fds -= 1
                    continue
                key.data.extend(chunk)
                if len(err) > 1 << 20:
                    del err[: len(err) - (1 << 20)]  # llama.cpp's last words are what counts
            answer = _answer(out)
            if answer is not None:
                return _parsed(answer, t0)
    code = proc.wait()
    text = err.decode(errors="replace")
    if code < 0:  # killed by a signal: llama.cpp aborted (GGML_ASSERT) building this config
        asserts = [line[line.find("GGML_ASSERT"):] for line in text.splitlines() if "GGML_ASSERT" in line]
        why = asserts[0].strip()[:200] if asserts else f"signal {-code}"
        return DryRun(refused=f"llama.cpp aborted building this config ({why})", seconds=time.perf_counter() - t0)
    why = (text.strip().splitlines() or ["no output"])[-1][:200]
    return DryRun(failed=f"llama.cpp's dry run ended with exit code {code} ({why})", seconds=time.perf_counter() - t0)


def _answer(out: bytearray) -> str | None:
    """The answer line, once a whole one has come; other lines are dropped."""
    while b"\n" in out:
        line, _, rest = bytes(out).partition(b"\n")
        out[:] = rest
        text = line.decode(errors="replace")
        if text.startswith(DryRun.MARK):
            return text[len(DryRun.MARK):]
    return None


def _parsed(answer: str, t0: float) -> DryRun:
    try:
        d = json.loads(answer)
        return DryRun(buffers={str(k): {str(kk): int(vv) for kk, vv in v.items()} for k, v in d["buffers"].items()},
                      seconds=d["seconds"], refused=d["refused"], failed=d["failed"])
    except (ValueError, KeyError, TypeError, AttributeError) as exc:
        return DryRun(failed=f"llama.cpp's dry run printed no readable result ({type(exc).__name__})", seconds=time.perf_counter() - t0)
