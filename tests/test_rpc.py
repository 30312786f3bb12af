"""More than one device: llama.cpp's RPC backend, served by ``localllm worker``
processes on 127.0.0.1, and the per-device placement checked against what
llama.cpp allocates on each device (its log)."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from localllm.errors import InputError, UsageError
from localllm.gguf_file import read_header
from localllm.placement import Device, layer_devices, place
from localllm.planner import MiB, ModelShape, RunConfig
from localllm.rpc import Endpoint, parse_endpoints, probe
from tests.conftest import REPO, run_cli


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
            cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
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


@pytest.fixture(scope="module")
def workers():
    ws = [WorkerProc(), WorkerProc()]
    yield ws
    for w in ws:
        w.stop()


# -- parsing and refusing, no worker needed ------------------------------------------


def test_parse_endpoints() -> None:
    assert parse_endpoints("127.0.0.1:50052") == [Endpoint("127.0.0.1", 50052)]
    assert parse_endpoints("a.local:1, 10.0.0.2:65535") == [Endpoint("a.local", 1), Endpoint("10.0.0.2", 65535)]
    for bad in ("", "127.0.0.1", "127.0.0.1:", ":50052", "h:0", "h:65536", "h:x", "h:1,", "[::1]:50052", "h:1,h:1", "a b:1"):
        with pytest.raises(UsageError):
            parse_endpoints(bad)


@pytest.mark.parametrize("value", ["127.0.0.1", "127.0.0.1:", "host:99999", "[::1]:50052", "a:1,,b:2"])
def test_malformed_rpc_is_a_usage_error(value: str) -> None:
    proc = run_cli("plan", "--rpc", value)
    assert proc.returncode == 2, proc.stderr
    assert "--rpc" in proc.stderr and len(proc.stderr.strip().splitlines()) == 1


def test_worker_refuses_open_host_without_the_flag() -> None:
    proc = run_cli("worker", "--host", "0.0.0.0", "--port", str(free_port()))
    assert proc.returncode == 2
    assert "no authentication" in proc.stderr and "--i-understand-this-is-open" in proc.stderr
    proc = run_cli("worker", "--host", "localhost")
    assert proc.returncode == 2 and "IPv4" in proc.stderr


def test_worker_down_is_one_line_before_any_load(smollm2: Path) -> None:
    port = free_port()  # nothing listens there
    t0 = time.monotonic()
    proc = run_cli("run", "--rpc", f"127.0.0.1:{port}", "-p", "hi", "-n", "1")
    assert proc.returncode == 1
    assert proc.stderr.strip().splitlines() == [f"localllm: error: worker 127.0.0.1:{port} refused the connection: is `localllm worker --port {port}` running there?"]
    assert time.monotonic() - t0 < 30


def test_silent_worker_times_out_instead_of_hanging() -> None:
    """A port that accepts and never answers (a worker busy with another client
    looks like this): one line, exit 1, within the probe timeout."""
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(4)
    port = srv.getsockname()[1]
    try:
        t0 = time.monotonic()
        proc = run_cli("plan", "--rpc", f"127.0.0.1:{port}")
        assert proc.returncode == 1
        assert "did not answer within" in proc.stderr and "one client at a time" in proc.stderr
        assert len(proc.stderr.strip().splitlines()) == 1
        assert time.monotonic() - t0 < 30
    finally:
        srv.close()


def test_layer_split_follows_llama_cpp() -> None:
    # 30 layers + output over two equal devices: llama.cpp's upper_bound on i/31.
    where = layer_devices(30, -1, [1.0, 1.0])
    assert where[:16] == [0] * 16 and where[16:] == [1] * 15  # 15/31 < 0.5 <= 16/31
    where = layer_devices(30, 12, [1.0])
    assert where[:19] == [None] * 19 and where[19:] == [0] * 12  # the last 12 of 31: 11 layers and the output
    assert layer_devices(30, 0, [1.0]) == [None] * 31
    assert layer_devices(30, -1, [3.0, 1.0]).count(0) == 24  # float32 3/4 of 31 -> layers 0..23
