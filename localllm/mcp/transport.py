"""The stdio transport of an MCP server, with bounds the SDK's has not.

The SDK's ``stdio_client`` reads a line however long it grows (a server that
writes 100 MB without a newline takes 100 MB here, then more to parse it),
waits for a reply that an invalid one will never be, and passes the server
our whole environment when given ``env``. This one is the same pipe framing
(newline-delimited JSON-RPC into the SDK's ``ClientSession``) with:

- a message bound: a line past ``max_message`` bytes is dropped as it streams
  (memory stays bounded); when the start of it names a request, that request
  fails at once with a line saying so; past 4 times the bound the server is
  taken as flooding and no longer read (its calls fail; no CPU is spent on it);
- an answer that is JSON but not valid JSON-RPC fails its request at once;
  other lines that are not JSON (a server's log on the wrong pipe) are skipped
  and counted;
- the SDK's default inherited variables (PATH, HOME, ...) plus the config's
  ``env``: never the API key or the rest of the user's environment;
- the server's stderr kept (its last 2 KiB) for the line that says why it
  failed, instead of on the user's terminal;
- a bounded stop: stdin closed, then the process group terminated, then killed.

Imported only when a server starts: the SDK costs ~1.5 s to import here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager, suppress
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.client.stdio import get_default_environment
from mcp.os.posix.utilities import terminate_posix_process_tree
from mcp.shared.message import SessionMessage

from localllm.mcp.config import ServerConfig

_ID = re.compile(rb'"id"\s*:\s*(-?\d{1,18}|"[^"\\]{0,200}")')
STDERR_KEPT = 2048
FLOOD_FACTOR = 4  # a line this many times the message bound: the server floods; it is no longer read (no CPU burnt on it)


@dataclass
class PipeLog:
    """What the server did on its pipes that the session does not see."""

    stderr: bytearray = field(default_factory=bytearray)  # the last STDERR_KEPT bytes
    skipped_lines: int = 0  # lines that were not JSON
    dropped: int = 0  # messages over the bound
    flooded: bool = False  # it wrote past FLOOD_FACTOR x the bound without a newline: no longer read
    returncode: int | None = None

    def tail(self) -> str:
        """The last line the server wrote on stderr, for a failure's line."""
        lines = [ln for ln in bytes(self.stderr).decode("utf-8", "replace").splitlines() if ln.strip()]
        return lines[-1].strip()[:200] if lines else ""


def server_environment(server: ServerConfig) -> dict[str, str]:
    """The SDK's default inherited variables, then the server's own ``env``."""
    return get_default_environment() | dict(server.env)


def _error(request_id: Any, message: str) -> SessionMessage:
    raw = {"jsonrpc": "2.0", "id": request_id, "error": {"code": -32603, "message": message}}
    return SessionMessage(types.jsonrpc_message_adapter.validate_python(raw))


def _request_id(head: bytes) -> Any:
    m = _ID.search(head)
    return None if m is None else json.loads(m.group(1))


@asynccontextmanager
async def bounded_stdio(server: ServerConfig, *, max_message: int, log: PipeLog) -> AsyncIterator[tuple[Any, Any]]:
    """(read stream, write stream) for ``ClientSession``, as the SDK's
    ``stdio_client`` yields them."""
    assert server.command is not None
    process = await anyio.open_process([server.command, *server.args], env=server_environment(server), cwd=server.cwd,
                                       stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                       start_new_session=True)
    read_in, read_out = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_in, write_out = anyio.create_memory_object_stream[SessionMessage](0)

    async def deliver(line: bytes) -> None:
        if not line.strip():
            return
        try:
            await read_in.send(SessionMessage(types.jsonrpc_message_adapter.validate_json(line)))
            return
        except ValueError:
            pass
        try:
            obj = json.loads(line)
        except ValueError:
            log.skipped_lines += 1  # a log line on stdout: not ours to fail on
            return
        rid = obj.get("id") if isinstance(obj, dict) else None
        if isinstance(rid, (int, str)) and not isinstance(rid, bool) and "method" not in obj:
            await read_in.send(_error(rid, "the server's answer is not valid JSON-RPC"))
        else:
            log.skipped_lines += 1

    async def stdout_reader() -> None:
        assert process.stdout is not None
        buf = bytearray()
        head = b""
        dropping = False
        skipped = 0
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with read_in:
                while True:
                    chunk = await process.stdout.receive(65536)
                    while chunk:
                        nl = chunk.find(b"\n")
                        part, chunk = (chunk, b"") if nl < 0 else (chunk[:nl], chunk[nl + 1:])
                        if not dropping:
                            buf += part
                            if len(buf) > max_message:
                                dropping, head, skipped = True, bytes(buf[:512]), len(buf)
                                buf.clear()
                        else:
                            skipped += len(part)
                            if skipped > FLOOD_FACTOR * max_message:
                                log.flooded = True
                                rid = _request_id(head)
                                if rid is not None:
                                    await read_in.send(_error(rid, f"the server floods its output (over {FLOOD_FACTOR * max_message // 2**20} "
                                                                   "MiB without a newline): no longer read"))
                                return
                        if nl < 0:
                            continue
                        if dropping:
                            dropping = False
                            log.dropped += 1
                            rid = _request_id(head)
                            if rid is not None:
                                await read_in.send(_error(rid, f"the server's answer is larger than {max_message // 2**20} MiB: dropped"))
                        else:
                            line = bytes(buf)
                            buf.clear()
                            await deliver(line)

    async def stderr_reader() -> None:
        assert process.stderr is not None
        with suppress(anyio.EndOfStream, anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            while True:
                log.stderr += await process.stderr.receive(65536)
                del log.stderr[:-STDERR_KEPT]

    async def stdin_writer() -> None:
        assert process.stdin is not None
        with suppress(anyio.ClosedResourceError, anyio.BrokenResourceError, OSError):
            async with write_out:
                async for message in write_out:
                    data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                    await process.stdin.send(data.encode("utf-8"))
        await read_in.aclose()  # the server is gone or we are: the session sees the end

    async with anyio.create_task_group() as tg:
        tg.start_soon(stdout_reader)
        tg.start_soon(stderr_reader)
        tg.start_soon(stdin_writer)
        try:
            yield read_out, write_in
        finally:
            with anyio.CancelScope(shield=True):
                await _stop(process)
                log.returncode = process.returncode
                for s in (read_in, read_out, write_in, write_out):
                    await s.aclose()
            tg.cancel_scope.cancel()


async def _stop(process: anyio.abc.Process) -> None:
    """stdin closed, a short wait, then the process group terminated and killed."""
    if process.stdin is not None:
        with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
            await process.stdin.aclose()
    with anyio.move_on_after(1.0):
        while process.returncode is None:
            await anyio.sleep(0.02)
    if process.returncode is None:
        if os.name == "posix":
            await terminate_posix_process_tree(process, 1.0)
        else:  # pragma: no cover - Windows
            process.kill()
        with anyio.move_on_after(1.0):
            await process.wait()
    for pipe in (process.stdout, process.stderr):
        if pipe is not None:
            with suppress(OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
                await pipe.aclose()
    # the asyncio subprocess transport, which nothing public closes (the SDK's stdio client does the same walk):
    # left open it would be closed by the garbage collector, on a loop that may be closed by then
    close = getattr(getattr(getattr(process, "_process", None), "_transport", None), "close", None)
    if callable(close):
        with suppress(PermissionError):
            close()
