"""``exec_shell_command`` and ``get_info``, answering as llama-server's.

A command runs under ``sh -c`` in the call's working directory (or the
isolate's), with stdout and stderr together, at most ``timeout`` seconds (10
by default, 60 at most) and ``max_output_size`` bytes (16 KiB at most); the
answer ends with ``[exit code: N]`` (and ``[exit due to timed out]``). Streamed
(``"stream": true``), each piece of output goes to the client as it comes, and
a client that goes away kills the command (``proc``: its whole process group).
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from localllm.server_tools.base import Context, optional_int, required_str
from localllm.server_tools.places import Io

EXEC_MAX_OUTPUT = 16 * 1024  # llama-server's SERVER_TOOL_EXEC_SHELL_COMMAND_MAX_OUTPUT_SIZE
EXEC_MAX_TIMEOUT = 60  # seconds (SERVER_TOOL_EXEC_SHELL_COMMAND_MAX_TIMEOUT)
EXEC_DEFAULT_TIMEOUT = 10
MAX_COMMAND = 64 * 1024
INFO_TIMEOUT = 5


def _bounds(params: dict[str, Any]) -> tuple[str, int, int]:
    command = required_str(params, "command", limit=MAX_COMMAND)
    timeout = min(max(1, optional_int(params, "timeout", EXEC_DEFAULT_TIMEOUT)), EXEC_MAX_TIMEOUT)
    most = min(max(0, optional_int(params, "max_output_size", EXEC_MAX_OUTPUT)), EXEC_MAX_OUTPUT)
    return command, timeout, most


def _tail(code: int, timed_out: bool) -> str:
    return f"\n[exit code: {code}]" + (" [exit due to timed out]" if timed_out else "")


def exec_shell_command(io: Io, params: dict[str, Any]) -> dict[str, Any]:
    command, timeout, most = _bounds(params)
    res = io.run(["sh", "-c", command], max_output=most, timeout=timeout)
    return {"plain_text_response": res.output + _tail(res.exit_code, res.timed_out)}


def exec_streamed(io: Io, params: dict[str, Any], push: Callable[[str], bool]) -> None:
    """The command's output through ``push`` as it comes, then its exit line; ``push``
    returning False (the client is gone) kills the command and sends nothing more."""
    command, timeout, most = _bounds(params)
    gone = False

    def chunk(text: str) -> bool:
        nonlocal gone
        if text and not gone and not push(text):
            gone = True
        return not gone

    res = io.run(["sh", "-c", command], max_output=most, timeout=timeout, on_chunk=chunk)
    if gone:
        return
    if res.truncated:
        push("\n[output truncated]")
    push(_tail(res.exit_code, res.timed_out))


def get_info(io: Io, ctx: Context) -> dict[str, Any]:
    res = io.run(["uname", "-a"], max_output=4096, timeout=INFO_TIMEOUT)
    os_info = res.output.strip() if res.exit_code == 0 and not res.timed_out else "unknown"
    cwd = ctx.cwd
    if not cwd:
        if not ctx.runtime:
            cwd = os.getcwd()
        else:
            pwd = io.run(["pwd"], max_output=4096, timeout=INFO_TIMEOUT)
            cwd = pwd.output.strip() if pwd.exit_code == 0 and not pwd.timed_out else "unknown"
    return {"os": os_info, "cwd": cwd}
