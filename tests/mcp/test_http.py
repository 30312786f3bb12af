"""A streamable-HTTP MCP server (``[mcp.servers.NAME] url = ...``), real: the
SDK's server on loopback (``servers/tiny.py --http PORT``), reached through the
config's URL with its headers."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Iterator

import pytest

from localllm.mcp import Hub, Limits, ServerConfig
from tests.mcp.conftest import SERVERS

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, str(SERVERS / "tiny.py"), "--http", str(port)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + 30
        while True:  # listening: a connect succeeds
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise AssertionError(f"the HTTP MCP server did not start: {proc.stderr.read().decode()[-2000:] if proc.stderr else ''}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_an_http_server_lists_and_calls_with_the_configs_headers(url: str) -> None:
    web = ServerConfig("web", url=url, headers=(("Authorization", "Bearer token-of-the-config"),))
    with Hub([web], limits=Limits(call_timeout=5, start_timeout=20)) as hub:
        assert hub.start() == []
        assert {t.name for t in hub.tools} >= {"add", "sleep", "header"} and all(t.server == "web" for t in hub.tools)
        assert hub.call("add", {"a": 2, "b": 40}).text == "42"
        assert hub.call("header", {"name": "Authorization"}).text == "Bearer token-of-the-config"
        slow = hub.call("sleep", {"seconds": 30}, timeout=0.5)
        assert slow.failed and "timed out" in slow.text
        assert hub.call("add", {"a": 1, "b": 1}).text == "2"  # the server goes on after a call it was told to cancel


def test_an_http_server_that_is_not_there_fails_alone(url: str) -> None:
    gone = ServerConfig("gone", url="http://127.0.0.1:9/mcp")
    with Hub([gone, ServerConfig("web", url=url)], limits=Limits(call_timeout=5, start_timeout=10)) as hub:
        failed = hub.start()
        assert [s.config.name for s in failed] == ["gone"] and failed[0].error and "\n" not in failed[0].error
        assert hub.call("add", {"a": 3, "b": 4}).text == "7"
