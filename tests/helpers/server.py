"""``localllm serve`` started as a real process on loopback, with its API key."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading

from tests.helpers.paths import REPO

KEY = "test-key-123"


class Server:
    def __init__(self, *args: str, env: dict[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "localllm", "serve", *args, "--port", "0"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            cwd=REPO,
            env={**os.environ, **(env or {})},
        )
        self.lines: list[str] = []
        self.base = None
        ready = threading.Event()

        def read() -> None:
            for line in self.proc.stderr:
                self.lines.append(line.rstrip("\n"))
                m = re.search(r"serving .* on (http://\S+)/v1 ", line)
                if m:
                    self.base = m.group(1)
                    ready.set()
            ready.set()

        threading.Thread(target=read, daemon=True).start()
        ready.wait(180)
        if self.base is None:
            self.stop()
            raise RuntimeError("server did not start:\n" + "\n".join(self.lines))

    @property
    def log(self) -> str:
        return "\n".join(self.lines)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def openai_client(server: Server):
    """The official ``openai`` client on ``server``, with its key; no retries."""
    from openai import OpenAI

    return OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0, timeout=120)


def http_client(server: Server):
    """An httpx2 client on ``server``, with its key."""
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def smollm2_server(tmp_path_factory, *args: str) -> Server:
    """``serve smollm2`` with ``args``, the test key, and a data directory of its own."""
    return Server("smollm2", *args, "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})


def serving(tmp_path_factory, *args: str):
    """A module fixture's body: SmolLM2 on one thread with the test key and its own
    LOCALLLM_HOME, stopped when the module is done."""
    s = Server("smollm2", "--threads", "1", "--api-key", KEY, *args, env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})
    try:
        yield s
    finally:
        s.stop()
