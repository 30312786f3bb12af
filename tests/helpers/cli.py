"""The CLI, run two ways.

``cli`` runs ``localllm.cli.main`` in this process: the default, where what is
tested is the command's output and exit code. ``run_cli`` starts a real child
process (``python -m localllm``): for what only a process shows (a signal, an
exit code set by the interpreter, import-time behaviour, a fresh environment).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from localllm.cli import main
from tests.helpers.paths import REPO


@dataclass
class Result:
    """What ``subprocess.run`` would have captured."""

    returncode: int
    stdout: str
    stderr: str
    args: tuple[str, ...] = ()


def cli(*args: str, stdin: str = "", env: dict[str, str] | None = None, timeout: float | None = None) -> Result:
    """``localllm ARGS`` in this process, with ``stdin`` as its standard input and
    ``env`` added to the environment for the call (restored after). ``timeout``
    is accepted for ``run_cli``'s signature and ignored."""
    out, err = io.StringIO(), io.StringIO()
    saved_env = dict(os.environ)
    os.environ.update(env or {})
    saved = sys.stdin, sys.stdout, sys.stderr
    handlers = {sig: signal.getsignal(sig) for sig in (signal.SIGINT, signal.SIGTERM)}
    sys.stdin = io.TextIOWrapper(io.BytesIO(stdin.encode("utf-8")), encoding="utf-8")
    sys.stdout, sys.stderr = out, err
    try:
        code = main(list(args))
    except SystemExit as exc:  # argparse's usage errors and --help
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        sys.stdin, sys.stdout, sys.stderr = saved
        for sig, handler in handlers.items():  # a command's SIGTERM handler ends with the command
            signal.signal(sig, handler)
        os.environ.clear()
        os.environ.update(saved_env)
    return Result(code, out.getvalue(), err.getvalue(), args)


def run_cli(*args: str, stdin: str | None = None, env: dict[str, str] | None = None, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    """Run ``python -m localllm`` for real, in a child process."""
    full_env = {**os.environ, **(env or {})}
    return subprocess.run(
        [sys.executable, "-m", "localllm", *args],
        input=stdin if stdin is not None else "",
        capture_output=True,
        text=True,
        env=full_env,
        cwd=REPO,
        timeout=timeout,
    )


def one_line(proc: Result | subprocess.CompletedProcess[str], code: int, *needles: str) -> str:
    """The command exited with ``code`` and said exactly one line on stderr, holding each needle."""
    assert proc.returncode == code, (proc.returncode, proc.stderr[-2000:])
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and "internal error" not in proc.stderr
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def chat_once(model: Path, system: str, text: str = "Hi") -> subprocess.CompletedProcess[str]:
    """One chat turn through ``localllm chat`` with a system prompt (a child process: the prompt cache is on disk between runs)."""
    return run_cli("chat", str(model), "--system", system, "-n", "4", "--temp", "0", "--json", "--ctx", "512", stdin=text + "\n")
