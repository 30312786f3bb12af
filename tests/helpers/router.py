"""``localllm serve`` with no MODEL (the router) as a real process on loopback,
with a data directory of its own in which only the built-in models and those a
test adds are listed."""

from __future__ import annotations

import os
import re
import shutil
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

from tests.helpers.cli import cli
from tests.helpers.server import KEY, Server, http_client

SMALL = ("--ctx", "256", "--parallel", "1", "--threads", "1")  # each child small: loads in a second or two


def isolated_env(root: Path) -> dict[str, str]:
    """A module fixture's environment (the per-test one of conftest is not set up yet
    at module scope): localllm's data and every other tool's store under ``root``."""
    return {"LOCALLLM_HOME": str(root / "home"), "HF_HOME": str(root / "hf"), "HF_HUB_CACHE": str(root / "hf" / "hub"),
            "HUGGINGFACE_HUB_CACHE": str(root / "hf" / "hub"), "HF_ENDPOINT": "http://127.0.0.1:9",
            "LOCALLLM_LMSTUDIO_DIR": str(root / "lmstudio"), "OLLAMA_MODELS": str(root / "ollama"), "OLLAMA_KEEP_ALIVE": "5m",
            "LOCALLLM_CONFIG": str(root / "no-config.toml")}


def add(env: dict[str, str], path: Path) -> str:
    """``localllm add PATH`` in ``env``'s data directory; the name it gives."""
    r = cli("add", str(path), "--json", env=env)
    assert r.returncode == 0, r.stderr
    import json

    return json.loads(r.stdout)[0]["name"]


def copy_of(model: Path, folder: Path, name: str) -> Path:
    """A copy of ``model`` under another file name (a link would be the same file, listed once)."""
    folder.mkdir(parents=True, exist_ok=True)
    out = folder / name
    shutil.copyfile(model, out)
    return out


def start(env: dict[str, str], *args: str) -> Server:
    """The router with the test key, the small per-model options and ``args``."""
    return Server("--api-key", KEY, *SMALL, *args, env=env)


def wait_for(check: Callable[[], object], timeout: float = 20.0, every: float = 0.1):
    """``check()``'s first truthy value within ``timeout`` seconds, else an AssertionError."""
    deadline = time.monotonic() + timeout
    while True:
        value = check()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout} s")
        time.sleep(every)


def child_url(server: Server, name: str) -> str | None:
    """The URL of ``name``'s latest child, from the router's "loaded NAME in ... (pid N, URL)" line."""
    urls = [m.group(1) for line in server.lines for m in [re.search(rf"loaded {re.escape(name)} in .*, (http://\S+)\)$", line)] if m]
    return urls[-1] if urls else None


def child_pid(server: Server, name: str) -> int | None:
    """The process id of ``name``'s latest child, from the same line."""
    pids = [int(m.group(1)) for line in server.lines for m in [re.search(rf"loaded {re.escape(name)} in .*\(pid (\d+), ", line)] if m]
    return pids[-1] if pids else None


def count(server: Server, pattern: str) -> int:
    """How many of the router's stderr lines match ``pattern``."""
    return sum(1 for line in server.lines if re.search(pattern, line))


# A stand-in for ``localllm serve PATH --alias NAME ...`` (for the pool's tests: a
# process that starts in milliseconds): says it serves NAME, or fails if NAME
# starts with "fails", or says it late if it starts with "slow"; ends on SIGINT.
FAKE_SERVE = """
import signal, sys, time
name = sys.argv[sys.argv.index("--alias") + 1]
signal.signal(signal.SIGINT, lambda *a: sys.exit(0))
signal.signal(signal.SIGTERM, lambda *a: sys.exit(0))
print(f"localllm: listening on http://127.0.0.1:9/v1: loading {name}", file=sys.stderr, flush=True)
if name.startswith("fails"):
    print(f"localllm: error: {name} cannot load: a test said so", file=sys.stderr, flush=True)
    sys.exit(1)
if name.startswith("slow"):
    time.sleep(0.5)
print(f"localllm: serving {name} on http://127.0.0.1:9/v1 (fake); Ctrl+C stops", file=sys.stderr, flush=True)
while True:
    time.sleep(1)
"""


def fake_plan(gpu: int, cpu: int, *, fits: bool = True, sentence: str = "fits as asked", n_ctx: int = 256):
    """A stand-in for ``prepare.LoadPlan`` with the fields the pool and the listings
    read: ``total`` (GPU, CPU bytes), the fit's verdict and sentence, the context."""
    from types import SimpleNamespace

    fit = SimpleNamespace(fits=fits, sentence=sentence, gpu_budget=None)
    return SimpleNamespace(total=(gpu, cpu), fit=fit, config=SimpleNamespace(n_ctx=n_ctx))


def stream_while_another_loads(server: Server, busy: str, other: str) -> tuple[list[str], str]:
    """A 40-token stream on ``busy``; once its first chunk is in, a request for
    ``other`` from a second client. The order the two ended in, and the stream's text."""
    order: list[str] = []
    with http_client(server) as http:
        assert http.post("/v1/completions", json={"model": busy, "prompt": "hi", "max_tokens": 1}).status_code == 200
        body = {"model": busy, "prompt": "Once upon a time", "max_tokens": 40, "stream": True, "temperature": 0}
        with http.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()
            next(lines)

            def ask_other() -> None:
                with http_client(server) as h2:
                    r = h2.post("/v1/completions", json={"model": other, "prompt": "hi", "max_tokens": 1})
                    order.append(f"{other} {r.status_code}")

            t = threading.Thread(target=ask_other)
            t.start()
            text = "".join(lines)
            order.append("stream done")
        t.join(60)
    return order, text


def with_gemma(env: dict[str, str], gemma: Path) -> dict[str, str]:
    """``env`` with the built-in gemma3-270m already assembled in its data directory
    (a link to the session's file, a copy across file systems), as after its first use."""
    from localllm.store import builtin

    target = Path(env["LOCALLLM_HOME"]) / "models" / builtin._GEMMA_FILE
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(gemma, target)
    except OSError:  # another file system
        shutil.copyfile(gemma, target)
    return env


def running(env: dict[str, str], *args: str, small: bool = True) -> Iterator[Server]:
    """A module fixture's body: the router in ``env`` (``start``'s small per-model options
    unless ``small`` is False: then only the key and ``args``), stopped after the module."""
    s = start(env, *args) if small else Server("--api-key", KEY, *args, env=env)
    try:
        yield s
    finally:
        s.stop()
