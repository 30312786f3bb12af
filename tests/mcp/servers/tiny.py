"""A real MCP server over stdio, on the SDK's MCPServer (FastMCP in mcp 1.x):
the tools the tests call. Run as a script: ``python tiny.py``."""

import asyncio
import json
import os

from mcp.server.mcpserver import MCPServer

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


if __name__ == "__main__":
    app.run()
