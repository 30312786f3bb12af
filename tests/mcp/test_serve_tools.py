"""``serve --mcp-servers-json`` and llama-server's ``GET``/``POST /tools``."""

from __future__ import annotations

import json
import sys
import urllib.error
import urllib.request
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from localllm.mcp import Hub
from localllm.serve import mcp_routes
from tests.helpers.server import KEY, Server
from tests.mcp.conftest import SERVERS

pytestmark = pytest.mark.slow  # MCP servers are processes (the SDK's start in ~1.5 s); SmolLM2


def app(hub: Hub | None) -> TestClient:
    logged: list[tuple] = []

    async def read_json(request) -> dict:
        return json.loads(await request.body())

    state = SimpleNamespace(mcp=hub, log=lambda *a, **k: logged.append(a))
    return TestClient(Starlette(routes=mcp_routes.routes(state, read_json)))


def test_off_unless_configured() -> None:
    r = app(None).get("/tools")
    assert r.status_code == 403 and "--mcp-servers-config" in r.json()["error"]["message"]


def test_list_and_call_in_llama_servers_shapes(hub: Hub) -> None:
    c = app(hub)
    tools = {t["tool"]: t for t in c.get("/tools").json()}
    add = tools["tiny_add"]
    assert add["type"] == "mcp" and add["definition"]["function"]["parameters"]["properties"]["a"]["type"] == "integer"
    assert c.post("/tools", json={"tool": "tiny_add", "params": {"a": 3, "b": 5}}).json() == {"plain_text_response": "8"}
    assert "error" in c.post("/tools", json={"tool": "tiny_fail", "params": {"why": "no"}}).json()
    assert c.post("/tools", json={"tool": "nope"}).status_code == 404
    assert c.post("/tools", json={"tool": "tiny_add", "params": [1]}).status_code == 400


def _get(url: str, key: str | None, data: dict | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url, data=json.dumps(data).encode() if data is not None else None,
                                 headers={"Authorization": f"Bearer {key}"} if key else {})
    try:
        with urllib.request.urlopen(req, timeout=30) as r:
            return r.status, json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def test_serve_with_mcp_servers_json() -> None:
    servers = {"mcpServers": {"quick": {"command": sys.executable, "args": [str(SERVERS / "rogue.py"), "chatty"]},
                              "gone": {"command": "/nonexistent/mcp-server"}, "remote": {"url": "http://127.0.0.1:9/mcp"}}}
    s = Server("smollm2", "--ctx", "256", "--parallel", "1", "--threads", "1", "--api-key", KEY, "--mcp-servers-json", json.dumps(servers))
    try:
        assert _get(f"{s.base}/tools", None)[0] == 401
        status, tools = _get(f"{s.base}/tools", KEY)
        assert status == 200 and [t["tool"] for t in tools] == ["quick_go"]
        assert _get(f"{s.base}/tools", KEY, {"tool": "quick_go", "params": {}}) == (200, {"plain_text_response": "went"})
        assert "MCP server gone: cannot start '/nonexistent/mcp-server'" in s.log
        assert "server 'remote': left out: no \"command\"" in s.log
    finally:
        s.stop()
