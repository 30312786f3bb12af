"""A real MCP server over stdio, on the SDK's MCPServer (FastMCP in mcp 1.x):
the tools the tests call. Run as a script: ``python tiny.py``; ``python tiny.py
--http PORT`` serves the same tools over streamable HTTP on 127.0.0.1:PORT/mcp."""

import asyncio
import json
import os
import sys

from mcp.server.mcpserver import Context, MCPServer

app = MCPServer("tiny")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two whole numbers."""
    return a + b


@app.tool()
async def sleep(seconds: float) -> str:
    """Sleep, then say so (a slow tool, to time out or cancel)."""
    await asyncio.sleep(seconds)
    return "slept"


@app.tool()
def fail(why: str) -> str:
    """Always fails, with ``why``."""
    raise ValueError(why)


@app.tool()
def flood(n: int) -> str:
    """``n`` characters of text."""
    return "x" * n


@app.tool()
def echo(text: str) -> str:
    """``text`` back, as it is (control tokens included)."""
    return text


@app.tool()
def environment() -> str:
    """The names of the server's environment variables (and LOCALLLM_API_KEY's value if set)."""
    return json.dumps({"names": sorted(os.environ), "key": os.environ.get("LOCALLLM_API_KEY")})


def header(name: str, ctx: Context) -> str:
    """The value of the request's header ``name`` (offered over HTTP only: the stdio tests count six tools)."""
    return (ctx.headers or {}).get(name.lower(), "")


if __name__ == "__main__":
    if sys.argv[1:2] == ["--http"]:
        app.tool()(header)
        app.run("streamable-http", port=int(sys.argv[2]))
    else:
        app.run()
