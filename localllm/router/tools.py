"""``GET``/``POST /tools`` in router mode: answered by the router itself, not by a
model's child, as llama-server's router answers them (its MCP servers and
built-in tools belong to the server, not to a model): ``serve`` with no MODEL
and ``--tools``, ``--mcp-servers-config`` or ``--mcp-servers-json``.

An ASGI layer in front of the router's app (``proxy.Router``): ``/tools`` is
checked against the API key as the router checks every route, then answered by
``serve.mcp_routes`` (the same answers as ``serve MODEL``); every other path
goes on to the router. Without tools configured it is llama-server's 403.
"""

from __future__ import annotations

from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

from starlette.requests import ClientDisconnect, Request
from starlette.responses import JSONResponse

from localllm.router.proxy import read_body
from localllm.serve import mcp_routes
from localllm.serve.app import authorized
from localllm.serve.protocol import error_body, parse_json
from localllm.server_tools import Toolbox

MAX_BODY = 8 * 1024 * 1024  # a /tools call's body: write_file's content is the large part


class ToolsGate:
    """``/tools`` over ``mcp`` (a started ``localllm.mcp.Hub``, or None) and the built-in
    tools ``tools`` names; the rest to ``inner``. ``log`` is the router's log line,
    ``count`` counts a request the router did not see."""

    def __init__(self, inner: Any, *, key: str | None, mcp: Any, tools: tuple[str, ...], log: Callable[..., None],
                 count: Callable[[], None] = lambda: None) -> None:
        self.inner, self.count = inner, count
        self.key = key.encode() if key else None
        self.toolbox = Toolbox(tools) if tools else None
        self.state = SimpleNamespace(mcp=mcp, server_tools=self.toolbox, log=log)
        self.tools = mcp_routes.Tools(self.state, _read_json)

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http" or scope["path"] not in mcp_routes.PATHS:
            await self.inner(scope, receive, send)
            return
        self.count()
        method, path = scope["method"], scope["path"]
        if self.key is not None and not authorized(scope, self.key):
            self.state.log(method, path, 401)
            await JSONResponse(error_body("missing or wrong API key: send 'Authorization: Bearer KEY' (or 'x-api-key: KEY')",
                                          kind="authentication_error", code="invalid_api_key"),
                               status_code=401, headers={"WWW-Authenticate": "Bearer"})(scope, receive, send)
            return
        if method not in ("GET", "HEAD", "POST"):
            self.state.log(method, path, 405)
            await JSONResponse(error_body(f"method not allowed here: {method} {path}"[:300]), status_code=405,
                               headers={"Allow": "GET, POST"})(scope, receive, send)
            return
        try:
            response = await self.tools.endpoint(Request(scope, receive))
        except ClientDisconnect:
            return  # gone before its body came: nobody to answer
        await response(scope, receive, send)

    def abort(self) -> int:
        """The router is stopping: the tool calls in flight end now (``mcp_routes.Tools.abort``)."""
        return self.tools.abort()


async def _read_json(request: Request) -> dict:
    """The body, at most ``MAX_BODY`` bytes (413 past it), as a JSON object (400 if not one)."""
    return parse_json(await read_body(request, MAX_BODY))
