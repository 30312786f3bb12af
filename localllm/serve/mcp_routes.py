"""``GET /tools`` and ``POST /tools``: llama-server's built-in tools (``--tools``,
``localllm.server_tools``) and the MCP servers of ``--mcp-servers-config``/
``--mcp-servers-json``, as llama-server serves them (tools/server/server-tools.cpp,
and its tests' test_tools_builtin.py and test_mcp_servers.py). ``serve MODEL``
mounts them in its app; the router (``router/tools.py``) in front of its own.

``GET /tools`` lists llama-server's tool objects (``display_name``, ``tool``,
``type``: ``builtin`` or ``mcp``, ``permissions``, ``uses_cwd``, ``definition``:
the OpenAI function), the built-ins first; an MCP tool is named
``<server>_<tool>``, and one whose name a built-in (or an earlier MCP tool)
has is left out, as llama-server leaves it out. ``POST /tools {"tool",
"params", "stream"}`` calls one: a built-in answers its own fields
(``plain_text_response``, ``result``, ``error`` ...), an MCP tool
``{"plain_text_response": text}`` or ``{"error": line}``; ``exec_shell_command``
with ``"stream": true`` answers server-sent events (``{"chunk"}`` ..., then
``{"done": true}``, with ``error`` if it failed).

The headers ``x-tool-cwd``, ``x-tool-runtime`` and ``x-resp-type`` set where a
built-in runs and how read_file answers; the same keys in ``params`` (the
model's) are dropped, as llama-server drops them. Statuses as llama-server's:
400 for a body or a parameter that is not what the tool takes, 404 for an
unknown tool (or one that cannot stream), 500 for a refused runtime.

Off unless configured (403 naming the flags, as llama-server answers 403);
behind the API key as every route. A chat completion never runs a tool:
``tool_calls`` still go back to the client. ``abort()`` (the server is
stopping) ends the calls in flight at once, each with an ``error`` line.

The hub and the toolbox are handed in (``state.mcp``, ``state.server_tools``):
the server does not start MCP servers itself, and does not import
``localllm.mcp``, which sits above it.
"""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from localllm.serve.protocol import RequestError, error_body
from localllm.server_tools import Context, Toolbox, ToolError
from localllm.util.fmt import safe

PATHS = ("/tools",)
OFF = ("tools are off: start serve with --tools NAME,NAME|all (llama-server's built-in tools) or --mcp-servers-config FILE / "
       "--mcp-servers-json JSON (llama-server's mcpServers shape)")
HEADERS = {"cwd": "x-tool-cwd", "runtime": "x-tool-runtime", "resp_type": "x-resp-type"}
STOPPING = "the server is stopping: the call was cancelled"


def name(tool: Any) -> str:
    """llama-server's name of an MCP tool: ``<server>_<tool>``."""
    return f"{tool.server}_{tool.name}"


def mcp_tools(hub: Any, taken: frozenset[str] | set[str] = frozenset()) -> list[Any]:
    """The hub's tools that ``/tools`` serves: the first of each name not in ``taken``."""
    seen, out = set(taken), []
    for t in hub.tools:
        if name(t) not in seen:
            seen.add(name(t))
            out.append(t)
    return out


def listing(hub: Any, taken: frozenset[str] | set[str] = frozenset()) -> list[dict[str, Any]]:
    out = []
    for t in mcp_tools(hub, taken):
        schema = t.schema if isinstance(t.schema, dict) else {}
        fn = {"name": name(t), "description": t.description, "parameters": schema}
        out.append({"display_name": name(t), "tool": name(t), "type": "mcp", "permissions": {"write": False}, "uses_cwd": False,
                    "definition": {"type": "function", "function": fn}})
    return out


class Tools:
    """The ``/tools`` endpoint over ``state.mcp`` (a ``localllm.mcp.Hub``, or None) and
    ``state.server_tools`` (a ``localllm.server_tools.Toolbox``, or None); ``state.log``
    logs each answer."""

    def __init__(self, state: Any, read_json: Callable[[Request], Awaitable[dict]]) -> None:
        self.state, self.read_json = state, read_json
        self.stopping = False
        self._pending: dict[int, Any] = {}  # MCP calls in flight (their PendingCall), by id

    def abort(self) -> int:
        """The server is stopping: every MCP call in flight is cancelled (its server told), every
        built-in command killed, and each answers an ``error`` line. How many MCP calls there were."""
        self.stopping = True
        pending, self._pending = list(self._pending.values()), {}
        for p in pending:
            p.cancel()
        box = getattr(self.state, "server_tools", None)
        if box is not None:
            box.stop()
        return len(pending)

    async def endpoint(self, request: Request) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        hub, box = getattr(self.state, "mcp", None), getattr(self.state, "server_tools", None)
        if hub is None and box is None:
            self.state.log(method, path, 403, "no tools configured")
            return JSONResponse(error_body(OFF, kind="permission_error"), status_code=403)
        builtin = set(box.names) if box is not None else set()
        if method in ("GET", "HEAD"):
            body = (box.listing() if box is not None else []) + (listing(hub, builtin) if hub is not None else [])
            self.state.log(method, path, 200, f"{len(body)} tools")
            return JSONResponse(body)
        try:
            req = await self.read_json(request)
            tool, params, stream = req.get("tool"), req.get("params", {}), req.get("stream", False)
            if not isinstance(tool, str):
                raise RequestError(400, "'tool' must be a tool's name, as GET /tools lists it", param="tool")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RequestError(400, "'params' must be an object of the tool's arguments", param="params")
            if not isinstance(stream, bool):
                raise RequestError(400, "'stream' must be true or false", param="stream")
            if box is not None and tool in builtin:
                return await self._builtin(request, box, tool, params, stream)
            found = next((t for t in mcp_tools(hub, builtin) if name(t) == tool), None) if hub is not None else None
            if found is None:
                raise RequestError(404, f"no tool named {safe(tool[:80])!r} (GET /tools lists them)", param="tool")
            if stream:
                raise RequestError(404, f"tool \"{safe(tool)}\" does not support stream = true", param="stream")
        except RequestError as exc:
            self.state.log(method, path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        return await self._mcp(method, path, hub, found, tool, params)

    async def _mcp(self, method: str, path: str, hub: Any, found: Any, tool: str, params: dict) -> Response:
        if self.stopping:
            return JSONResponse({"error": STOPPING})
        pending = hub.submit(found.name, params, server=found.server)
        self._pending[id(pending)] = pending
        try:
            result = await asyncio.wrap_future(pending.future)
        except asyncio.CancelledError:
            pending.cancel()  # the client went away (its server is told to cancel), or abort() cancelled it
            if self.stopping:
                self.state.log(method, path, 200, f"{tool}: cancelled, the server is stopping")
                return JSONResponse({"error": STOPPING})
            raise
        finally:
            self._pending.pop(id(pending), None)
        self.state.log(method, path, 200, f"{tool}: {'error' if result.is_error else 'ok'}, {result.size} bytes, {result.elapsed_ms:.0f} ms")
        if result.is_error:
            return JSONResponse({"error": result.text})
        return JSONResponse({"plain_text_response": result.text})

    async def _builtin(self, request: Request, box: Toolbox, tool: str, params: dict, stream: bool) -> Response:
        method, path = request.method, request.url.path
        params = {k: v for k, v in params.items() if k not in HEADERS}  # the model cannot choose where a tool runs
        ctx = Context(**{k: request.headers.get(h) or None for k, h in HEADERS.items()})
        if stream:
            return self._streamed(request, box, tool, params, ctx)
        try:
            result = await asyncio.wrap_future(box.submit(tool, params, ctx))
        except asyncio.CancelledError:
            if self.stopping:  # abort(): the toolbox's queue was dropped
                self.state.log(method, path, 200, f"{tool}: cancelled, the server is stopping")
                return JSONResponse({"error": STOPPING})
            raise
        except ToolError as exc:
            self.state.log(method, path, exc.status, exc.message)
            return JSONResponse(error_body(exc.message, kind=exc.kind, param=exc.param), status_code=exc.status)
        except Exception as exc:  # noqa: BLE001 - a tool's own failure is one line to the client, never a traceback
            line = f"{tool} failed: {type(exc).__name__}: {safe(str(exc))[:300]}"
            self.state.log(method, path, 500, line)
            return JSONResponse(error_body(line, kind="server_error"), status_code=500)
        self.state.log(method, path, 200, f"{tool}: {'error: ' + safe(str(result.get('error')))[:200] if result and 'error' in result else 'ok'}")
        return JSONResponse(result)

    def _streamed(self, request: Request, box: Toolbox, tool: str, params: dict, ctx: Context) -> Response:
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[str] = asyncio.Queue()
        gone = threading.Event()  # the client went away: the command is killed

        def push(text: str) -> bool:  # on the tool's thread
            if gone.is_set():
                return False
            loop.call_soon_threadsafe(queue.put_nowait, text)
            return True

        try:
            future = box.submit(tool, params, ctx, push, gone)
        except ToolError as exc:
            self.state.log(request.method, request.url.path, exc.status, exc.message)
            return JSONResponse(error_body(exc.message, kind=exc.kind, param=exc.param), status_code=exc.status)

        async def events() -> AsyncIterator[bytes]:
            done = asyncio.wrap_future(future)
            try:
                while True:
                    get = asyncio.ensure_future(queue.get())
                    waits: set[asyncio.Future[Any]] = {get, done}
                    finished, _ = await asyncio.wait(waits, return_when=asyncio.FIRST_COMPLETED)
                    if get not in finished:
                        get.cancel()
                        break
                    yield _event({"chunk": get.result()})
                while not queue.empty():
                    yield _event({"chunk": queue.get_nowait()})
                exc = None if done.cancelled() else done.exception()
                end: dict[str, Any] = {"done": True}
                if done.cancelled():
                    end["error"] = STOPPING
                elif exc is not None:
                    end["error"] = exc.message if isinstance(exc, ToolError) else f"{type(exc).__name__}: {safe(str(exc))[:300]}"
                self.state.log(request.method, request.url.path, 200, f"{tool}: streamed{', ' + end['error'] if 'error' in end else ''}")
                yield _event(end)
            finally:
                gone.set()  # the generator closed (the client went away, or all was sent): a command still running is killed

        return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})


def _event(data: dict[str, Any]) -> bytes:
    return b"data: " + json.dumps(data, ensure_ascii=False).encode("utf-8", errors="replace") + b"\n\n"


def routes(state: Any, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """``/tools``, GET and POST, over ``state.mcp`` and ``state.server_tools`` (either may be None)."""
    tools = Tools(state, read_json)
    return [Route(p, tools.endpoint, methods=["GET", "POST"]) for p in PATHS]
