"""MCP servers as the config file declares them: ``[mcp.servers.NAME]`` tables.

A stdio server is a command localllm starts (``command``, ``args``, ``env``,
``cwd``); a streamable-HTTP server is a ``url`` (with ``headers``). ``allow``
lists tools that run without asking. ``[mcp]`` itself may set ``timeout`` (the
seconds a tool call may take, default 60) and ``start-timeout`` (the seconds
a server has to start and list its tools, default 30).

The file is untrusted as the rest of the config is: every key and type is
checked, and a bad one is one line naming the file and the key (exit 2).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.errors import UsageError
from localllm.util import config_toml
from localllm.util.fmt import safe

TABLE = "mcp"
NAME = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")  # a server's name: typed in --tools NAME,NAME
MAX_SERVERS = 64
MAX_ARGS = 256
MAX_STRING = 8192  # one argument, variable, header or URL
DEFAULT_CALL_TIMEOUT = 60.0
DEFAULT_START_TIMEOUT = 30.0
_SERVER_KEYS = {"command", "args", "env", "cwd", "url", "headers", "allow"}
_TOP_KEYS = {"servers", "timeout", "start-timeout"}


@dataclass(frozen=True)
class ServerConfig:
    """One MCP server: stdio (``command``) or streamable HTTP (``url``)."""

    name: str
    command: str | None = None
    args: tuple[str, ...] = ()
    env: tuple[tuple[str, str], ...] = ()  # pairs, so that the record stays frozen and hashable
    cwd: str | None = None
    url: str | None = None
    headers: tuple[tuple[str, str], ...] = ()
    allow: tuple[str, ...] = ()  # tools that run without asking ("always allow", kept in the config)
    call_timeout: float | None = None  # seconds a call of its tools may take (llama-server's "timeout_ms"); None: the [mcp] limit

    @property
    def transport(self) -> str:
        return "stdio" if self.command is not None else "http"

    def to_dict(self) -> dict[str, Any]:
        """The table as the config file writes it (no empty keys)."""
        out: dict[str, Any] = {}
        if self.command is not None:
            out["command"] = self.command
            if self.args:
                out["args"] = list(self.args)
            if self.env:
                out["env"] = dict(self.env)
            if self.cwd is not None:
                out["cwd"] = self.cwd
        else:
            out["url"] = self.url
            if self.headers:
                out["headers"] = dict(self.headers)
        if self.allow:
            out["allow"] = list(self.allow)
        return out


@dataclass(frozen=True)
class Settings:
    """The ``[mcp]`` table: its servers and the bounds of a call."""

    servers: dict[str, ServerConfig] = field(default_factory=dict)
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    start_timeout: float = DEFAULT_START_TIMEOUT
    source: Path | None = None  # the file they came from, for messages


def load_settings(path: Path | None = None) -> Settings:
    """The config file's ``[mcp]`` table, checked ({} of servers when there is none)."""
    path = path or paths.config_file()
    table = config_toml.read(path)
    if TABLE not in table:
        return Settings(source=path)
    return parse_settings(table[TABLE], path)


def parse_settings(value: object, path: Path) -> Settings:
    """The ``[mcp]`` table's value, checked; a bad key is one line naming ``path``."""
    if not isinstance(value, dict):
        raise UsageError(f"{path}: mcp must be a table: [mcp.servers.NAME] with command = \"...\" or url = \"...\"")
    unknown = [k for k in value if k not in _TOP_KEYS]
    if unknown:
        raise UsageError(f"{path}: [mcp] has no key {safe(unknown[0])!r} (it takes servers, timeout and start-timeout)")
    servers = value.get("servers", {})
    if not isinstance(servers, dict):
        raise UsageError(f"{path}: mcp.servers must be a table of servers: [mcp.servers.NAME]")
    if len(servers) > MAX_SERVERS:
        raise UsageError(f"{path}: more than {MAX_SERVERS} MCP servers")
    parsed = {name: parse_server(name, table, f"{path}: [mcp.servers.{name}]") for name, table in servers.items()}
    return Settings(servers=parsed, call_timeout=_seconds(value, "timeout", DEFAULT_CALL_TIMEOUT, path),
                    start_timeout=_seconds(value, "start-timeout", DEFAULT_START_TIMEOUT, path), source=path)


def _seconds(table: dict[str, Any], key: str, default: float, path: Path) -> float:
    value = table.get(key, default)
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= 86400:
        raise UsageError(f"{path}: mcp.{key} = {value!r}: give seconds, more than 0 and at most 86400")
    return float(value)


def parse_server(name: object, table: object, where: str) -> ServerConfig:
    """One server's table, checked; ``where`` starts each error line."""
    if not isinstance(name, str) or not NAME.match(name):
        raise UsageError(f"{safe(where)}: a server's name is 1 to 64 letters, digits, '_', '.' or '-'")
    if not isinstance(table, dict):
        raise UsageError(f"{where}: must be a table with command = \"...\" (stdio) or url = \"...\" (HTTP)")
    unknown = [k for k in table if k not in _SERVER_KEYS]
    if unknown:
        raise UsageError(f"{where}: no key {safe(unknown[0])!r} (a server takes command, args, env, cwd; or url, headers; and allow)")
    command, url = table.get("command"), table.get("url")
    if (command is None) == (url is None):
        raise UsageError(f"{where}: give command = \"...\" (a stdio server) or url = \"...\" (streamable HTTP), one of them")
    allow = _strings(table.get("allow", []), f"{where}: allow")
    if command is not None:
        if table.get("headers") is not None:
            raise UsageError(f"{where}: headers go with url, not with command")
        cwd = table.get("cwd")
        if cwd is not None and not _is_text(cwd):
            raise UsageError(f"{where}: cwd must be a folder's path as a string")
        return ServerConfig(name, command=_string(command, f"{where}: command"), args=_strings(table.get("args", []), f"{where}: args"),
                            env=_pairs(table.get("env", {}), f"{where}: env"), cwd=cwd, allow=allow)
    for key in ("args", "env", "cwd"):
        if table.get(key) is not None:
            raise UsageError(f"{where}: {key} goes with command, not with url")
    url = _string(url, f"{where}: url")
    if not url.startswith(("http://", "https://")):
        raise UsageError(f"{where}: url must start with http:// or https://")
    return ServerConfig(name, url=url, headers=_pairs(table.get("headers", {}), f"{where}: headers"), allow=allow)


def _is_text(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= MAX_STRING and "\x00" not in value


def _string(value: object, where: str) -> str:
    if not _is_text(value):
        raise UsageError(f"{where} must be a non-empty string (at most {MAX_STRING} characters, no NUL)")
    assert isinstance(value, str)
    return value


def _strings(value: object, where: str) -> tuple[str, ...]:
    if not isinstance(value, list) or len(value) > MAX_ARGS or not all(isinstance(v, str) and len(v) <= MAX_STRING and "\x00" not in v
                                                                       for v in value):
        raise UsageError(f"{where} must be a list of at most {MAX_ARGS} strings")
    return tuple(value)


def _pairs(value: object, where: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, dict) or len(value) > MAX_ARGS:
        raise UsageError(f"{where} must be a table of strings, e.g. {{ KEY = \"value\" }}")
    bad = [k for k, v in value.items() if not _is_text(k) or "=" in k or not isinstance(v, str) or len(v) > MAX_STRING or "\x00" in v]
    if bad:
        raise UsageError(f"{where}: {safe(bad[0])!r} must be a name (no '=') with a string value")
    return tuple(sorted(value.items()))
