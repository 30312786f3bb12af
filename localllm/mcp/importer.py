"""MCP servers from other tools' JSON into localllm's config file.

Claude Desktop (``claude_desktop_config.json``), Cursor (``mcp.json``), LM
Studio (Cursor's format) and llama-server (``--mcp-servers-config``) all write
``{"mcpServers": {NAME: {"command", "args", "env"} | {"url", "headers"}}}``.
The file is untrusted: its size is bounded and every type checked; a server
that does not fit is left out with a line saying why, the others are taken.

The config file is the user's: the servers are appended as TOML tables, the
rest of the text is kept byte for byte, and the result is parsed again before
it replaces the old file (atomically).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path

from localllm.errors import InputError, UsageError
from localllm.mcp.config import NAME, TABLE, ServerConfig, parse_server, parse_settings
from localllm.util import atomic, config_toml
from localllm.util.fmt import safe

MAX_JSON_BYTES = 1024 * 1024
# keys other tools write that say nothing localllm needs (a transport named as the keys already say it)
_IGNORED = {"type", "transport", "description", "disabled", "autoApprove", "alwaysAllow", "timeout"}
_STDIO_TYPES = {None, "stdio"}
_HTTP_TYPES = {"http", "streamable-http", "streamableHttp", "streamable_http"}


@dataclass(frozen=True)
class Parsed:
    """The servers a JSON file declares, and a line for each left out."""

    servers: dict[str, ServerConfig]
    skipped: tuple[str, ...]


def read_json(path: Path, *, stdio_only: bool = False) -> Parsed:
    """``path``'s ``mcpServers``, bounded and checked."""
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_JSON_BYTES + 1)
    except OSError as exc:
        raise InputError(f"{path}: unreadable ({exc.strerror or exc})") from None
    if len(data) > MAX_JSON_BYTES:
        raise InputError(f"{path}: larger than {MAX_JSON_BYTES // 1024} KiB: not an MCP servers file")
    return parse_json(data, str(path), stdio_only=stdio_only)


def parse_json(data: bytes | str, where: str, *, stdio_only: bool = False) -> Parsed:
    """``{"mcpServers": {...}}`` as text. ``stdio_only``: llama-server's shape,
    where ``command`` is required."""
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise InputError(f"{where}: not valid JSON ({str(exc)[:120]})") from None
    servers = doc.get("mcpServers") if isinstance(doc, dict) else None
    if not isinstance(servers, dict):
        raise InputError(f"{where}: no \"mcpServers\" object (Claude Desktop's, Cursor's and llama-server's format)")
    out: dict[str, ServerConfig] = {}
    skipped: list[str] = []
    for name, entry in servers.items():
        try:
            out[name] = _server(name, entry, where, stdio_only)
        except UsageError as exc:
            skipped.append(str(exc))
    return Parsed(out, tuple(skipped))


def _server(name: str, entry: object, where: str, stdio_only: bool) -> ServerConfig:
    here = f"{where}: server {safe(name)!r}"
    if not NAME.match(name):
        raise UsageError(f"{here}: left out: a name is 1 to 64 letters, digits, '_', '.' or '-' (rename it in the file)")
    if not isinstance(entry, dict):
        raise UsageError(f"{here}: left out: not an object")
    kind = entry.get("type", entry.get("transport"))
    if kind not in _STDIO_TYPES | _HTTP_TYPES:
        raise UsageError(f"{here}: left out: transport {safe(kind)!r} is not supported (stdio and streamable HTTP are)")
    if entry.get("disabled") is True:
        raise UsageError(f"{here}: left out: disabled in the file")
    if stdio_only and "command" not in entry:
        raise UsageError(f"{here}: left out: no \"command\" (only stdio servers are taken here)")
    timeout_ms = entry.get("timeout_ms")  # llama-server's per-server bound on a call (its --mcp-servers-config)
    if timeout_ms is not None and (isinstance(timeout_ms, bool) or not isinstance(timeout_ms, (int, float)) or not 0 < timeout_ms <= 86_400_000):
        raise UsageError(f"{here}: left out: \"timeout_ms\" must be a number of milliseconds above 0 (at most a day)")
    table = {k: v for k, v in entry.items() if k not in _IGNORED and k != "timeout_ms"}
    server = parse_server(name, table, f"{here}: left out")
    return replace(server, call_timeout=timeout_ms / 1000) if timeout_ms is not None else server


def toml_string(text: str) -> str:
    """``text`` as a TOML basic string (JSON's escapes, which TOML shares, and DEL,
    which TOML forbids raw)."""
    return json.dumps(text, ensure_ascii=False).replace("\x7f", "\\u007f")


def _key(name: str) -> str:
    return name if re.fullmatch(r"[A-Za-z0-9_-]+", name) else toml_string(name)


def _inline(pairs: dict[str, str]) -> str:
    return "{ " + ", ".join(f"{toml_string(k)} = {toml_string(v)}" for k, v in pairs.items()) + " }"


def server_toml(server: ServerConfig) -> str:
    """``[mcp.servers.NAME]`` and its keys."""
    lines = [f"[{TABLE}.servers.{_key(server.name)}]"]
    for key, value in server.to_dict().items():
        if isinstance(value, dict):
            lines.append(f"{key} = {_inline(value)}")
        elif isinstance(value, list):
            lines.append(f"{key} = [{', '.join(toml_string(v) for v in value)}]")
        else:
            lines.append(f"{key} = {toml_string(value)}")
    return "\n".join(lines) + "\n"


_HEADER = re.compile(r"^\s*\[\[?\s*(.*?)\s*\]\]?\s*(#.*)?$")


def _without(text: str, name: str) -> str:
    """``text`` without the ``[mcp.servers.NAME]`` table (and its sub-tables)."""
    wanted = {f"{TABLE}.servers.{_key(name)}", f"{TABLE}.servers.{toml_string(name)}"}
    out: list[str] = []
    dropping = False
    for line in text.splitlines(keepends=True):
        m = _HEADER.match(line)
        if m:
            header = re.sub(r"\s*\.\s*", ".", m.group(1))
            dropping = any(header == w or header.startswith(w + ".") for w in wanted)
        if not dropping:
            out.append(line)
    return "".join(out)


def add_servers(path: Path, servers: dict[str, ServerConfig], *, force: bool = False) -> tuple[list[str], list[str]]:
    """Write ``servers`` into the config file at ``path``: (added, replaced)
    names. A name the file has already is refused unless ``force``."""
    text = config_toml.read_text(path) or ""
    current = parse_settings(config_toml.parse(text, path).get(TABLE, {}), path).servers
    clash = sorted(set(servers) & set(current))
    if clash and not force:
        raise UsageError(f"{path}: already has the MCP server(s) {', '.join(clash)}: add --force to replace them")
    for name in clash:
        text = _without(text, name)
    if text and not text.endswith("\n"):
        text += "\n"
    text += ("\n" if text else "") + "\n".join(server_toml(s) for s in servers.values())
    try:  # what is written must read back as exactly these servers
        after = parse_settings(config_toml.parse(text, path).get(TABLE, {}), path).servers
    except UsageError as exc:
        raise UsageError(f"{path}: cannot add the servers to this file by appending tables ({exc}): edit it by hand") from None
    if any(after.get(name) != s for name, s in servers.items()):
        raise UsageError(f"{path}: the servers are written in a way this file overrides: edit it by hand")
    atomic.write_text(path, text)
    return sorted(set(servers) - set(clash)), clash


def allow_tool(path: Path, server: str, tool: str) -> bool:
    """"Always allow" kept in the config: ``tool`` added to ``[mcp.servers.SERVER]``'s
    ``allow`` list (the cockpit's choice). That server's table is written anew at
    the end of the file; the rest of the text stays as it was. False when it
    was allowed already."""
    text = config_toml.read_text(path) or ""
    current = parse_settings(config_toml.parse(text, path).get(TABLE, {}), path).servers
    if server not in current:
        raise UsageError(f"{path}: no MCP server named {safe(server)!r}")
    old = current[server]
    if tool in old.allow:
        return False
    new = replace(old, allow=(*old.allow, tool))
    kept = _without(text, server).rstrip("\n")
    text = (kept + "\n\n" if kept else "") + server_toml(new)
    try:
        after = parse_settings(config_toml.parse(text, path).get(TABLE, {}), path).servers
    except UsageError as exc:
        raise UsageError(f"{path}: cannot rewrite [mcp.servers.{server}] ({exc}): add allow = [\"{tool}\"] by hand") from None
    if after.get(server) != new or set(after) != set(current):
        raise UsageError(f"{path}: [mcp.servers.{server}] is written in a way this file overrides: add allow = [\"{tool}\"] by hand")
    atomic.write_text(path, text)
    return True
