"""MCP (Model Context Protocol) servers' tools for localllm's chats: the library.

``localllm.mcp`` is what ``localllm chat --tools``, ``localllm mcp``, the
cockpit and ``serve`` use::

    from localllm import mcp

    settings = mcp.load_settings()            # the config file's [mcp.servers.NAME]
    with mcp.Hub.from_settings(settings) as hub:
        for failed in hub.start():            # concurrently, each bounded
            print(failed.error)
        print([t.name for t in hub.tools])
        print(hub.call("add", {"a": 1, "b": 2}).text)

``ToolChat`` (``mcp/agent.py``) runs a chat whose model calls them, with an
approval for each call (``ToolChat.cancel`` stops one in flight; ``allow_tool``
keeps an "always allow" in the config). The ``mcp`` SDK is imported only when a
server starts.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

# name -> the module that defines it: loaded on first use (PEP 562), so that the
# config file's check (``localllm.mcp.config``, on every command) does not import
# asyncio with the hub (~60 ms here); ``import localllm.mcp`` alone takes ~2 ms.
_API = {
    "Hub": "localllm.mcp.hub", "Limits": "localllm.mcp.hub", "PendingCall": "localllm.mcp.hub", "ServerState": "localllm.mcp.hub",
    "ServerConfig": "localllm.mcp.config", "Settings": "localllm.mcp.config", "load_settings": "localllm.mcp.config",
    "parse_settings": "localllm.mcp.config", "Tool": "localllm.mcp.tools", "ToolResult": "localllm.mcp.tools",
    "ToolChat": "localllm.mcp.agent", "Decision": "localllm.mcp.agent", "ToolCall": "localllm.mcp.agent",
    "allow_tool": "localllm.mcp.importer",
}

__all__ = ["Decision", "Hub", "Limits", "PendingCall", "ServerConfig", "ServerState", "Settings", "Tool", "ToolCall", "ToolChat",
           "ToolResult", "allow_tool", "load_settings", "parse_settings"]

if TYPE_CHECKING:
    from localllm.mcp.agent import Decision, ToolCall, ToolChat
    from localllm.mcp.config import ServerConfig, Settings, load_settings, parse_settings
    from localllm.mcp.hub import Hub, Limits, PendingCall, ServerState
    from localllm.mcp.importer import allow_tool
    from localllm.mcp.tools import Tool, ToolResult


def __getattr__(name: str) -> Any:
    if name in _API:
        import importlib  # lazy: the names are loaded on first use, see above

        value = getattr(importlib.import_module(_API[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'localllm.mcp' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_API))
