"""A hub that accepts the connection and then says nothing: every request has
a time-out, so ``pull`` ends with one line within it instead of hanging."""

from __future__ import annotations

import socket
import threading
import time

import pytest

from tests.helpers.cli import run_cli


class SilentHub:
    """Accepts connections on loopback and never answers (until closed)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: list[socket.socket] = []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        self.sock.settimeout(0.2)
        while not self.stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.conns.append(conn)  # held open, never read from or written to
            except OSError:
                continue

    def close(self) -> None:
        self.stop.set()
        self.thread.join(5)
        for c in self.conns:
            c.close()
        self.sock.close()


@pytest.mark.slow
def test_a_stalled_hub_is_one_line_within_the_timeout() -> None:
    hub = SilentHub()
    try:
        t0 = time.monotonic()
        # a child process: huggingface_hub reads its endpoint and time-out when first imported
        r = run_cli("pull", "acme/Silent-GGUF", "--quant", "Q4_K_M", timeout=60,
                    env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}", "HF_HUB_DOWNLOAD_TIMEOUT": "2", "HF_HUB_ETAG_TIMEOUT": "2"})
        took = time.monotonic() - t0
    finally:
        hub.close()
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach" in lines[0] and "Timeout" in lines[0], r.stderr
    assert took < 20, took
    assert hub.conns, "the hub was asked"
