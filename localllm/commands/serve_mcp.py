"""``serve --mcp-servers-config FILE`` / ``--mcp-servers-json JSON``: llama-server's
``{"mcpServers": {NAME: {"command", "args", "env"}}}`` (stdio servers, ``command``
required), started before the model loads and handed to the app as
``state.mcp`` for ``GET``/``POST /tools`` (``serve/mcp_routes.py``). A server
that fails is one line and left out; serve goes on, as llama-server does."""

from __future__ import annotations

from pathlib import Path

from localllm.errors import UsageError
from localllm.mcp import importer
from localllm.mcp.config import load_settings
from localllm.mcp.hub import Hub, Limits
from localllm.util.fmt import safe


def hub_from_flags(file: str | None, text: str | None, say) -> Hub | None:
    """The started hub from ``--mcp-servers-config FILE`` / ``--mcp-servers-json JSON``, or None when neither is given."""
    if file is None and text is None:
        return None
    if file is not None and text is not None:
        raise UsageError("give --mcp-servers-config or --mcp-servers-json, not both")
    if file is not None:
        parsed = importer.read_json(Path(file).expanduser(), stdio_only=True)
    else:
        parsed = importer.parse_json(str(text), "--mcp-servers-json", stdio_only=True)
    for line in parsed.skipped:
        say(safe(line))
    settings = load_settings()  # the config file's [mcp] timeouts apply here too
    hub = Hub(parsed.servers.values(), limits=Limits(call_timeout=settings.call_timeout, start_timeout=settings.start_timeout))
    for failed in hub.start():
        say(f"MCP server {failed.error}")
    for line in hub.notices:
        if not any(line == s.error for s in hub.servers.values()):
            say(line)
    say(f"MCP: {len(hub.tools)} tool(s) of {sum(s.running for s in hub.servers.values())} server(s) on GET/POST /tools")
    return hub
