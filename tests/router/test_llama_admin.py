"""llama-server router's management routes, with the request shapes of its
``tools/server/tests/unit/test_router.py`` (issue 46): ``GET /props``, ``GET
/models?reload=1`` and ``POST /models/reload``, ``POST /models`` (download)
and ``DELETE /models`` followed on ``GET /models/sse``, and
``--no-models-autoload``.

Most tests drive the router's ASGI app in this process (stand-in children that
"load" in milliseconds; the loopback hub for downloads); the SSE stream is read
as raw ASGI messages, as a server would send them. The last test starts the
router as a process on the real SmolLM2."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from collections.abc import AsyncIterator, Callable
from pathlib import Path

import httpx
import pytest

from localllm.router.catalog import Catalog
from localllm.router.children import Spawn
from localllm.router.pool import Pool
from localllm.router.proxy import Router
from localllm.store import registry
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers import router as rt
from tests.helpers.fake_hub import FakeHub
from tests.helpers.server import KEY, http_client

pytestmark = pytest.mark.slow  # processes (stand-in children), a loopback hub
AUTH = {"Authorization": f"Bearer {KEY}"}
REPO_ID = "acme/Synth-GGUF"


@pytest.fixture
def added(tmp_path: Path) -> list[str]:
    """Two models in this test's data directory, listed by ``localllm list``."""
    names = []
    for stem in ("alpha", "beta"):
        registry.add_path(write_llama_gguf(tmp_path / f"{stem}.gguf", SynthSpec()))
        names.append(stem)
    return names


def make_router(tmp_path: Path, **kw) -> Router:
    spawn = Spawn(head=(sys.executable, "-c", rt.FAKE_SERVE), options=(), key="k", config=str(tmp_path / "none.toml"))
    pool = Pool(spawn, models_max=kw.pop("models_max", 2), keep_alive=300.0, max_waiting=8, say=lambda s: None, wait_s=5.0)
    return Router(Catalog(), pool, key=KEY, internal_key="internal", **kw)


def client(app: Router) -> httpx.AsyncClient:
    return httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test", headers=AUTH)


class SSE:
    """``GET /models/sse`` as raw ASGI: the events as they are sent, until ``close``."""

    def __init__(self, app: Router) -> None:
        self.events: list[dict] = []
        self.started = asyncio.Event()
        self._gone = asyncio.Event()
        scope = {"type": "http", "method": "GET", "path": "/models/sse", "query_string": b"", "root_path": "", "scheme": "http",
                 "headers": [(b"authorization", f"Bearer {KEY}".encode())], "server": ("router.test", 80), "client": ("127.0.0.1", 1)}
        self.task = asyncio.ensure_future(app(scope, self._receive, self._send))

    async def _receive(self) -> dict:
        await self._gone.wait()
        return {"type": "http.disconnect"}

    async def _send(self, message: dict) -> None:
        if message["type"] == "http.response.start":
            assert message["status"] == 200
        for line in message.get("body", b"").decode().splitlines():
            if line.startswith(": connected"):
                self.started.set()
            if line.startswith("data: "):
                self.events.append(json.loads(line[6:]))

    async def wait(self, match: Callable[[dict], bool], timeout: float = 20.0) -> dict:
        async def seen() -> dict:
            while True:
                found = next((e for e in self.events if match(e)), None)
                if found is not None:
                    return found
                await asyncio.sleep(0.01)

        return await asyncio.wait_for(seen(), timeout)

    async def close(self) -> None:
        self._gone.set()
        await asyncio.wait_for(self.task, 10)


@contextlib.asynccontextmanager
async def watched(tmp_path: Path, **kw) -> AsyncIterator[tuple[Router, SSE]]:
    """A router in this process and a client of its /models/sse, subscribed; both closed after."""
    app = make_router(tmp_path, **kw)
    sse = SSE(app)
    try:
        await asyncio.wait_for(sse.started.wait(), 10)
        yield app, sse
    finally:
        await sse.close()
        await app.aclose()
        await app.pool.close()


async def test_props_is_the_routers_and_a_model_is_asked_by_its_query(tmp_path: Path, added: list[str]) -> None:
    app = make_router(tmp_path, models_max=2, autoload=False)
    try:
        async with client(app) as c:
            body = (await c.get("/props")).json()
            assert body["role"] == "router" and body["max_instances"] == 2 and body["models_autoload"] is False
            assert isinstance(body["build_info"], str) and body["build_info"]
            r = await c.get("/props", params={"model": "no-such-model"})  # with ?model= it is that model's, not the router's
            assert r.status_code == 404 and "localllm list" in r.json()["error"]["message"]
    finally:
        await app.aclose()
        await app.pool.close()


async def test_without_autoload_a_request_is_a_400_until_models_load_and_events_follow_it(tmp_path: Path, added: list[str]) -> None:
    name = added[0]
    async with watched(tmp_path, autoload=False) as (app, sse), client(app) as c:
        r = await c.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code == 400 and "POST /models/load" in r.json()["error"]["message"] and not app.pool.children
        r = await c.post("/models/load", json={"model": name})
        assert r.status_code == 200 and r.json() == {"success": True}
        await sse.wait(lambda e: e == {"model": name, "event": "model_status", "data": {"status": "loaded"}})
        r = await c.post("/v1/chat/completions", json={"model": name, "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4})
        assert r.status_code != 400  # past the gate: the stand-in child answers nothing (a 502), a real one answers (last test)
        assert (await c.post("/models/unload", json={"model": name})).json() == {"success": True}
        await sse.wait(lambda e: e == {"model": name, "event": "model_status", "data": {"status": "unloaded"}})
        statuses = [e["data"]["status"] for e in sse.events if e["model"] == name and e["event"] == "model_status"]
        assert statuses == ["loading", "loaded", "unloaded"]


async def test_reload_reads_the_list_again_at_once(tmp_path: Path, added: list[str]) -> None:
    reloads: list[int] = []
    app = make_router(tmp_path)
    def reload() -> None:  # the router's reads the options and forgets the plans too
        reloads.append(1)
        app.catalog.invalidate()

    app.admin._reload = reload
    try:
        async with client(app) as c:
            assert set(added) <= {m["id"] for m in (await c.get("/models")).json()["data"]}
            registry.add_path(write_llama_gguf(tmp_path / "gamma.gguf", SynthSpec()))
            registry.forget_added(tmp_path / "alpha.gguf")
            ids = {m["id"] for m in (await c.get("/models", params={"reload": "1"})).json()["data"]}
            assert "gamma" in ids and "alpha" not in ids and reloads == [1]  # within the catalog's 5 s, read again because asked
            assert (await c.post("/models/reload")).json() == {"success": True} and reloads == [1, 1]
    finally:
        await app.aclose()
        await app.pool.close()


@pytest.fixture
def hub(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    h.add(REPO_ID, "Synth-Q8_0.gguf", write_llama_gguf(tmp_path / "large.gguf", SynthSpec(n_layer=4, n_embd=256, n_ff=512)))
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


async def test_download_streams_progress_on_sse_then_delete_removes_it(tmp_path: Path, hub: FakeHub) -> None:
    name = f"hf.co/{REPO_ID}:Q8_0"
    async with watched(tmp_path) as (app, sse), client(app) as c:
        r = await c.post("/models", json={"model": name})
        assert r.status_code == 200 and r.json() == {"success": True}
        await sse.wait(lambda e: e["event"] == "download_finished" and e["model"] == name)
        progress = [e for e in sse.events if e["event"] == "download_progress" and e["model"] == name]
        assert progress and all(set(f) == {"done", "total"} for e in progress for f in e["data"].values())
        last = list(progress[-1]["data"].values())[0]
        assert last["done"] == last["total"] > 0
        ids = {m["id"] for m in (await c.get("/models")).json()["data"]}
        assert "synth:q8_0" in ids
        r = await c.delete("/models", params={"model": "synth:q8_0"})
        assert r.status_code == 200 and r.json() == {"success": True}
        await sse.wait(lambda e: e == {"model": "synth:q8_0", "event": "model_remove"})
        assert "synth:q8_0" not in {m["id"] for m in (await c.get("/models")).json()["data"]}
        r = await c.post("/models", json={"model": "no/such-repo"})  # started, then failed: said on the stream
        assert r.status_code == 200
        failed = await sse.wait(lambda e: e["event"] == "download_failed" and e["model"] == "no/such-repo")
        assert "no repo no/such-repo" in failed["data"]["error"]
        r = await c.post("/models", json={"model": "../../etc/passwd"})
        assert r.status_code == 400 and "not a path" in r.json()["error"]["message"]
        r = await c.delete("/models")
        assert r.status_code == 400 and "?model=" in r.json()["error"]["message"]


def test_no_models_autoload_as_llama_servers_test_asks_on_the_real_model(tmp_path: Path) -> None:
    """test_router_no_models_autoload's shapes: 400 with an error, load, then 200."""
    env = rt.isolated_env(tmp_path)
    server = rt.start(env, "--no-models-autoload")
    body = {"model": "smollm2", "messages": [{"role": "user", "content": "hello"}], "max_tokens": 4}
    try:
        with http_client(server) as h:
            r = h.post("/v1/chat/completions", json=body)
            assert r.status_code == 400 and "error" in r.json()
            assert h.post("/models/load", json={"model": "smollm2"}).json() == {"success": True}
            rt.wait_for(lambda: {m["id"]: m["status"]["value"] for m in h.get("/models").json()["data"]}["smollm2"] == "loaded", 60)
            r = h.post("/v1/chat/completions", json=body)
            assert r.status_code == 200 and "error" not in r.json()
            props = h.get("/props").json()
            assert props["role"] == "router" and props["models_autoload"] is False and props["max_instances"] == 4
            assert "n_ctx" in h.get("/props", params={"model": "smollm2"}).json()["default_generation_settings"]
    finally:
        server.stop()


async def test_unload_naming_a_download_in_progress_cancels_it(tmp_path: Path, hub: FakeHub) -> None:
    hub.trickle = 0.02  # 64 KiB every 20 ms: the 10 MB file takes seconds
    name = f"hf.co/{REPO_ID}:Q8_0"
    async with watched(tmp_path) as (app, sse), client(app) as c:
        assert (await c.post("/models", json={"model": name})).json() == {"success": True}
        await sse.wait(lambda e: e["event"] == "download_progress" and e["model"] == name)
        assert (await c.post("/models/unload", json={"model": name})).json() == {"success": True}
        failed = await sse.wait(lambda e: e["event"] == "download_failed" and e["model"] == name)
        assert "stopped" in failed["data"]["error"] and "resume" in failed["data"]["error"]
        assert "synth:q8_0" not in {m["id"] for m in (await c.get("/models")).json()["data"]}
