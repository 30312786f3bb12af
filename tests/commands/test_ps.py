"""``localllm ps``: what a running server has loaded, as ``ollama ps`` shows it;
a server that is not there, or that answers something else, is one line.
(Against a real router: ``tests/router/test_plan_residency.py``.)"""

from __future__ import annotations

import datetime as dt
import json
import socket
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from localllm.commands.ps import Row, base_url, until
from tests.helpers.cli import cli, one_line


def test_the_processor_column_is_ollamas() -> None:
    assert Row("m", 100, 0, None, None).processor == "100% CPU"
    assert Row("m", 100, 100, None, None).processor == "100% GPU"
    assert Row("m", 100, 52, None, None).processor == "48%/52% CPU/GPU"
    assert Row("m", 100, None, None, None).processor == "-"  # serve MODEL does not measure it
    assert Row("m", 100, 200, None, None).processor == "unknown"


def test_the_context_column_says_why_where_localllm_serve_said() -> None:
    assert Row("m", 1, 0, 32768, None, {"context": "32768 (trained)"}).context == "32768 (trained)"
    assert Row("m", 1, 0, 12288, None, {"context": "12288 (largest that fits; trained 32768)"}).context.endswith("trained 32768)")
    assert Row("m", 1, 0, 2048, None).context == "2048"  # Ollama's: the count alone
    assert Row("m", 1, 0, None, None, {"context": 5}).context == "-"  # not a string: not shown
    assert "\x1b" not in Row("m", 1, 0, 8, None, {"context": "8 \x1b[2J" + "x" * 500}).context  # another process's text: escaped, cut
    assert len(Row("m", 1, 0, 8, None, {"context": "y" * 500}).context) == 80


def test_until_and_the_url() -> None:
    now = dt.datetime(2026, 1, 1, tzinfo=dt.timezone.utc)
    assert until("2026-01-01T00:04:30Z", now) == "4 minutes from now"
    assert until("2026-01-01T00:00:42Z", now) == "42 seconds from now"
    assert until("2026-01-01T03:00:00+00:00", now) == "3 hours from now"
    assert until(None, now) == "forever" and until("2318-01-01T00:00:00Z", now) == "forever"
    assert until("yesterday", now) == "-" and until("2025-12-31T00:00:00Z", now) == "now"
    assert base_url("127.0.0.1:8080") == base_url("http://127.0.0.1:8080/v1/") == "http://127.0.0.1:8080"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_no_server_is_one_line_naming_the_url_and_serve() -> None:
    url = f"http://127.0.0.1:{_free_port()}"
    one_line(cli("ps", "--url", url), 1, url, "localllm serve")


@pytest.fixture
def answering() -> Iterator[tuple[str, list]]:
    """A loopback server whose /api/ps answer is ``box[0]``: (status, body bytes)."""
    box: list = [(200, b'{"models": []}')]

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            status, body = box[0]
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", box
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.slow  # a loopback server
def test_a_servers_answer_is_shown_and_checked(answering) -> None:
    url, box = answering
    model = {"name": "smollm2:latest", "size": 140 * 2**20, "size_vram": 100 * 2**20, "context_length": 256,
             "expires_at": "2999-01-01T00:00:00Z", "details": {}}
    box[0] = (200, json.dumps({"models": [model, {**model, "name": "evil\x1b[2Jname", "size_vram": 0, "expires_at": None}]}).encode())
    r = cli("ps", "--url", url)
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].split() == ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
    assert "smollm2:latest" in lines[1] and "140.00 MiB" in lines[1] and "29%/71% CPU/GPU" in lines[1] and "256" in lines[1]
    assert "\x1b" not in r.stdout and "100% CPU" in lines[2] and "forever" in lines[2]
    r = cli("ps", "--url", url, "--json")
    assert json.loads(r.stdout)["models"][0]["processor"] == "29%/71% CPU/GPU"
    box[0] = (200, b'{"models": []}')
    r = cli("ps", "--url", url)
    assert r.returncode == 0 and r.stdout == "" and "no model loaded" in r.stderr


@pytest.mark.slow  # a loopback server
@pytest.mark.parametrize(("status", "body", "needle"), [
    (200, b"<html>", "not JSON"),
    (200, b'["a"]', "no 'models' list"),
    (200, b'{"models": [{"name": 3}]}', "a model without a name"),
    (200, b'{"models": [{"name": "m", "size": "big"}]}', "'size' is not a count"),
    (200, b'{"models": [{"name": "m", "expires_at": 5}]}', "'expires_at' is not a string"),
    (200, b'{"models": "' + b"x" * (2 << 20) + b'"}', "over 1 MiB"),
    (200, b"[" * 100_000 + b"]" * 100_000, "not JSON"),
    (401, b'{"error": "key"}', "--api-key"),
    (404, b"{}", "no /api/ps"),
    (500, b"{}", "HTTP 500"),
], ids=["html", "list", "nameless", "size", "expiry", "huge", "deep", "401", "404", "500"])
def test_a_wrong_answer_is_one_line(answering, status: int, body: bytes, needle: str) -> None:
    url, box = answering
    box[0] = (status, body)
    one_line(cli("ps", "--url", url), 1, url, needle)
