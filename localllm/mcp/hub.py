"""The MCP client: several servers at once, for the chat, the cockpit and serve.

``Hub`` starts the configured servers concurrently (each bounded by a start
timeout: one that never answers ``initialize`` fails alone), lists their tools
(checked, ``mcp/tools.py``), calls one with a time and byte bound, cancels a
running call, and stops them all. Its calls are blocking (the chat loop and
the cockpit's worker threads) or futures (``submit``; serve awaits them with
``asyncio.wrap_future``): the SDK's asyncio side runs on a thread of its own,
so no caller needs an event loop.

A server that fails (at start or in a call: crashed, hung, flooding, invalid
JSON-RPC) gives one line; the others and the chat go on.

The ``mcp`` SDK is imported when the first server starts, not with this module
(``python -X importtime``: this module ~60 ms, asyncio mostly; the SDK ~1.5 s here).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm.errors import UsageError
from localllm.mcp.config import DEFAULT_CALL_TIMEOUT, DEFAULT_START_TIMEOUT, ServerConfig, Settings, load_settings
from localllm.mcp.tools import MAX_RESULT_BYTES, MAX_TOOLS, Tool, ToolResult, check, result_text
from localllm.util.fmt import safe

MAX_MESSAGE_BYTES = 8 * 1024 * 1024  # one JSON-RPC message from a server (a 10,000-tool list with small schemas fits)
MAX_PAGES = 16  # tools/list pages read from one server


@dataclass
class Limits:
    """The bounds of a server and of each call."""

    call_timeout: float = DEFAULT_CALL_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    max_result_bytes: int = MAX_RESULT_BYTES
    max_message_bytes: int = MAX_MESSAGE_BYTES
    max_tools: int = MAX_TOOLS  # per server


@dataclass
class ServerState:
    """One server: its tools once started, or the line saying why it failed."""

    config: ServerConfig
    tools: list[Tool] = field(default_factory=list)
    notices: list[str] = field(default_factory=list)  # tools left out, one line each
    error: str | None = None
    session: Any = None  # the SDK's ClientSession while it runs
    log: Any = None  # transport.PipeLog of a stdio server
    stop: asyncio.Event | None = None
    task: asyncio.Task[None] | None = None
    started_ms: float = 0.0

    @property
    def running(self) -> bool:
        return self.session is not None and self.error is None

    def to_dict(self) -> dict[str, Any]:
        return {"name": self.config.name, "transport": self.config.transport, "ok": self.running, "error": self.error,
                "start_ms": round(self.started_ms, 1), "tools": [t.to_dict() for t in self.tools], "left_out": list(self.notices)}


class PendingCall:
    """A call in flight: wait for its result, or cancel it (the server is told)."""

    def __init__(self, future: concurrent.futures.Future[ToolResult], server: str, tool: str) -> None:
        self._future, self.server, self.tool = future, server, tool

    def result(self, timeout: float | None = None) -> ToolResult:
        try:
            return self._future.result(timeout)
        except concurrent.futures.CancelledError:
            return ToolResult(self.server, self.tool, "the call was cancelled", is_error=True, failed=True)

    def cancel(self) -> None:
        self._future.cancel()

    def done(self) -> bool:
        return self._future.done()

    @property
    def future(self) -> concurrent.futures.Future[ToolResult]:
        return self._future


class Hub:
    """Several MCP servers, started together, their tools in one list."""

    def __init__(self, servers: Mapping[str, ServerConfig] | Iterable[ServerConfig], *, limits: Limits | None = None) -> None:
        items = servers.values() if isinstance(servers, Mapping) else servers
        self.servers: dict[str, ServerState] = {s.name: ServerState(s) for s in items}
        self.limits = limits or Limits()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None

    @classmethod
    def from_settings(cls, settings: Settings, names: Iterable[str] | None = None, **limits: Any) -> Hub:
        """The servers of the config's ``[mcp]`` table (``names``: these only, or
        all). An unknown name is a usage error naming the ones there are."""
        wanted = list(settings.servers) if names is None else list(names)
        unknown = [n for n in wanted if n not in settings.servers]
        if unknown:
            there = ", ".join(settings.servers) or "none"
            raise UsageError(f"no MCP server named {safe(unknown[0])!r} in {settings.source} (configured: {there}; "
                             "localllm mcp import FILE adds some)")
        return cls([settings.servers[n] for n in wanted],
                   limits=Limits(call_timeout=settings.call_timeout, start_timeout=settings.start_timeout, **limits))

    # -- the event loop's thread ---------------------------------------------------
    def _run(self, coro: Any) -> concurrent.futures.Future[Any]:
        if self._loop is None:
            loop = asyncio.new_event_loop()
            ready = threading.Event()

            def main() -> None:
                asyncio.set_event_loop(loop)
                loop.call_soon(ready.set)
                loop.run_forever()
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()

            self._thread = threading.Thread(target=main, name="localllm-mcp", daemon=True)
            self._thread.start()
            ready.wait()
            self._loop = loop
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    # -- servers -------------------------------------------------------------------
    def start(self) -> list[ServerState]:
        """Start every server not running, together; each has ``start_timeout``
        seconds to answer and list its tools. The servers that failed, each
        with its ``error`` line."""
        todo = [s for s in self.servers.values() if s.session is None and s.error is None]
        if todo:
            self._run(self._start_all(todo)).result()
        return [s for s in self.servers.values() if s.error is not None]

    async def _start_all(self, states: list[ServerState]) -> None:
        waits = []
        for s in states:
            ready: asyncio.Future[None] = asyncio.get_running_loop().create_future()
            s.stop = asyncio.Event()
            s.task = asyncio.get_running_loop().create_task(self._serve(s, ready))
            waits.append(ready)
        await asyncio.gather(*waits)

    async def _serve(self, s: ServerState, ready: asyncio.Future[None]) -> None:
        """One server's whole life in one task (the SDK's cancel scopes need it):
        connect, initialize, list, then wait for ``stop``."""
        import anyio  # lazy: with the SDK, only when a server starts

        t0 = time.perf_counter()
        try:
            async with AsyncExitStack() as stack:
                session = await self._connect(s, stack)  # spawning is quick; the contexts' scopes must not nest in the timeout's
                with anyio.fail_after(self.limits.start_timeout):
                    await session.initialize()
                    await self._list_tools(s, session)
                s.session = session
                s.started_ms = (time.perf_counter() - t0) * 1000
                ready.set_result(None)
                assert s.stop is not None
                await s.stop.wait()
                s.session = None
        except BaseException as exc:  # noqa: BLE001 - any failure of a server is its one line
            s.session = None
            if s.error is None and not (isinstance(exc, asyncio.CancelledError) and ready.done()):
                s.error = self._why(s, exc, starting=not ready.done())
            if not ready.done():
                ready.set_result(None)
            if isinstance(exc, (KeyboardInterrupt, SystemExit)):
                raise

    async def _connect(self, s: ServerState, stack: AsyncExitStack) -> Any:
        from mcp.client.session import ClientSession  # lazy: the SDK, ~1.5 s to import

        if s.config.command is not None:
            from localllm.mcp import transport  # lazy: imports the SDK

            s.log = transport.PipeLog()
            streams = await stack.enter_async_context(
                transport.bounded_stdio(s.config, max_message=self.limits.max_message_bytes, log=s.log))
        else:
            from mcp.client.streamable_http import streamable_http_client
            from mcp.shared._httpx_utils import create_mcp_http_client

            client = await stack.enter_async_context(create_mcp_http_client(headers=dict(s.config.headers)))
            assert s.config.url is not None
            streams = await stack.enter_async_context(streamable_http_client(s.config.url, http_client=client))
        return await stack.enter_async_context(ClientSession(streams[0], streams[1]))

    async def _list_tools(self, s: ServerState, session: Any) -> None:
        cursor = None
        listed = 0
        for _ in range(MAX_PAGES):
            page = await session.list_tools(params=None if cursor is None else _page(cursor))
            for t in page.tools:
                listed += 1
                if len(s.tools) >= self.limits.max_tools:
                    continue
                tool, why = check(s.config.name, t.name, t.description, t.input_schema)
                if tool is not None:
                    s.tools.append(tool)
                elif len(s.notices) < 8:
                    s.notices.append(why or "")
            cursor = page.next_cursor
            if cursor is None:
                break
        if listed > self.limits.max_tools:
            s.notices.append(f"{s.config.name}: lists {listed}{'+' if cursor else ''} tools: the first {self.limits.max_tools} are kept")
        elif cursor is not None:
            s.notices.append(f"{s.config.name}: lists tools over more than {MAX_PAGES} pages: the rest are left out")

    def _why(self, s: ServerState, exc: BaseException, *, starting: bool) -> str:
        name = s.config.name
        while getattr(exc, "exceptions", None):  # an ExceptionGroup: its first
            exc = exc.exceptions[0]  # type: ignore[attr-defined]
        if isinstance(exc, TimeoutError):
            what = f"did not answer within {self.limits.start_timeout:g} s (initialize and tools/list)" if starting else "timed out"
        elif isinstance(exc, FileNotFoundError):
            what = f"cannot start {safe(s.config.command)!r}: no such program (is it installed and on PATH?)"
        elif isinstance(exc, PermissionError):
            what = f"cannot start {safe(s.config.command)!r}: not executable"
        else:
            what = _describe(exc)
        log = s.log
        if log is not None and log.returncode is not None and log.returncode > 0:  # it exited of itself (not our signal)
            what += f" (it exited with status {log.returncode})"
        if log is not None and log.tail():
            what += f"; its last stderr line: {safe(log.tail())}"
        return f"{name}: {what}"

    @property
    def tools(self) -> list[Tool]:
        """The running servers' tools, server by server."""
        return [t for s in self.servers.values() if s.running for t in s.tools]

    @property
    def notices(self) -> list[str]:
        """One line per server that failed and per tool left out."""
        return [line for s in self.servers.values() for line in ([s.error] if s.error else []) + s.notices]

    def tool(self, name: str) -> Tool | None:
        return next((t for t in self.tools if t.name == name), None)

    # -- calls -----------------------------------------------------------------------
    def submit(self, name: str, arguments: dict[str, Any], *, server: str | None = None, timeout: float | None = None) -> PendingCall:
        """Start a call of the tool ``name`` (of ``server``, else the first
        server offering it); ``PendingCall.result`` waits for it."""
        tool = next((t for t in self.tools if t.name == name and server in (None, t.server)), None)
        where = server or (tool.server if tool else "?")
        if tool is None:
            done: concurrent.futures.Future[ToolResult] = concurrent.futures.Future()
            done.set_result(ToolResult(where, name, f"no tool named {safe(name)!r} is offered", is_error=True, failed=True))
            return PendingCall(done, where, name)
        bound = timeout or self.servers[tool.server].config.call_timeout or self.limits.call_timeout  # the call's, the server's, [mcp]'s
        return PendingCall(self._run(self._call(tool, arguments, bound)), tool.server, name)

    def call(self, name: str, arguments: dict[str, Any], *, server: str | None = None, timeout: float | None = None) -> ToolResult:
        """A call, waited for; Ctrl+C cancels it (the server is told) and goes on up."""
        pending = self.submit(name, arguments, server=server, timeout=timeout)
        try:
            return pending.result()
        except BaseException:
            pending.cancel()
            raise

    async def _call(self, tool: Tool, arguments: dict[str, Any], timeout: float) -> ToolResult:
        import anyio  # lazy: with the SDK

        s = self.servers[tool.server]
        t0 = time.perf_counter()

        def failed(text: str) -> ToolResult:
            return ToolResult(tool.server, tool.name, text, is_error=True, failed=True, elapsed_ms=(time.perf_counter() - t0) * 1000)

        if not s.running:
            return failed(f"{tool.server}: not running ({s.error or 'stopped'})")
        try:
            with anyio.fail_after(timeout):
                res = await s.session.call_tool(tool.name, arguments)
        except TimeoutError:
            return failed(f"{tool.server}: {tool.name} timed out after {timeout:g} s (the server was told to cancel it)")
        except Exception as exc:  # noqa: BLE001 - a server's failure is the call's one line
            why = _describe(exc)
            log = s.log
            if log is not None and log.flooded and "closed" in why:
                why = "it flooded its output, and is no longer read"
            if log is not None and log.returncode is not None or getattr(s.task, "done", lambda: False)():
                s.error = s.error or f"{tool.server}: {why}"
            if log is not None and log.tail() and "closed" in why:
                why += f"; its last stderr line: {safe(log.tail())}"
            return failed(f"{tool.server}: {tool.name} failed: {why}")
        text, size, truncated = result_text(res.content or (), res.structured_content, limit=self.limits.max_result_bytes)
        return ToolResult(tool.server, tool.name, text, is_error=bool(res.is_error), size=size, truncated=truncated,
                          elapsed_ms=(time.perf_counter() - t0) * 1000)

    # -- the end -----------------------------------------------------------------------
    def close(self) -> None:
        """Stop every server (bounded: stdin closed, then terminated, then killed)."""
        if self._loop is None:
            return
        try:
            self._run(self._stop_all()).result(timeout=15)
        except (concurrent.futures.TimeoutError, RuntimeError):
            pass
        self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(timeout=5)
        self._loop = None

    async def _stop_all(self) -> None:
        tasks = []
        for s in self.servers.values():
            if s.stop is not None:
                s.stop.set()
            if s.task is not None:
                tasks.append(s.task)
        if tasks:
            await asyncio.wait(tasks, timeout=10)

    def __enter__(self) -> Hub:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _page(cursor: str) -> Any:
    import mcp_types  # lazy: with the SDK

    return mcp_types.PaginatedRequestParams(cursor=cursor)


def _describe(exc: BaseException) -> str:
    """One line for an SDK or transport failure (an exception group: its first)."""
    while getattr(exc, "exceptions", None):  # an ExceptionGroup (anyio's task groups), on 3.10 too
        exc = exc.exceptions[0]  # type: ignore[attr-defined]
    name = type(exc).__name__
    text = safe(str(exc).strip().splitlines()[0] if str(exc).strip() else "")[:300]
    if name in ("ClosedResourceError", "BrokenResourceError", "EndOfStream") or "Connection closed" in text:
        return "the server closed the connection"
    return f"{text}" if text else name


def start_configured(spec: str, tell: Callable[[str], None]) -> tuple[Hub, Path | None]:
    """The servers ``spec`` names, started (a line each through ``tell`` for those
    that fail), and the config file they came from (the cockpit shows it)."""
    settings = load_settings()
    names = None if spec.strip() == "all" else [n.strip() for n in spec.split(",") if n.strip()]
    if names == [] or (names is None and not settings.servers):
        raise UsageError(f"--tools: no MCP servers are configured in {settings.source} (localllm mcp import FILE adds Claude "
                         "Desktop's or Cursor's)")
    hub = Hub.from_settings(settings, names)
    try:
        for failed in hub.start():
            tell(f"MCP server {failed.error}")
    except BaseException:
        hub.close()
        raise
    return hub, settings.source
