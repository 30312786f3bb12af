"""``localllm serve`` against hostile or unlucky clients and operators: an empty
API key, half-sent requests, the model still loading, repeated signals."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.helpers.server import KEY, serving


def test_empty_api_key_is_a_usage_error(tmp_path: Path) -> None:
    """``--api-key ""`` would otherwise run with no authentication at all."""
    for key in ("", "  "):
        proc = cli("serve", str(tmp_path / "missing.gguf"), "--api-key", key)
        assert proc.returncode == 2, proc.stderr
        lines = proc.stderr.strip().splitlines()
        assert len(lines) == 1 and "--api-key is empty" in lines[0] and "leave --api-key out" in lines[0]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "2", "--ctx", "512")


def _half_sent(base: str, n: int) -> list[socket.socket]:
    """``n`` connections that each send part of a request head and then nothing."""
    host, port = base.removeprefix("http://").rsplit(":", 1)
    socks = []
    for _ in range(n):
        s = socket.create_connection((host, int(port)), timeout=10)
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        socks.append(s)
    return socks


@pytest.mark.slow
def test_511_half_sent_requests_do_not_stop_a_valid_one(server) -> None:
    """Slowloris: 511 idle half-sent requests used to make every request, /health
    included, answer 503 for as long as they stayed open."""
    import httpx2

    socks = _half_sent(server.base, 511)
    try:
        t0 = time.monotonic()
        with httpx2.Client(base_url=server.base, timeout=30) as c:
            assert c.get("/health").status_code == 200
            assert c.get("/v1/models").status_code == 401  # without the key: refused, not stalled
            r = c.post("/v1/completions", headers={"Authorization": f"Bearer {KEY}"},
                       json={"prompt": "Hello", "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
        assert time.monotonic() - t0 < 10
    finally:
        for s in socks:
            s.close()
    assert "Traceback" not in server.log


@pytest.mark.slow
def test_a_half_sent_request_is_closed_after_the_header_limit(server) -> None:
    from localllm.serve.accept import HEADER_TIMEOUT_S

    (s,) = _half_sent(server.base, 1)
    with s:
        s.settimeout(HEADER_TIMEOUT_S + 20)
        t0 = time.monotonic()
        answer = s.recv(1000)
        waited = time.monotonic() - t0
    assert answer.startswith(b"HTTP/1.1 408 ")
    assert HEADER_TIMEOUT_S - 1 < waited < HEADER_TIMEOUT_S + 5
