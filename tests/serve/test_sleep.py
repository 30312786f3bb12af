"""``serve MODEL --sleep-idle-seconds N``: the model freed after N idle seconds,
the read-only routes answered asleep, any other request loading it again, as
llama.cpp's tools/server/tests/unit/test_sleep.py states it; on SmolLM2, served
in-process from a fitted (not loaded) model, and once through the command line."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx2
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server
from tests.helpers.server import KEY, http_client
from tests.helpers.server import Server as CliServer

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
pytestmark = pytest.mark.slow
H = {"Authorization": "Bearer k"}


@pytest.fixture
def server(smollm2: Path) -> Iterator[tuple[str, Server]]:
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=512, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1)
    s = Server(runtime.plan(request), ServeOptions(port=0, api_key="k", sleep_idle_s=0.5), say=lambda _: None)
    with s.start():
        yield f"http://127.0.0.1:{s.port}", s


def _sleeping(base: str) -> bool:
    r = httpx2.get(f"{base}/props", headers=H)
    assert r.status_code == 200, r.text
    return r.json()["is_sleeping"]


def _wait_asleep(base: str, timeout: float = 10.0) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if _sleeping(base):
            return
        time.sleep(0.1)
    raise AssertionError("the server did not go to sleep")


def test_it_sleeps_answers_read_only_routes_asleep_and_wakes_for_work(server: tuple[str, Server]) -> None:
    base, s = server
    assert not _sleeping(base)
    _wait_asleep(base)
    end = time.monotonic() + 10  # asleep is said first (a request meanwhile waits to wake it), then the model is freed
    while (s.loaded is not None or s.built is not None) and time.monotonic() < end:
        time.sleep(0.05)
    assert s.loaded is None and s.built is None  # the model is freed
    assert httpx2.get(f"{base}/health").status_code == 200
    assert [m["id"] for m in httpx2.get(f"{base}/v1/models", headers=H).json()["data"]] == [s.name]
    assert httpx2.get(f"{base}/props").status_code == 401  # asleep, still behind the key
    assert _sleeping(base)  # none of that woke it
    r = httpx2.post(f"{base}/completion", headers=H, json={"prompt": "Hello", "n_predict": 1}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 1
    assert not _sleeping(base) and s.loaded is not None
    _wait_asleep(base)
    r = httpx2.post(f"{base}/chat/completions/input_tokens", headers=H, json={"messages": [{"role": "user", "content": "Hello world"}]})
    assert r.status_code == 200 and r.json()["input_tokens"] > 0 and not _sleeping(base)


def test_metrics_go_on_across_a_sleep_without_waking_it(server: tuple[str, Server]) -> None:
    base, _ = server

    def metric(name: str) -> float:
        text = httpx2.get(f"{base}/metrics", headers=H).text
        return float(next(ln.split()[1] for ln in text.splitlines() if ln.startswith(f"llamacpp:{name} ")))

    r = httpx2.post(f"{base}/completion", headers=H, json={"prompt": "Hello", "n_predict": 8, "ignore_eos": True}, timeout=60)
    assert r.status_code == 200 and r.json()["tokens_predicted"] == 8
    _wait_asleep(base)
    assert metric("predicted_tokens_seconds") > 0  # the first scrape reports the last generation's throughput
    assert metric("predicted_tokens_seconds") == 0 and metric("tokens_predicted_total") == 8  # then an empty window, the counters kept
    assert _sleeping(base)
    httpx2.post(f"{base}/tokenize", headers=H, json={"content": "Hello"})
    assert not _sleeping(base) and metric("predicted_tokens_seconds") == 0 and metric("tokens_predicted_total") == 8


def test_the_command_line_flag_puts_serve_model_to_sleep(tmp_path_factory: pytest.TempPathFactory) -> None:
    s = CliServer("smollm2", "--threads", "1", "--ctx", "256", "--parallel", "1", "--api-key", KEY, "--sleep-idle-seconds", "1",
                  env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})
    try:
        with http_client(s) as h:
            end = time.monotonic() + 15
            while not h.get("/props").json()["is_sleeping"]:
                assert time.monotonic() < end, "did not sleep"
                time.sleep(0.2)
            assert h.post("/completion", json={"prompt": "Hello", "n_predict": 1}).status_code == 200
            assert h.get("/props").json()["is_sleeping"] is False
    finally:
        s.stop()


def test_asleep_metrics_show_what_they_last_showed_if_nothing_ran_since(server: tuple[str, Server]) -> None:
    """llama-server's snapshot (its test_server_sleep_read_only_endpoints): scraped twice after work, the second scrape
    (an empty window) is what a sleeping server shows, /props polls between them notwithstanding."""
    base, _ = server
    assert httpx2.post(f"{base}/completion", headers=H, json={"prompt": "Hello", "n_predict": 4}, timeout=60).status_code == 200
    httpx2.get(f"{base}/metrics", headers=H)
    awake = httpx2.get(f"{base}/metrics", headers=H).text
    _wait_asleep(base)
    assert httpx2.get(f"{base}/metrics", headers=H).text == awake and _sleeping(base)


def test_a_sleeping_servers_answers_carry_cors_headers(smollm2: Path) -> None:
    """CORS goes around the sleeper: a page polling /props while the model sleeps can still read it."""
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=256, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1)
    s = Server(runtime.plan(request), ServeOptions(port=0, api_key="k", sleep_idle_s=0.3, cors=("*",)), say=lambda _: None)
    with s.start():
        base = f"http://127.0.0.1:{s.port}"
        _wait_asleep(base)
        r = httpx2.get(f"{base}/props", headers={**H, "Origin": "http://page.example"})
        assert r.json()["is_sleeping"] and r.headers["Access-Control-Allow-Origin"] == "http://page.example"
