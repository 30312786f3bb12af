"""Residency decided by the memory plan: each model fitted as ``run`` fits it,
loaded beside the others only where its planned bytes fit what they leave,
the least recently used idle ones unloaded otherwise, a busy one waited for,
and a model that cannot fit even alone refused at once with the plan's reason.

First the pool with stand-in children and plans (milliseconds a process), then
real routers on SmolLM2 and gemma3-270m. On a machine without a GPU ``--vram``
is a simulated GPU budget: the plan places layers on it and counts their bytes
as it would on a real one (the children run on the CPU all the same), which is
what makes the budgets below exact and the same on every machine:

- SmolLM2 (``--ctx 256 --parallel 1``): 104.61 MiB on the GPU, gemma3-270m
  248.80 MiB; the fit keeps 128 MiB of head-room under 2.5 GiB.
- ``--vram 600MiB``: 104.61 + 248.80 + 128 = 481.41 MiB: both fit together.
- ``--vram 300MiB --ngl -1`` (every layer on the GPU, as asked): SmolLM2 alone
  takes 232.61 MiB, two of it 337.22: one at a time; gemma3-270m needs 376.80:
  it cannot fit even alone.
"""

from __future__ import annotations

import asyncio
import json
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from localllm.router.children import Spawn
from localllm.router.pool import Busy, DoesNotFit, Pool
from localllm.router.residency import Budget, Memory
from localllm.store.registry import ModelEntry
from tests.helpers import router as rt
from tests.helpers.cli import cli
from tests.helpers.server import KEY, http_client

pytestmark = pytest.mark.slow  # starts processes

MiB = 2**20


# -- the pool, with stand-in children and plans ------------------------------------


@pytest.fixture
def entries(tmp_path: Path) -> dict[str, ModelEntry]:
    out = {}
    for name in ("a", "b", "big", "huge"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
        out[name] = ModelEntry(name, tmp_path / f"{name}.gguf", "added")
    return out


PLANS = {"a": rt.fake_plan(300 * MiB, 10 * MiB), "b": rt.fake_plan(300 * MiB, 10 * MiB), "big": rt.fake_plan(600 * MiB, 10 * MiB),
         "huge": rt.fake_plan(0, 0, fits=False, sentence="even with every layer on the CPU it needs 9 GiB")}


def planned_pool(tmp_path: Path, said: list[str], calls: list[str], on_fit: Callable[[], None] | None = None, **kw) -> Pool:
    """A pool whose models are planned by ``PLANS`` in a 1000 MiB GPU budget (872 MiB for
    models); ``on_fit`` is called in the fit's thread as the fit ends."""
    def plan(path: Path, name: str):
        assert name == path.stem  # the entry's name: its options are looked up by it
        calls.append(path.stem)
        time.sleep(0.05)  # a fit takes a while: concurrent requests must share it
        if on_fit is not None:
            on_fit()
        return PLANS[path.stem]

    memory = Memory(Budget(gpu=1000 * MiB, margin=128 * MiB, ram=4000 * MiB), plan, lambda: 100_000 * MiB)
    spawn = Spawn(head=(sys.executable, "-c", rt.FAKE_SERVE), options=(), key="k", config=str(tmp_path / "none.toml"))
    settings = {"models_max": 0, "keep_alive": 300.0, "max_waiting": 8, "wait_s": 5.0, **kw}
    return Pool(spawn, say=said.append, memory=memory, **settings)


async def test_the_pool_plans_once_loads_beside_and_unloads_the_idle_for_room(tmp_path: Path, entries) -> None:
    said: list[str] = []
    calls: list[str] = []
    p = planned_pool(tmp_path, said, calls)
    children = await asyncio.gather(*(p.acquire(entries["a"]) for _ in range(4)))
    assert calls == ["a"] and p.loads == 1  # four first requests: one fit, one child
    for c in children:
        p.release(c)
    b = await p.acquire(entries["b"])  # 300 + 300 of 872: beside
    p.release(b)
    assert set(p.children) == {"a", "b"} and calls == ["a", "b"]
    big = await p.acquire(entries["big"])  # 600 beside 600: a (least recently used) goes, then b
    assert set(p.children) == {"big"} and p.loads == 3
    assert any(s.startswith("unloading a: to make room for big (it needs 600.00 MiB of GPU memory and the models loaded leave 272.00 MiB)")
               for s in said)
    p.release(big)
    await p.close()


def test_a_request_that_arrives_as_the_fit_ends_gets_the_plan(tmp_path: Path, entries) -> None:
    """The race CI hit: a request whose first step runs after the fit's task ended but
    before the loop ran the task's done callbacks. It must be answered, not spin the
    loop (which then never runs those callbacks) looking for the plan."""
    calls: list[str] = []
    late: list[asyncio.Task] = []

    async def scenario() -> int:
        loop = asyncio.get_running_loop()

        def late_request() -> None:  # queued behind the fit's wake-up: its first step runs after the fit's task ends
            late.append(loop.create_task(p.acquire(entries["a"])))

        def hold_then_request() -> None:  # holds the loop while the fit's result is queued, then queues the request behind it
            time.sleep(0.2)
            loop.call_soon(late_request)

        def fit_ends() -> None:  # in the fit's thread, before its result reaches the loop
            loop.call_soon_threadsafe(hold_then_request)

        p = planned_pool(tmp_path, [], calls, on_fit=fit_ends)
        first = await p.acquire(entries["a"])
        second = await asyncio.wait_for(late[0], 10)
        assert first is second and p.loads == 1 and calls == ["a"]
        p.release(first)
        p.release(second)
        await p.close()
        return first.in_flight

    result: list[int] = []
    runner = threading.Thread(target=lambda: result.append(asyncio.run(scenario())), daemon=True)
    runner.start()
    runner.join(30)  # a spinning loop cannot be timed out from inside it
    assert result == [0], "the late request spun the event loop looking for the plan"


async def test_the_pool_refuses_at_once_what_cannot_fit_alone_and_unloads_nothing(tmp_path: Path, entries) -> None:
    said: list[str] = []
    calls: list[str] = []
    p = planned_pool(tmp_path, said, calls)
    a = await p.acquire(entries["a"])
    p.release(a)
    for _ in range(2):
        with pytest.raises(DoesNotFit, match="^huge does not fit: even with every layer on the CPU it needs 9 GiB$"):
            await asyncio.wait_for(p.acquire(entries["huge"]), 1)
    assert calls == ["a", "huge"]  # the refusal is kept while the file is unchanged
    assert set(p.children) == {"a"} and a.running and not any(s.startswith("unloading") for s in said)
    await p.close()


async def test_the_pool_waits_for_a_busy_model_within_its_bound(tmp_path: Path, entries) -> None:
    said: list[str] = []
    p = planned_pool(tmp_path, said, [], wait_s=0.3)
    a = await p.acquire(entries["a"])
    b = await p.acquire(entries["b"])  # both busy: 600 of 872 in use
    with pytest.raises(Busy, match="cannot load big now: it needs 600.00 MiB of GPU memory .* and the models loaded are busy"):
        await p.acquire(entries["big"])
    waiting = asyncio.ensure_future(p.acquire(entries["big"]))
    await asyncio.sleep(0.1)
    p.release(a)  # a idle: still not room enough (600 > 872 - 300): nothing is unloaded for nothing
    await asyncio.sleep(0.1)
    assert a.running and not waiting.done()
    p.release(b)  # now both idle: both go
    big = await asyncio.wait_for(waiting, 5)
    assert set(p.children) == {"big"}
    p.release(big)
    await p.close()


# -- real routers --------------------------------------------------------------------


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict[str, str]:
    root = tmp_path_factory.mktemp("plan-residency")
    env = rt.isolated_env(root)
    rt.add(env, rt.copy_of(smollm2, root / "mine", "smol-twin.gguf"))
    return env


def loaded(http) -> dict[str, dict]:
    return {m["name"]: m for m in http.get("/api/ps").json()["models"]}


def complete(http, model: str) -> int:
    return http.post("/v1/completions", json={"model": model, "prompt": "hi", "max_tokens": 2}).status_code


def test_two_models_that_fit_together_both_stay_loaded_and_ps_shows_them(env) -> None:
    s = rt.start(env, "--models", "smollm2,gemma3-270m", "--vram", "600MiB", "--keep-alive", "1m")
    try:
        with http_client(s) as http:
            assert complete(http, "smollm2") == 200 and complete(http, "gemma3-270m") == 200
            ps = loaded(http)
            assert set(ps) == {"smollm2:latest", "gemma3-270m:latest"}
            for m in ps.values():
                b = m["localllm"]["bytes"]
                assert m["size_vram"] == b["gpu"]["total"] > 0 and m["size"] == b["gpu"]["total"] + b["cpu"]["total"]
                assert b["gpu"]["total"] == sum(v for k, v in b["gpu"].items() if k != "total")
                assert m["context_length"] == m["localllm"]["n_ctx"] == 256 and m["expires_at"] is not None
            gpu = sum(m["size_vram"] for m in ps.values())
            assert gpu + 128 * MiB <= 600 * MiB  # together within the budget less its head-room
            models = {m["id"]: m for m in http.get("/models").json()["data"]}
            assert models["smollm2"]["size_vram"] == ps["smollm2:latest"]["size_vram"]
            assert models["smollm2"]["localllm"]["bytes"] == ps["smollm2:latest"]["localllm"]["bytes"]
        assert rt.count(s, r"unloading ") == 0
        assert rt.count(s, r"smollm2: fitted to --vram 600\.00 MiB: context 256 .*31 layers on the GPU") == 1  # the child fits as planned
        r = cli("ps", "--url", s.base, "--api-key", KEY)
        assert r.returncode == 0, r.stderr
        lines = r.stdout.splitlines()
        assert lines[0].split() == ["NAME", "SIZE", "PROCESSOR", "CONTEXT", "UNTIL"]
        assert {line.split()[0] for line in lines[1:]} == {"smollm2:latest", "gemma3-270m:latest"}
        assert all("CPU/GPU" in line and " 256 " in line and "from now" in line for line in lines[1:]), r.stdout
        r = cli("ps", "--url", f"{s.base}/v1", "--api-key", KEY, "--json")
        assert r.returncode == 0 and {m["name"] for m in json.loads(r.stdout)["models"]} == set(ps)
    finally:
        s.stop()
    shown = ", ".join(f"{n} {m['size_vram'] / MiB:.2f} MiB" for n, m in ps.items())
    print(f"planned on the GPU: {shown}")


@pytest.fixture(scope="module")
def one_at_a_time(env: dict[str, str]):
    s = rt.start(env, "--models", "smollm2,smol-twin,gemma3-270m", "--vram", "300MiB", "--ngl", "-1", "--keep-alive", "1m")
    try:
        yield s
    finally:
        s.stop()


def test_a_model_that_does_not_fit_beside_the_idle_one_unloads_it(one_at_a_time) -> None:
    s = one_at_a_time
    said = r"unloading smollm2: to make room for smol-twin \(it needs 104\.61 MiB of GPU memory and the models loaded leave 67\.39 MiB\)"
    with http_client(s) as http:
        assert complete(http, "smollm2") == 200
        before = rt.count(s, said)
        t0 = time.perf_counter()
        assert complete(http, "smol-twin") == 200
        switch = time.perf_counter() - t0
        assert set(loaded(http)) == {"smol-twin:latest"}
    assert rt.count(s, said) == before + 1
    print(f"switch by the memory plan (stop one, load the other, 2 tokens): {switch:.2f} s")


def test_a_busy_model_makes_the_next_one_wait(one_at_a_time) -> None:
    order, text = rt.stream_while_another_loads(one_at_a_time, "smollm2", "smol-twin")
    assert order == ["stream done", "smol-twin 200"]
    assert "[DONE]" in text  # the busy model was not stopped under its stream


def test_a_model_that_cannot_fit_alone_is_refused_at_once_and_nothing_is_unloaded(one_at_a_time) -> None:
    s = one_at_a_time
    with http_client(s) as http:
        assert complete(http, "smollm2") == 200
        before = rt.count(s, r"unloading ")
        t0 = time.perf_counter()
        r = http.post("/v1/completions", json={"model": "gemma3-270m", "prompt": "hi", "max_tokens": 2})
        took = time.perf_counter() - t0
        assert r.status_code >= 500
        message = r.json()["error"]["message"]
        assert message.startswith("gemma3-270m does not fit: ") and "300.00 MiB" in message and "head-room" in message, message
        assert set(loaded(http)) == {"smollm2:latest"} and rt.count(s, r"unloading ") == before
        r = http.post("/api/generate", json={"model": "gemma3-270m", "prompt": "hi", "stream": False})
        assert r.status_code >= 500 and r.json()["error"] == message  # kept: the second refusal plans nothing
    assert rt.count(s, r"loading gemma3-270m") == 0
    print(f"refused in {took:.2f} s: {message}")
