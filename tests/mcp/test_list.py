"""``localllm mcp list``: each configured server started, its tools and schemas
listed, one line per server that fails (exit 1)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from localllm.mcp.importer import server_toml
from tests.helpers.cli import cli
from tests.mcp.conftest import SERVERS, rogue

pytestmark = pytest.mark.slow  # MCP servers are processes (the SDK's start in ~1.5 s); SmolLM2


def configure(home: Path, *servers) -> None:
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.toml").write_text("[mcp]\nstart-timeout = 2\n" + "".join(server_toml(s) for s in servers))


def test_text_and_json_with_a_failing_server(_isolated_home: Path) -> None:
    configure(_isolated_home, rogue("chatty", "logs"), rogue("badnames"), rogue("hang"),
              rogue("x", "broken").__class__("broken", command=sys.executable, args=(str(SERVERS / "nothing-here.py"),)))
    r = cli("mcp", "list")
    assert r.returncode == 1
    assert "logs (stdio, started in" in r.stdout and "  go: a tool" in r.stdout and '    input: {"type": "object"' in r.stdout
    assert "left out: badnames: a tool named 'bad\\\\x1b[31mname'" in r.stdout
    errors = r.stderr.splitlines()
    assert len(errors) == 2 and "Traceback" not in r.stderr
    assert any(e.startswith("localllm: MCP server hang: did not answer within 2 s") for e in errors)
    assert any(e.startswith("localllm: MCP server broken:") and "nothing-here.py" in e for e in errors)
    j = cli("mcp", "list", "--json", "logs", "broken")
    assert j.returncode == 1
    servers = {s["name"]: s for s in json.loads(j.stdout)["servers"]}
    assert servers["logs"]["ok"] and servers["logs"]["tools"][0]["input_schema"] == {"type": "object", "properties": {}}
    assert not servers["broken"]["ok"] and servers["broken"]["error"]


def test_no_servers_and_an_unknown_name(_isolated_home: Path) -> None:
    assert "no MCP servers in" in cli("mcp", "list").stdout
    configure(_isolated_home, rogue("chatty"))
    r = cli("mcp", "list", "nope")
    assert r.returncode == 2 and "no MCP server named 'nope'" in r.stderr and "configured: chatty" in r.stderr
