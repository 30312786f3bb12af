"""``[mcp.servers.NAME]`` in the config file, and ``localllm mcp import``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.mcp import load_settings
from tests.helpers.cli import cli, one_line

CLAUDE = {"mcpServers": {
    "filesystem": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp/a b"]},
    "git": {"command": "uvx", "args": ["mcp-server-git"], "env": {"GIT_AUTHOR": "Zoë \"z\" \x7f"}},
}}
CURSOR = {"mcpServers": {
    "remote": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer x"}},
    "typed": {"type": "stdio", "command": "node", "args": ["s.js"], "env": {}},
    "old-sse": {"type": "sse", "url": "https://example.com/sse"},
    "bad name!": {"command": "x"},
    "numbers": {"command": "x", "args": [1, 2]},
}}


def config(home: Path) -> Path:
    return home / "config.toml"


def write(tmp_path: Path, doc: object, name: str = "servers.json") -> Path:
    p = tmp_path / name
    p.write_text(json.dumps(doc) if not isinstance(doc, str) else doc)
    return p


def test_claude_desktop_servers_are_added_and_read_back(tmp_path: Path, _isolated_home: Path) -> None:
    cfg = config(_isolated_home)
    cfg.parent.mkdir(parents=True)
    cfg.write_text('# mine\nctx = 2048\n\n[run]\ntemp = 0.5\n')
    r = cli("mcp", "import", str(write(tmp_path, CLAUDE)))
    assert r.returncode == 0, r.stderr
    assert "added filesystem: npx -y @modelcontextprotocol/server-filesystem /tmp/a b" in r.stdout and "added git" in r.stdout
    text = cfg.read_text()
    assert text.startswith('# mine\nctx = 2048\n\n[run]\ntemp = 0.5\n')  # the user's text kept as it was
    servers = load_settings(cfg).servers
    assert servers["git"].env == (("GIT_AUTHOR", 'Zoë "z" \x7f'),)
    assert servers["filesystem"].args[-1] == "/tmp/a b"
    assert cli("config").returncode == 0  # the whole file still checks
    again = cli("mcp", "import", str(write(tmp_path, CLAUDE)))
    one_line(again, 2, "already has the MCP server(s) filesystem, git", "--force")
    forced = cli("mcp", "import", "--force", "--json", str(write(tmp_path, {"mcpServers": {"git": {"command": "git-mcp"}}})))
    assert json.loads(forced.stdout)["replaced"] == ["git"]
    servers = load_settings(cfg).servers
    assert servers["git"].command == "git-mcp" and servers["git"].env == () and "filesystem" in servers


def test_cursor_servers_with_urls_and_the_ones_left_out(tmp_path: Path, _isolated_home: Path) -> None:
    r = cli("mcp", "import", str(write(tmp_path, CURSOR)))
    assert r.returncode == 0, r.stderr
    servers = load_settings(config(_isolated_home)).servers
    assert set(servers) == {"remote", "typed"}
    assert servers["remote"].url == "https://example.com/mcp" and servers["remote"].headers == (("Authorization", "Bearer x"),)
    skipped = r.stderr.splitlines()
    assert len(skipped) == 3
    assert any("'old-sse': left out: transport 'sse' is not supported" in s for s in skipped)
    assert any("'bad name!': left out: a name is 1 to 64 letters" in s for s in skipped)
    assert any("'numbers': left out" in s and "args must be a list of at most 256 strings" in s for s in skipped)


@pytest.mark.parametrize(("doc", "needle"), [
    ("{not json", "not valid JSON"),
    ({"servers": {}}, 'no "mcpServers" object'),
    ([1, 2], 'no "mcpServers" object'),
    ("[" * 100000, "not valid JSON"),
    ({"mcpServers": {"x": "npx"}}, "no MCP server to import"),
])
def test_bad_files_are_one_line(tmp_path: Path, doc: object, needle: str) -> None:
    r = cli("mcp", "import", str(write(tmp_path, doc)))
    assert r.returncode in (1, 2) and needle in r.stderr.splitlines()[-1], r.stderr
    assert "Traceback" not in r.stderr


def test_a_huge_file_is_refused(tmp_path: Path) -> None:
    p = tmp_path / "big.json"
    p.write_text('{"mcpServers": {}, "pad": "' + "x" * (2 * 2**20) + '"}')
    one_line(cli("mcp", "import", str(p)), 1, "larger than 1024 KiB")


@pytest.mark.parametrize(("toml", "needle"), [
    ('[mcp.servers.a]\ncommand = "x"\nbogus = 1\n', "[mcp.servers.a]: no key 'bogus'"),
    ('[mcp.servers.a]\nargs = ["x"]\n', "give command"),
    ('[mcp.servers.a]\ncommand = "x"\nurl = "http://h"\n', "one of them"),
    ('[mcp.servers.a]\ncommand = "x"\nargs = "x y"\n', "args must be a list"),
    ('[mcp.servers.a]\ncommand = "x"\nenv = { K = 1 }\n', "env: 'K' must be a name"),
    ('[mcp.servers.a]\nurl = "ftp://h"\n', "url must start with http"),
    ('[mcp.servers.a]\nurl = "http://h"\nargs = []\n', "args goes with command"),
    ('[mcp]\nservers = 3\n', "mcp.servers must be a table"),
    ('[mcp]\ntimeout = -1\n', "mcp.timeout = -1"),
    ('[mcp]\nwhat = 1\n', "[mcp] has no key 'what'"),
    ('mcp = 1\n', "mcp must be a table"),
])
def test_the_config_file_is_checked(_isolated_home: Path, toml: str, needle: str) -> None:
    cfg = config(_isolated_home)
    cfg.parent.mkdir(parents=True)
    cfg.write_text(toml)
    line = one_line(cli("config"), 2, str(cfg), needle)
    assert "Traceback" not in line


def test_a_good_table_passes_the_check_of_every_command(_isolated_home: Path) -> None:
    cfg = config(_isolated_home)
    cfg.parent.mkdir(parents=True)
    cfg.write_text('ctx = 1024\n[mcp]\ntimeout = 5\n[mcp.servers.t]\ncommand = "x"\nargs = ["-v"]\nenv = { A = "b" }\n'
                   'allow = ["add"]\n[mcp.servers.h]\nurl = "https://h/mcp"\nheaders = { X = "y" }\n')
    assert cli("config").returncode == 0
    s = load_settings(cfg)
    assert s.call_timeout == 5 and s.servers["t"].allow == ("add",) and s.servers["h"].transport == "http"


def test_always_allow_is_kept_in_the_config(_isolated_home: Path) -> None:
    from localllm.mcp.importer import allow_tool

    cfg = config(_isolated_home)
    cfg.parent.mkdir(parents=True)
    cfg.write_text('# mine\n[mcp.servers.t]\ncommand = "x"\nenv = { A = "b" }\n\n[run]\ntemp = 0.5\n\n[mcp.servers.u]\ncommand = "y"\n')
    assert allow_tool(cfg, "t", "add") is True
    assert allow_tool(cfg, "t", "add") is False
    assert allow_tool(cfg, "t", "sub") is True
    s = load_settings(cfg).servers
    assert s["t"].allow == ("add", "sub") and s["t"].env == (("A", "b"),) and s["u"].command == "y"
    assert cfg.read_text().startswith('# mine\n[run]\ntemp = 0.5\n\n[mcp.servers.u]\ncommand = "y"\n\n[mcp.servers.t]\n')
    assert cli("config").returncode == 0
    with pytest.raises(Exception, match="no MCP server named 'v'"):
        allow_tool(cfg, "v", "add")


def test_llama_servers_timeout_ms_bounds_that_servers_calls() -> None:
    """llama-server's per-server "timeout_ms" (its test_mcp_servers.py's slow tool) is taken, not a reason to leave the server out."""
    from localllm.mcp.importer import parse_json

    doc = {"mcpServers": {"slow": {"command": "python", "args": ["s.py"], "timeout_ms": 1500}, "plain": {"command": "python"},
                          "bad": {"command": "python", "timeout_ms": -1}, "worse": {"command": "python", "timeout_ms": "soon"}}}
    parsed = parse_json(json.dumps(doc), "f.json", stdio_only=True)
    assert parsed.servers["slow"].call_timeout == 1.5 and parsed.servers["plain"].call_timeout is None
    assert sorted(parsed.servers) == ["plain", "slow"] and all("timeout_ms" in line for line in parsed.skipped), parsed.skipped
