"""The router (``serve`` with no MODEL) answering ``GET``/``POST /tools`` itself, as
llama-server's router does: built-in tools (``Settings.tools``, ``--tools``) and
a real MCP server (the SDK's, ``tests/mcp/servers/tiny.py``) started beside a
failing one, over real HTTP on loopback. The router runs in a process of its
own through its Python API (``router.server.run``), as the command runs it."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx2
import pytest

from tests.helpers.paths import REPO
from tests.helpers.server import KEY
from tests.mcp.conftest import SERVERS

pytestmark = pytest.mark.slow  # a router process, an MCP server (the SDK's start in ~1.5 s)

ROUTER = """
import json, socket, sys
from localllm.mcp import Hub, Limits, ServerConfig
from localllm.router.server import Settings, run

cfg = json.loads(sys.argv[1])
say = lambda line: print(line, file=sys.stderr, flush=True)
hub = None
if cfg["mcp"]:
    hub = Hub([ServerConfig(n, command=c[0], args=tuple(c[1:])) for n, c in cfg["mcp"].items()], limits=Limits(call_timeout=60))
    for failed in hub.start():
        say(f"MCP server {failed.error}")
sock = socket.socket()
sock.bind(("127.0.0.1", 0))
sock.listen(64)
say(f"PORT {sock.getsockname()[1]}")
try:
    run([sock], Settings(only=None, models_max=1, keep_alive=None, max_waiting=8, api_key=cfg["key"], mcp=hub, tools=tuple(cfg["tools"])), say)
finally:
    if hub is not None:
        hub.close()
    say("CLOSED")
"""


def isolated_env(root: Path) -> dict[str, str]:
    """A data directory and a config of the router's own (tests.helpers.router's, without its CLI import)."""
    return {"LOCALLLM_HOME": str(root / "home"), "HF_HOME": str(root / "hf"), "HF_ENDPOINT": "http://127.0.0.1:9",
            "LOCALLLM_LMSTUDIO_DIR": str(root / "lmstudio"), "OLLAMA_MODELS": str(root / "ollama"), "LOCALLLM_CONFIG": str(root / "none.toml")}


class Router:
    def __init__(self, root: Path, *, tools: tuple[str, ...] = (), mcp: dict[str, list[str]] | None = None) -> None:
        cfg = {"key": KEY, "tools": list(tools), "mcp": mcp or {}}
        self.proc = subprocess.Popen([sys.executable, "-c", ROUTER, json.dumps(cfg)], stderr=subprocess.PIPE, stdout=subprocess.DEVNULL,
                                     text=True, cwd=REPO, env={**os.environ, **isolated_env(root)})
        self.lines: list[str] = []
        self.ready = threading.Event()
        self.port: int | None = None
        self.base = ""
        threading.Thread(target=self._read, daemon=True).start()
        assert self.ready.wait(120) and self.port, "\n".join(self.lines)
        self.base = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self.lines.append(line.rstrip("\n"))
            if line.startswith("PORT "):
                self.port = int(line.split()[1])
            if "serving " in line:
                self.ready.set()
        self.ready.set()

    def client(self, key: str | None = KEY) -> httpx2.Client:
        return httpx2.Client(base_url=self.base, headers={"Authorization": f"Bearer {key}"} if key else {}, timeout=60)

    def stop(self) -> float:
        """SIGTERM, as llama-server's tests stop a server; the seconds until the process is gone."""
        t0 = time.monotonic()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        return time.monotonic() - t0


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Router]:
    r = Router(tmp_path_factory.mktemp("router-tools"), tools=("read_file", "write_file", "exec_shell_command"),
               mcp={"tiny": [sys.executable, str(SERVERS / "tiny.py")], "gone": ["this_executable_does_not_exist_12345"]})
    try:
        yield r
    finally:
        r.stop()


def test_tools_are_behind_the_key_and_list_builtins_then_mcp(router: Router) -> None:
    with router.client(None) as anon:
        assert anon.get("/tools").status_code == 401
        assert anon.post("/tools", json={"tool": "read_file", "params": {"path": "/etc/hostname"}}).status_code == 401
        assert anon.get("/health").status_code == 200  # the failed MCP server took nothing down
    with router.client() as c:
        listed = [(t["tool"], t["type"]) for t in c.get("/tools").json()]
        assert listed[:3] == [("read_file", "builtin"), ("exec_shell_command", "builtin"), ("write_file", "builtin")]
        assert ("tiny_add", "mcp") in listed and not any(name.startswith("gone_") for name, _ in listed)
        assert c.get("/v1/models").status_code == 200  # every other route is still the router's
        assert c.delete("/tools").status_code == 405
    assert any("gone: cannot start 'this_executable_does_not_exist_12345'" in line for line in router.lines)


def test_calls_answer_as_llama_server(router: Router, tmp_path: Path) -> None:
    with router.client() as c:
        assert c.post("/tools", json={"tool": "tiny_add", "params": {"a": 3, "b": 5}}).json() == {"plain_text_response": "8"}
        assert "error" in c.post("/tools", json={"tool": "tiny_fail", "params": {"why": "no"}}).json()
        out = str(tmp_path / "sub" / "out.txt")
        assert c.post("/tools", json={"tool": "write_file", "params": {"path": "sub/out.txt", "content": "hi\n"}},
                      headers={"x-tool-cwd": str(tmp_path)}).json() == {"result": "file written successfully", "path": "sub/out.txt", "bytes": 3}
        assert c.post("/tools", json={"tool": "read_file", "params": {"path": out}}).json() == {"plain_text_response": "hi\n"}
        r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}}, headers={"x-tool-runtime": "fake:x"})
        assert r.status_code == 500 and "unknown tool runtime" in r.text
        assert c.post("/tools", json={"tool": "grep_search", "params": {"path": ".", "pattern": "x"}}).status_code == 404  # not chosen
        assert c.post("/tools", content=b"{not json").status_code == 400
        with c.stream("POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hello"}, "stream": True}) as s:
            events = [json.loads(line[6:]) for line in s.iter_lines() if line.startswith("data: ")]
        assert events[-1] == {"done": True} and "[exit code: 0]" in "".join(e.get("chunk", "") for e in events)


def test_concurrent_calls_all_answer(router: Router) -> None:
    with router.client() as c, ThreadPoolExecutor(10) as pool:
        results = list(pool.map(lambda i: c.post("/tools", json={"tool": "tiny_add", "params": {"a": i, "b": 1}}).json(), range(10)))
    assert results == [{"plain_text_response": str(i + 1)} for i in range(10)]


def test_without_tools_the_route_is_llama_servers_403(tmp_path: Path) -> None:
    r = Router(tmp_path)
    try:
        with r.client() as c:
            got = c.get("/tools")
            assert got.status_code == 403 and "--tools" in got.json()["error"]["message"]
    finally:
        r.stop()


def test_a_slow_call_does_not_hold_the_stop(tmp_path: Path) -> None:
    """llama-server's test_mcp_slow_tool_call_slot_release: the router stops within
    3 s of SIGTERM while an MCP call and a command are still running."""
    r = Router(tmp_path, tools=("exec_shell_command",), mcp={"tiny": [sys.executable, str(SERVERS / "tiny.py")]})
    answers: list[object] = []

    def call(body: dict) -> None:
        try:
            with r.client() as c:
                answers.append(c.post("/tools", json=body).json())
        except httpx2.HTTPError as exc:
            answers.append(exc)

    calls = [threading.Thread(target=call, args=(b,)) for b in ({"tool": "tiny_sleep", "params": {"seconds": 30}},
                                                               {"tool": "exec_shell_command", "params": {"command": "sleep 30", "timeout": 60}})]
    for t in calls:
        t.start()
    time.sleep(1.5)
    took = r.stop()
    for t in calls:
        t.join(10)
    assert took < 3, (took, r.lines)
    assert "CLOSED" in r.lines and "Traceback" not in "\n".join(r.lines)
    assert len(answers) == 2
