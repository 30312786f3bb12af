"""The MCP servers the tests start: ``servers/tiny.py`` (a real one on the SDK),
``servers/rogue.py MODE`` (raw, misbehaving, starts in milliseconds) and the
third-party ``mcp-server-time`` (offline). One hub of them for the whole
folder: starting an SDK server costs ~1.5 s here."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from localllm.mcp import Hub, Limits, ServerConfig

SERVERS = Path(__file__).parent / "servers"
ROGUES = ("flood", "big", "nonl", "garbage", "crash", "chatty", "bigschema", "special", "badnames", "recursive", "many")


def tiny() -> ServerConfig:
    return ServerConfig("tiny", command=sys.executable, args=(str(SERVERS / "tiny.py"),), env=(("TINY_SETTING", "on"),))


def rogue(mode: str, name: str | None = None) -> ServerConfig:
    return ServerConfig(name or mode, command=sys.executable, args=(str(SERVERS / "rogue.py"), mode))


def time_server() -> ServerConfig:
    return ServerConfig("time", command=sys.executable, args=("-m", "mcp_server_time", "--local-timezone", "UTC"))


@pytest.fixture(scope="session")
def hub() -> Iterator[Hub]:
    """tiny, time and the rogues, started once (calls bounded at 2 s)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("LOCALLLM_API_KEY", "sk-secret-of-the-user")  # what a server must never see (set while they start)
    mp.setenv("SOME_PRIVATE_TOKEN", "private")
    h = Hub([tiny(), time_server(), *(rogue(m) for m in ROGUES)], limits=Limits(call_timeout=2, start_timeout=20))
    try:
        try:
            failed = h.start()
        finally:
            mp.undo()
        assert failed == [], [s.error for s in failed]
        yield h
    finally:
        h.close()
