"""The pool's rules, with stand-in children (a few lines of Python that say they
serve, or fail, as ``localllm serve`` would): one child per model whatever the
concurrency, the least recently used idle child out first, a busy child never
stopped, bounded waits, keep_alive, and loads that fail on their own."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from localllm.router.children import Spawn
from localllm.router.pool import Busy, LoadFailed, Pool
from localllm.store.registry import ModelEntry
from tests.helpers.router import FAKE_SERVE

pytestmark = pytest.mark.slow  # starts processes (about 30 ms each)


@pytest.fixture
def entries(tmp_path: Path) -> dict[str, ModelEntry]:
    out = {}
    for name in ("a", "b", "slow", "fails"):
        (tmp_path / f"{name}.gguf").write_bytes(b"GGUF")
        out[name] = ModelEntry(name, tmp_path / f"{name}.gguf", "added")
    return out


def pool(tmp_path: Path, said: list[str] | None = None, **kw) -> Pool:
    spawn = Spawn(head=(sys.executable, "-c", FAKE_SERVE), options=(), key="k", config=str(tmp_path / "none.toml"))
    settings = {"models_max": 4, "keep_alive": 300.0, "max_waiting": 8, "wait_s": 5.0, **kw}
    return Pool(spawn, say=(said if said is not None else []).append, **settings)


async def test_concurrent_requests_for_a_loading_model_share_one_child(tmp_path: Path, entries) -> None:
    p = pool(tmp_path)
    children = await asyncio.gather(*(p.acquire(entries["slow"]) for _ in range(5)))
    assert len({id(c) for c in children}) == 1 and p.loads == 1 and children[0].in_flight == 5
    for c in children:
        p.release(c)
    await p.close()


async def test_the_least_recently_used_idle_child_makes_room(tmp_path: Path, entries) -> None:
    said: list[str] = []
    p = pool(tmp_path, said, models_max=2)
    a = await p.acquire(entries["a"])
    p.release(a)
    b = await p.acquire(entries["b"])
    p.release(b)
    a = await p.acquire(entries["a"])  # a is now the most recent
    p.release(a)
    await p.acquire(entries["slow"])
    assert set(p.children) == {"a", "slow"} and "unloading b: to make room for slow (--models-max 2)" in said
    await p.close()


async def test_a_busy_child_is_never_stopped_and_the_wait_is_bounded(tmp_path: Path, entries) -> None:
    p = pool(tmp_path, models_max=1, wait_s=0.3)
    a = await p.acquire(entries["a"])
    with pytest.raises(Busy, match="--models-max 1"):
        await p.acquire(entries["b"])
    assert a.state == "loaded" and a.running
    waiting = asyncio.ensure_future(p.acquire(entries["b"]))
    await asyncio.sleep(0.1)
    p.release(a)  # a becomes idle: b may take its place
    b = await asyncio.wait_for(waiting, 5)
    assert b.name == "b" and set(p.children) == {"b"} and not a.running
    p.release(b)
    await p.close()


async def test_no_more_than_max_waiting_requests_wait(tmp_path: Path, entries) -> None:
    p = pool(tmp_path, models_max=1, max_waiting=1, wait_s=5.0)
    a = await p.acquire(entries["a"])
    first = asyncio.ensure_future(p.acquire(entries["b"]))
    await asyncio.sleep(0.05)
    with pytest.raises(Busy):
        await asyncio.wait_for(p.acquire(entries["slow"]), 1)  # the queue is full: refused at once, not after 5 s
    p.release(a)
    p.release(await first)
    await p.close()


async def test_a_failed_load_fails_its_requests_and_the_next_one_tries_again(tmp_path: Path, entries) -> None:
    p = pool(tmp_path)
    results = await asyncio.gather(p.acquire(entries["fails"]), p.acquire(entries["fails"]), return_exceptions=True)
    assert all(isinstance(r, LoadFailed) and "fails cannot load: a test said so" in str(r) for r in results)
    assert p.loads == 1 and p.children == {}
    with pytest.raises(LoadFailed):
        await p.acquire(entries["fails"])
    assert p.loads == 2
    a = await p.acquire(entries["a"])  # the others load as ever
    p.release(a)
    await p.close()


async def test_keep_alive_zero_unloads_after_the_reply_and_the_reaper_unloads_idle_ones(tmp_path: Path, entries) -> None:
    said: list[str] = []
    p = pool(tmp_path, said, keep_alive=0.3)
    a = await p.acquire(entries["a"])
    p.release(a, 0)
    await asyncio.wait_for(a.exited.wait(), 5)
    assert "a" not in p.children and "unloading a: keep_alive 0" in said
    reaper = asyncio.ensure_future(p.reap())
    b = await p.acquire(entries["b"])
    p.release(b)  # the server's default: 0.3 s
    forever = await p.acquire(entries["a"])
    p.release(forever, None)  # keep_alive -1: never
    await asyncio.wait_for(b.exited.wait(), 5)
    await asyncio.sleep(0.6)
    assert set(p.children) == {"a"} and any(s.startswith("unloading b: idle for") for s in said)
    reaper.cancel()
    await p.close()


async def test_unload_waits_for_the_requests_in_flight(tmp_path: Path, entries) -> None:
    p = pool(tmp_path)
    a = await p.acquire(entries["a"])
    unload = asyncio.ensure_future(p.unload("a"))
    await asyncio.sleep(0.2)
    assert not unload.done() and a.running
    p.release(a)
    assert await asyncio.wait_for(unload, 5) is True
    assert not a.running and p.children == {}
    assert await p.unload("a") is False
    await p.close()
