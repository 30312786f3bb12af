"""A hub that accepts the connection and then says nothing: every request has
a time-out, so ``pull`` ends with one line within it instead of hanging.

These run ``localllm`` in a child process (``run_cli``), for two things only a
process shows: HF_HUB_ETAG_TIMEOUT reaches huggingface_hub's file-metadata
request only at import (it is that function's default argument, bound then),
and a command that lost its time-out would hang: a child is killed by
``run_cli``'s ``timeout`` and the test fails, where an in-process call would
hang the test worker for good."""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from concurrent.futures import ThreadPoolExecutor

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
        # a child process: the time-outs are read at import, and a hang must end in a failed test (see the docstring)
        r = run_cli("pull", "acme/Silent-GGUF", "--quant", "Q4_K_M", timeout=60,
                    env={"HF_ENDPOINT": f"http://127.0.0.1:{hub.port}", "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_ETAG_TIMEOUT": "1"})
        took = time.monotonic() - t0
    finally:
        hub.close()
    assert r.returncode == 1, r.stderr
    lines = [line for line in r.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "cannot reach" in lines[0] and "Timeout" in lines[0], r.stderr
    assert took < 20, took
    assert hub.conns, "the hub was asked"


@pytest.mark.slow
@pytest.mark.parametrize("stall_after", [0, 3 << 20])
def test_a_hub_that_stops_mid_answer_is_one_line_within_the_timeout(tmp_path, stall_after: int) -> None:
    """The listing answers, then the file's bytes stop: before the header is
    read (``plan`` of a model not downloaded, and ``pull``), or mid-download
    (``pull``, after 3 MiB). One line, within the read time-out, never a hang."""
    from scripts.synth_gguf import SynthSpec, write_gguf
    from tests.helpers.fake_hub import FakeHub

    hub = FakeHub(stall_after=stall_after).start()
    hub.add("acme/Stall-GGUF", "Stall-F32.gguf", write_gguf(tmp_path / "Stall-F32.gguf", SynthSpec(n_layer=8, n_embd=512, n_ff=1024, dtype="f32")))
    # one retry after the stall, not five: each costs the read time-out (test_pull.py has the default's resumes)
    env = {"HF_ENDPOINT": hub.endpoint, "HF_HUB_DOWNLOAD_TIMEOUT": "1", "HF_HUB_ETAG_TIMEOUT": "1", "LOCALLLM_PULL_RETRIES": "1"}
    try:
        runs = [("pull", "acme/Stall-GGUF", "--quant", "F32")] + ([("plan", "acme/Stall-GGUF:F32")] if stall_after == 0 else [])

        def timed(args: tuple[str, ...]) -> tuple[subprocess.CompletedProcess[str], float]:
            t0 = time.monotonic()
            r = run_cli(*args, timeout=60, env=env)  # a child process: as above
            return r, time.monotonic() - t0

        # both commands at once: each spends its time waiting on the silent hub, not computing
        with ThreadPoolExecutor(len(runs)) as pool:
            done = list(zip(runs, pool.map(timed, runs)))
        for args, (r, took) in done:
            lines = [line for line in r.stderr.splitlines() if line.strip() and "%" not in line and "pulling" not in line]
            assert r.returncode == 1 and len(lines) == 1 and "Traceback" not in r.stderr, (args, r.stderr)
            assert "timed out" in lines[0].lower() or "timeout" in lines[0].lower(), (args, lines)
            assert took < 30, (args, took)
    finally:
        hub.stop()
