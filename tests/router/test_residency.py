"""Which models the router keeps loaded: ``residency.decide``'s rules (the memory
plan's bytes against the budget, ``--models-max``, least recently used idle
models out first, busy ones never), then a real router: ``--models-max`` makes
room by stopping the least recently used idle model, ``keep_alive`` and
``--keep-alive`` unload idle ones, and llama-server's ``/models/load`` and
``/models/unload`` do it by hand. (The memory plan with real models:
``test_plan_residency.py``.)"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from localllm.router.residency import Budget, Decision, Need, Resident, decide
from tests.helpers import router as rt
from tests.helpers.server import http_client

MiB = 2**20
GPU = Budget(gpu=1000 * MiB, margin=128 * MiB, ram=4000 * MiB)  # 872 MiB for the models on the GPU
PLENTY = 100_000 * MiB  # RAM available now: not the limit


def res(name: str, gpu: int, cpu: int = 0, *, idle: bool = True, used: float = 0.0) -> Resident:
    return Resident(name, Need(gpu * MiB, cpu * MiB), idle, used)


def test_a_model_that_fits_beside_the_loaded_ones_loads_beside_them() -> None:
    assert decide(Need(400 * MiB, 10 * MiB), [res("a", 400, 10)], GPU, PLENTY) == Decision("load")
    assert decide(Need(472 * MiB, 0), [res("a", 400)], GPU, PLENTY).action == "load"  # exactly the budget less the head-room


def test_the_least_recently_used_idle_models_go_until_it_fits() -> None:
    residents = [res("new", 300, used=3.0), res("old", 300, used=1.0), res("mid", 200, used=2.0)]
    d = decide(Need(400 * MiB, 0), residents, GPU, PLENTY)
    assert d.action == "unload" and d.victims == ("old", "mid")  # 800 in use, 72 left: 300 + 200 freed, the least recent first
    assert "needs 400.00 MiB of GPU memory" in d.why and "leave 72.00 MiB" in d.why


def test_a_busy_model_is_never_unloaded_only_waited_for() -> None:
    d = decide(Need(500 * MiB, 0), [res("busy", 500, idle=False, used=0.0), res("idle", 100, used=1.0)], GPU, PLENTY)
    assert d.action == "wait" and d.victims == ()  # unloading the idle one would not be enough: nothing is unloaded for nothing
    d = decide(Need(300 * MiB, 0), [res("busy", 500, idle=False), res("idle", 100, used=1.0)], GPU, PLENTY)
    assert d == Decision("unload", ("idle",), d.why)


def test_a_model_that_cannot_fit_alone_is_refused_and_nothing_is_unloaded() -> None:
    d = decide(Need(900 * MiB, 0), [res("a", 100)], GPU, PLENTY)
    assert d.action == "never" and d.victims == ()
    assert d.why == "it needs 900.00 MiB of GPU memory, more than the budget 1000.00 MiB less 128.00 MiB head-room"
    assert decide(Need(0, 5000 * MiB), [], GPU, PLENTY).action == "never"  # RAM: more than the machine had at the start


def test_ram_counts_each_model_once_and_sees_other_programs() -> None:
    cpu_only = Budget(gpu=None, margin=0, ram=1000 * MiB)
    # the start figure less the resident's plan: 1000 - 600 = 400 left
    assert decide(Need(0, 400 * MiB), [res("a", 0, 600, idle=False)], cpu_only, PLENTY).action == "load"
    assert decide(Need(0, 401 * MiB), [res("a", 0, 600, idle=False)], cpu_only, PLENTY).action == "wait"
    # another program took RAM since: 300 available now + the 600 the resident holds = 900; 300 left
    d = decide(Need(0, 400 * MiB), [res("a", 0, 600)], cpu_only, 300 * MiB)
    assert d.action == "unload" and d.victims == ("a",)
    d = decide(Need(0, 400 * MiB), [], cpu_only, 300 * MiB)  # nothing to unload, nothing to wait for: not now
    assert d.action == "refuse" and "needs 400.00 MiB of RAM and 300.00 MiB is left" in d.why
    # a model planned on the CPU alone takes nothing of the GPU budget, however small
    assert decide(Need(0, 10 * MiB), [res("a", 870)], GPU, PLENTY).action == "load"


def test_models_max_counts_too_and_says_so() -> None:
    d = decide(Need(10 * MiB, 0), [res("a", 10, used=2.0), res("b", 10, used=1.0)], GPU, PLENTY, slots=2)
    assert d == Decision("unload", ("b",), "--models-max 2")
    assert decide(None, [res("a", 0, idle=False)], None, 0, slots=1) == Decision("wait", why="--models-max 1")
    assert decide(None, [res("a", 0)] * 3, None, 0).action == "load"  # no plan, no cap


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


@pytest.mark.slow
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


@pytest.mark.slow
def test_a_busy_model_is_never_stopped_to_make_room(router) -> None:
    """While a stream runs on one model, a request for the other waits for it, then loads."""
    order, text = rt.stream_while_another_loads(router, "smollm2", "smol-twin")
    assert order == ["stream done", "smol-twin 200"]
    assert "[DONE]" in text  # the stream ran to its end: its model was not stopped under it


@pytest.mark.slow
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
