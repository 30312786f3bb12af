"""Which models the router keeps loaded: ``--models-max`` makes room by stopping
the least recently used idle model, ``keep_alive`` and ``--keep-alive`` unload
idle ones, and llama-server's ``/models/load`` and ``/models/unload`` do it by hand."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.server import http_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict[str, str]:
    root = tmp_path_factory.mktemp("residency")
    env = rt.isolated_env(root)
    rt.add(env, rt.copy_of(smollm2, root / "mine", "smol-twin.gguf"))
    return env


@pytest.fixture(scope="module")
def router(env: dict[str, str]):
    s = rt.start(env, "--models-max", "1", "--models", "smollm2,smol-twin", "--keep-alive", "1m")
    try:
        yield s
    finally:
        s.stop()


def loaded(http) -> list[str]:
    return [m["name"] for m in http.get("/api/ps").json()["models"]]


def test_a_second_model_stops_the_idle_first_one(router) -> None:
    with http_client(router) as http:
        assert http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2}).status_code == 200
        assert loaded(http) == ["smollm2:latest"]
        t0 = time.perf_counter()
        assert http.post("/v1/completions", json={"model": "smol-twin", "prompt": "hi", "max_tokens": 2}).status_code == 200
        switch = time.perf_counter() - t0
        assert loaded(http) == ["smol-twin:latest"]
        assert rt.count(router, r"unloading smollm2: to make room for smol-twin \(--models-max 1\)") >= 1
        listed = {m["id"] for m in http.get("/v1/models").json()["data"]}
        assert listed == {"smollm2", "smol-twin"}  # --models: only these
        r = http.post("/v1/completions", json={"model": "gemma3-270m", "prompt": "hi"})
        assert r.status_code == 404 and "--models" in r.json()["error"]["message"]
    print(f"model switch (stop one, load the other, answer 2 tokens): {switch:.2f} s")


def test_a_busy_model_is_never_stopped_to_make_room(router) -> None:
    """While a stream runs on one model, a request for the other waits for it, then loads."""
    order: list[str] = []
    with http_client(router) as http:
        assert http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 1}).status_code == 200
        body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 40, "stream": True, "temperature": 0}
        with http.stream("POST", "/v1/completions", json=body) as resp:
            lines = resp.iter_lines()
            next(lines)

            def other() -> None:
                with http_client(router) as h2:
                    r = h2.post("/v1/completions", json={"model": "smol-twin", "prompt": "hi", "max_tokens": 1})
                    order.append(f"twin {r.status_code}")

            t = threading.Thread(target=other)
            t.start()
            text = "".join(lines)
            order.append("stream done")
        t.join(60)
    assert order == ["stream done", "twin 200"]
    assert "[DONE]" in text  # the stream ran to its end: its model was not stopped under it


def test_keep_alive_and_load_unload_by_hand(router) -> None:
    with http_client(router) as http:
        r = http.post("/models/load", json={"model": "smollm2"})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert loaded(http) == ["smollm2:latest"]
        r = http.post("/models/unload", json={"model": "smollm2"})
        assert r.status_code == 200 and r.json() == {"success": True}
        assert loaded(http) == []
        r = http.post("/api/generate", json={"model": "smol-twin", "prompt": "hi", "stream": False, "keep_alive": "1s",
                                             "options": {"num_predict": 2}})
        assert r.status_code == 200, r.text
        assert loaded(http) == ["smol-twin:latest"]
        rt.wait_for(lambda: loaded(http) == [], timeout=6)  # idle past its keep_alive: stopped by the reaper
        assert rt.count(router, r"unloading smol-twin: idle for ") >= 1
        r = http.post("/api/generate", json={"model": "smol-twin", "prompt": "hi", "keep_alive": "soon"})
        assert r.status_code == 400 and "keep_alive" in r.json()["error"]
