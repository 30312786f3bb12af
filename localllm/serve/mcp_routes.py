"""``GET /tools`` and ``POST /tools``: the MCP servers of ``serve
--mcp-servers-config``/``--mcp-servers-json``, as llama-server serves them
(tools/server/server-tools.cpp, and its tests' test_mcp_servers.py).

A tool is named ``<server>_<tool>``; ``GET /tools`` lists each as
llama-server's tool object (``display_name``, ``tool``, ``type: "mcp"``,
``permissions``, ``definition``: the OpenAI function); ``POST /tools
{"tool", "params"}`` calls one and answers ``{"plain_text_response": text}``
or ``{"error": line}``, bounded as every MCP call is (``localllm.mcp``).

Off unless configured (403 with the flag to give, as llama-server answers
without ``--tools``); behind the API key as every route. A chat completion
never runs a tool: ``tool_calls`` still go back to the client.

The hub is handed in by the command (``commands/serve.py``) as ``state.mcp``:
the server does not start MCP servers itself, and does not import
``localllm.mcp``, which sits above it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from localllm.serve.protocol import RequestError, error_body

PATHS = ("/tools",)
OFF = "tools are off: start serve with --mcp-servers-config FILE or --mcp-servers-json JSON (llama-server's mcpServers shape)"


def name(tool: Any) -> str:
    """llama-server's name of an MCP tool: ``<server>_<tool>``."""
    return f"{tool.server}_{tool.name}"


def listing(hub: Any) -> list[dict[str, Any]]:
    out = []
    for t in hub.tools:
        fn = {"name": name(t), "description": t.description, "parameters": t.schema}
        out.append({"display_name": name(t), "tool": name(t), "type": "mcp", "permissions": {"write": False}, "uses_cwd": False,
                    "definition": {"type": "function", "function": fn}})
    return out


def routes(state: Any, read_json: Callable[[Request], Awaitable[dict]]) -> list[Route]:
    """``/tools``, GET and POST, over ``state.mcp`` (a ``localllm.mcp.Hub``, or None: off)."""

    async def tools(request: Request) -> Response:
        request.scope["localllm.logged"] = True
        method, path = request.method, request.url.path
        hub = getattr(state, "mcp", None)
        if hub is None:
            state.log(method, path, 403, "no MCP servers configured")
            return JSONResponse(error_body(OFF, kind="permission_error"), status_code=403)
        if method == "GET":
            body = listing(hub)
            state.log(method, path, 200, f"{len(body)} tools")
            return JSONResponse(body)
        try:
            req = await read_json(request)
            tool, params = req.get("tool"), req.get("params", {})
            if not isinstance(tool, str):
                raise RequestError(400, "'tool' must be a tool's name, as GET /tools lists it", param="tool")
            if params is None:
                params = {}
            if not isinstance(params, dict):
                raise RequestError(400, "'params' must be an object of the tool's arguments", param="params")
            found = next((t for t in hub.tools if name(t) == tool), None)
            if found is None:
                raise RequestError(404, f"no tool named {tool[:80]!r} (GET /tools lists them)", param="tool")
        except RequestError as exc:
            state.log(method, path, exc.status, exc.message)
            return JSONResponse(exc.body(), status_code=exc.status)
        pending = hub.submit(found.name, params, server=found.server)
        try:
            result = await asyncio.wrap_future(pending.future)
        except asyncio.CancelledError:  # the client went away: the server is told to cancel
            pending.cancel()
            raise
        state.log(method, path, 200, f"{tool}: {'error' if result.is_error else 'ok'}, {result.size} bytes, {result.elapsed_ms:.0f} ms")
        if result.is_error:
            return JSONResponse({"error": result.text})
        return JSONResponse({"plain_text_response": result.text})

    return [Route(p, tools, methods=["GET", "POST"]) for p in PATHS]
