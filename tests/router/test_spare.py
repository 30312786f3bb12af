"""The router's spare child (``localllm.spare``): a process with serve's
imports done, handed a model's command line when one must load (issue 46's
switch time). Its one-line protocol is checked here as untrusted input; that the
router's children really come from spares is checked on a real router."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.paths import REPO
from tests.helpers.server import http_client

pytestmark = pytest.mark.slow  # processes that import serve's stack


def spare(line: bytes | None) -> subprocess.CompletedProcess:
    env = {**os.environ, "LOCALLLM_CONFIG": "/nonexistent/config.toml"}
    return subprocess.run([sys.executable, "-m", "localllm.spare"], input=line or b"", capture_output=True, cwd=REPO, env=env,
                          timeout=120)


@pytest.mark.parametrize("line", [b'{"argv": "serve x"}\n', b"not json\n", b'{"argv": [1, 2]}\n', b'{"other": []}\n'])
def test_a_bad_line_is_one_error_and_exit_2(line: bytes) -> None:
    r = spare(line)
    err = r.stderr.decode()
    assert r.returncode == 2 and "a spare child was handed a bad command" in err and len(err.strip().splitlines()) == 1, err


def test_stdin_closed_without_a_line_ends_it_quietly() -> None:
    r = spare(None)
    assert r.returncode == 0 and not r.stderr


def test_a_spare_runs_the_command_it_is_handed() -> None:
    r = spare(b'{"argv": ["list", "--json"]}\n')
    assert r.returncode == 0 and r.stdout.decode().lstrip().startswith("["), r.stderr


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc/PID/cmdline")
def test_the_routers_models_load_in_spares(tmp_path: Path) -> None:
    env = rt.isolated_env(tmp_path)
    server = rt.start(env, "--models-max", "1")
    try:
        with http_client(server) as h:
            for model in ("smollm2", "gemma3-270m"):
                r = h.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 1})
                assert r.status_code == 200, r.text
                pid = int(re.findall(rf"loaded {model} in [\d.]+ s \(pid (\d+),", server.log)[-1])
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
                assert b"localllm.spare" in cmdline, cmdline  # started ahead, handed this model
        spares = subprocess.run(["pgrep", "-P", str(server.proc.pid), "-f", "localllm.spare"], capture_output=True,
                                text=True).stdout.split()
        assert len(spares) == 2  # the loaded model's process, and the next one waiting
    finally:
        server.stop()
    left = [pid for pid in spares if Path(f"/proc/{pid}").exists()]
    assert not left, "a spare outlived the router"
