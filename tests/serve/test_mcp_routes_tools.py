"""``serve.mcp_routes`` over built-in tools and an MCP hub at once: llama-server's
statuses and fields (test_tools_builtin.py, test_mcp_servers.py), the headers
that choose where a tool runs (never the model's params), the exec stream's
events, and ``abort()`` ending the calls in flight when the server stops."""

from __future__ import annotations

import concurrent.futures
import json
import threading
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from starlette.applications import Starlette
from starlette.testclient import TestClient

from localllm.serve import mcp_routes
from localllm.serve.protocol import parse_json
from localllm.server_tools import Toolbox, choose


class FakeHub:
    """``localllm.mcp.Hub``'s face as the routes use it: ``tools`` and ``submit``."""

    def __init__(self, *tools: tuple[str, str]) -> None:
        self.tools = [SimpleNamespace(server=s, name=n, description=f"{n} of {s}", schema={"type": "object", "properties": {}})
                      for s, n in tools]
        self.calls: list[tuple[str, str, dict]] = []
        self.release = threading.Event()

    def submit(self, name: str, arguments: dict, *, server: str) -> Any:
        self.calls.append((server, name, arguments))
        future: concurrent.futures.Future = concurrent.futures.Future()
        if name == "hang":
            return SimpleNamespace(future=future, cancel=future.cancel)
        future.set_result(SimpleNamespace(text=f"{server}.{name}({json.dumps(arguments)})", is_error=name == "fails", size=1, elapsed_ms=1.0))
        return SimpleNamespace(future=future, cancel=future.cancel)


def client(box: Toolbox | None, hub: FakeHub | None = None) -> tuple[TestClient, mcp_routes.Tools, list]:
    logged: list[tuple] = []

    async def read_json(request) -> dict:
        return parse_json(await request.body())  # serve's own: a body that is not a JSON object is a 400

    state = SimpleNamespace(mcp=hub, server_tools=box, log=lambda *a, **k: logged.append(a))
    tools = mcp_routes.Tools(state, read_json)
    app = Starlette(routes=[mcp_routes.Route("/tools", tools.endpoint, methods=["GET", "POST"])])
    return TestClient(app), tools, logged


def test_off_without_either_names_both_flags() -> None:
    r = client(None)[0].get("/tools")
    assert r.status_code == 403 and "--tools" in r.json()["error"]["message"] and "--mcp-servers-config" in r.json()["error"]["message"]


def test_builtins_first_and_an_mcp_tool_that_takes_a_builtins_name_is_left_out() -> None:
    hub = FakeHub(("read", "file"), ("echo", "echo"), ("echo", "echo"))
    c, _, _ = client(Toolbox(choose("read_file,grep_search")), hub)
    listed = c.get("/tools").json()
    assert [(t["tool"], t["type"]) for t in listed] == [("read_file", "builtin"), ("grep_search", "builtin"), ("echo_echo", "mcp")]
    assert c.post("/tools", json={"tool": "echo_echo", "params": {"m": 1}}).json() == {"plain_text_response": 'echo.echo({"m": 1})'}
    assert c.post("/tools", json={"tool": "read_file", "params": {"path": "/nonexistent"}}).json() == {"error": "cannot stat file: /nonexistent"}
    assert hub.calls == [("echo", "echo", {"m": 1})]


def test_statuses_are_llama_servers() -> None:
    c, _, _ = client(Toolbox(choose("all")), FakeHub(("s", "fails")))
    assert c.post("/tools", json={"tool": "s_fails"}).json() == {"error": "s.fails({})"}
    assert c.post("/tools", content=b"not json").status_code == 400
    assert c.post("/tools", json={"params": {}}).status_code == 400
    assert c.post("/tools", json={"tool": "read_file", "params": [1]}).status_code == 400
    assert c.post("/tools", json={"tool": "read_file", "params": {}}).status_code == 400  # a required parameter missing
    assert c.post("/tools", json={"tool": "read_file", "params": {"path": "x"}, "stream": True}).status_code == 404
    assert c.post("/tools", json={"tool": "s_fails", "stream": True}).status_code == 404
    assert c.post("/tools", json={"tool": "nope"}).status_code == 404
    r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}}, headers={"x-tool-runtime": "fake:x"})
    assert r.status_code == 500 and "unknown tool runtime: fake:x" in r.json()["error"]["message"]
    r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi"}},
               headers={"x-tool-runtime": "ssh:-oProxyCommand=touch /tmp/pwned"})
    assert r.status_code == 500 and "invalid ssh target" in r.json()["error"]["message"]


@pytest.mark.slow  # runs commands
def test_headers_choose_where_a_tool_runs_and_the_models_params_cannot(tmp_path: Path) -> None:
    c, _, _ = client(Toolbox(choose("all")))
    (tmp_path / "marker.txt").write_text("marker")
    r = c.post("/tools", json={"tool": "read_file", "params": {"path": "marker.txt", "cwd": "/definitely/not/there"}},
               headers={"x-tool-cwd": str(tmp_path)})
    assert r.json() == {"plain_text_response": "marker\n"}
    r = c.post("/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hi > out.txt", "runtime": "ssh:evil"}},
               headers={"x-tool-cwd": str(tmp_path)})
    assert r.json()["plain_text_response"].endswith("[exit code: 0]") and (tmp_path / "out.txt").read_text() == "hi\n"
    r = c.post("/tools", json={"tool": "read_file", "params": {"path": str(tmp_path / "marker.txt"), "resp_type": "base64"}})
    assert "base64" not in r.json()
    r = c.post("/tools", json={"tool": "read_file", "params": {"path": str(tmp_path / "marker.txt")}}, headers={"x-resp-type": "base64"})
    assert r.json() == {"base64": "bWFya2Vy", "size_bytes": 6}


@pytest.mark.slow  # runs commands
def test_exec_streams_its_output_then_done() -> None:
    c, _, _ = client(Toolbox(choose("exec_shell_command")))
    with c.stream("POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "echo hello; sleep 0.3; echo again"},
                                          "stream": True}) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events[-1] == {"done": True} and len(events) >= 3
    text = "".join(e["chunk"] for e in events[:-1])
    assert "hello" in text and text.endswith("again\n\n[exit code: 0]")
    with c.stream("POST", "/tools", json={"tool": "exec_shell_command", "params": {"command": "echo x"}, "stream": True},
                  headers={"x-tool-runtime": "docker-container:--privileged"}) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ")]
    assert events == [{"done": True, "error": "invalid container id: --privileged"}]


def test_abort_answers_the_mcp_calls_in_flight_at_once() -> None:
    hub = FakeHub(("slow", "hang"))
    c, tools, _ = client(None, hub)
    out: list = []
    t = threading.Thread(target=lambda: out.append(c.post("/tools", json={"tool": "slow_hang"})))
    t.start()
    deadline = time.monotonic() + 10
    while not hub.calls and time.monotonic() < deadline:
        time.sleep(0.02)
    time.sleep(0.1)
    assert tools.abort() == 1
    t.join(10)
    assert out and out[0].status_code == 200 and out[0].json() == {"error": mcp_routes.STOPPING}
    assert c.post("/tools", json={"tool": "slow_hang"}).json() == {"error": mcp_routes.STOPPING}
