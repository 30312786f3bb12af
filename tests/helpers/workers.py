"""llama.cpp RPC workers started as real processes on loopback, for placement and failure tests."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from localllm.errors import InputError
from localllm.plan.workers import Endpoint, probe
from tests.helpers.paths import REPO


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class WorkerProc:
    """``python -m localllm worker`` in its own process, ready when it answers HELLO."""

    def __init__(self, port: int | None = None, *extra: str) -> None:
        self.port = port or free_port()
        self.ep = Endpoint("127.0.0.1", self.port)
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localllm", "worker", "--port", str(self.port), "--threads", "1", *extra],
            cwd=REPO,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,  # stdout: llama.cpp's per-client lines
        )
        deadline = time.monotonic() + 60
        while True:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited {self.proc.returncode}: {self.proc.stderr.read()}")
            try:
                probe(self.ep, timeout=2)
                return
            except InputError:
                if time.monotonic() > deadline:
                    self.stop()
                    raise
                time.sleep(0.2)

    def stop(self, sig: int = signal.SIGINT) -> tuple[int, str]:
        if self.proc.poll() is None:
            self.proc.send_signal(sig)
        try:
            _, err = self.proc.communicate(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            _, err = self.proc.communicate()
        return self.proc.returncode, err
