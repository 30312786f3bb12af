"""Ollama's model management in router mode (issue 46, section 5): ``/api/pull``
streams Ollama's NDJSON progress and ``/api/delete`` removes what localllm
stored, both through localllm's own pull and rm (``store.pulling``,
``store.removal``), against the loopback hub (``tests/helpers/fake_hub.py``).

Most tests drive the router's ASGI app in this process with the official
``ollama`` client (its async one, on httpx's ASGI transport), the hub's settings
read again from each test's environment (``hf_hub_env``); the last ones start
the router as a process, with the hub's endpoint in its environment, and use
the sync client over real HTTP: pull, list, chat, delete."""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from localllm.router import manage
from localllm.router.catalog import Catalog
from localllm.router.children import Spawn
from localllm.router.pool import Pool
from localllm.router.proxy import Router
from localllm.store import registry
from scripts.fuzz_gguf import STR, _replace_kv, enc
from scripts.synth_gguf import CHATML, SynthSpec, write_llama_gguf
from tests.helpers import router as rt
from tests.helpers.damaged_gguf import mutated
from tests.helpers.fake_hub import FakeHub
from tests.helpers.server import KEY

pytestmark = pytest.mark.slow  # a loopback hub, threads, and (the last tests) a router process

REPO_ID = "acme/Synth-GGUF"
LLAMA = ("bartowski/Llama-3.2-1B-Instruct-GGUF", "Llama-3.2-1B-Instruct-Q4_K_M.gguf")  # the catalog's llama-3.2-1b-instruct


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A small model (a few hundred KB) and a larger one (several MiB: several
    progress steps, time to leave in the middle)."""
    d = tmp_path_factory.mktemp("manage-models")
    small = write_llama_gguf(d / "small.gguf", SynthSpec())
    return {"small": small, "large": write_llama_gguf(d / "large.gguf", SynthSpec(n_layer=4, n_embd=256, n_ff=512))}


@pytest.fixture
def hub(models: dict[str, Path], monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]):
    h = FakeHub().start()
    h.add(REPO_ID, "Synth-Q4_K_M.gguf", models["small"])
    h.add(REPO_ID, "Synth-Q8_0.gguf", models["large"])
    h.add(*LLAMA, models["small"])
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    yield h
    h.stop()


def _spawn(tmp_path: Path) -> Spawn:
    """Stand-in children (``tests.helpers.router.FAKE_SERVE``): a model "loads" in milliseconds."""
    return Spawn(head=(sys.executable, "-c", rt.FAKE_SERVE), options=(), key="k", config=str(tmp_path / "none.toml"))


@pytest.fixture
async def app(tmp_path: Path):
    pool = Pool(_spawn(tmp_path), models_max=4, keep_alive=300.0, max_waiting=8, say=lambda s: None, wait_s=5.0)
    router = Router(Catalog(), pool, key=KEY, internal_key="internal")
    yield router
    await router.aclose()
    await pool.close()


def ollama_client(app: Router, key: str | None = KEY):
    import httpx
    import ollama

    headers = {"Authorization": f"Bearer {key}"} if key else {}
    return ollama.AsyncClient(host="http://router.test", headers=headers, transport=httpx.ASGITransport(app=app))


async def pull_lines(app: Router, name: str) -> list[dict]:
    client = ollama_client(app)
    return [part.model_dump(exclude_none=True) async for part in await client.pull(name, stream=True)]


def cdn_gets(h: FakeHub) -> int:
    return sum(1 for m, p, _ in h.requests if m == "GET" and p.startswith("/cdn/"))


def blobs() -> Path:
    return Path(os.environ["HF_HOME"]) / "hub" / "models--acme--Synth-GGUF" / "blobs"


# -- pull ------------------------------------------------------------------------------


async def test_pull_streams_ollamas_progress_and_the_model_is_listed_at_once(app: Router, hub: FakeHub, models) -> None:
    sha = hashlib.sha256(models["large"].read_bytes()).hexdigest()
    size = models["large"].stat().st_size
    lines = await pull_lines(app, f"hf.co/{REPO_ID}:Q8_0")
    statuses = [x["status"] for x in lines]
    assert statuses[0] == "pulling manifest" and statuses[-3:] == ["verifying sha256 digest", "writing manifest", "success"]
    steps = [x for x in lines if "digest" in x]
    assert steps and all(x["status"] == f"pulling {sha[:12]}" and x["digest"] == f"sha256:{sha}" and x["total"] == size for x in steps)
    assert [x["completed"] for x in steps] == sorted(x["completed"] for x in steps) and steps[-1]["completed"] == size
    names = {m.model for m in (await ollama_client(app).list()).models}
    assert "synth:q8_0" in names  # listed now, not after the catalog's 5 s
    entry = registry.find("synth:q8_0")
    assert entry is not None and entry.source == "pulled" and entry.path.read_bytes() == models["large"].read_bytes()
    # a second pull finds it in the cache: the same lines, nothing downloaded
    before = cdn_gets(hub)
    again = await pull_lines(app, "acme/Synth-GGUF:q8_0")
    assert again[-1] == {"status": "success"} and [x["completed"] for x in again if "digest" in x] == [size] and cdn_gets(hub) == before


async def test_catalog_and_ollama_names_and_the_older_name_field(app: Router, hub: FakeHub) -> None:
    import httpx

    lines = await pull_lines(app, "llama3.2:1b")  # Ollama's name: the catalog's llama-3.2-1b-instruct, its Q4_K_M
    assert lines[-1] == {"status": "success"}
    assert ("GET", f"/api/models/{LLAMA[0]}/tree/main", None) in hub.requests
    assert "llama-3.2-1b-instruct:q4_k_m" in {m.model for m in (await ollama_client(app).list()).models}
    assert (await app._entry("llama3.2:1b", required=True)).name == "llama-3.2-1b-instruct:q4_k_m"  # and a chat may name it so
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test",
                                 headers={"Authorization": f"Bearer {KEY}"}) as http:
        r = await http.post("/api/pull", json={"name": "llama-3.2-1b-instruct", "stream": False})  # older clients: "name"
        assert r.status_code == 200 and r.json() == {"status": "success"}
        r = await http.post("/api/pull", json={"model": "smollm2:latest", "stream": False})  # served already: nothing to do
        assert r.status_code == 200 and r.json() == {"status": "success"}
        for bad in ("../../etc/passwd", "a\nb", "x" * 300):
            r = await http.post("/api/pull", json={"model": bad})
            assert r.status_code == 400 and "error" in r.json(), bad
        r = await http.post("/api/pull", json={"model": REPO_ID, "stream": "yes"})
        assert r.status_code == 400
    requests = len(hub.requests)
    import ollama

    for name in ("mistral-nemo:12b", "gemma2", "llama3.2:1b-text-q8_0", "some-model"):
        with pytest.raises(ollama.ResponseError) as info:
            await pull_lines(app, name)
        assert info.value.status_code == 404, name
        said = info.value.error
        assert f"model '{name}' cannot be pulled here" in said and "owner/repo[:QUANT]" in said and "llama3.2:1b" in said
        assert "localllm list --catalog" in said
    assert len(hub.requests) == requests  # refused before the Hub was asked


async def test_a_hub_that_lies_is_an_error_line_not_a_crash(app: Router, hub: FakeHub, monkeypatch, hf_hub_env) -> None:
    import ollama

    hub.corrupt.add("Synth-Q4_K_M.gguf")  # the bytes do not hash to the sha256 announced
    with pytest.raises(ollama.ResponseError, match="checksum mismatch"):
        await pull_lines(app, REPO_ID)
    assert registry.find("synth:q4_k_m") is None and not list(blobs().glob("*.incomplete"))
    hub.corrupt.clear()
    with pytest.raises(ollama.ResponseError, match=r"no repo acme/Nothing-GGUF"):
        await pull_lines(app, "acme/Nothing-GGUF")
    with pytest.raises(ollama.ResponseError, match=r"has no Q5_K_M"):
        await pull_lines(app, f"{REPO_ID}:Q5_K_M")
    garbage = _garbage_hub()
    try:
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{garbage.server_address[1]}")
        hf_hub_env()
        with pytest.raises(ollama.ResponseError, match="not JSON"):
            await pull_lines(app, REPO_ID)
        import httpx

        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://router.test",
                                     headers={"Authorization": f"Bearer {KEY}"}) as http:
            r = await http.post("/api/pull", json={"model": REPO_ID, "stream": False})
            assert r.status_code == 500 and "not JSON" in r.json()["error"]  # Ollama's answer to a failed pull without a stream
    finally:
        garbage.shutdown()
        garbage.server_close()
    assert (await ollama_client(app).list()).models  # and the router goes on


def _garbage_hub() -> ThreadingHTTPServer:
    """A "hub" that answers every request with 200 and an HTML page."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: object) -> None:
            pass

        def do_GET(self) -> None:
            body = b"<html>not an API</html>"
            self.send_response(200)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        do_HEAD = do_GET

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return server


async def test_a_second_request_joins_the_first_pull(app: Router, hub: FakeHub, models) -> None:
    hub.trickle = 0.01  # 64 KiB every 10 ms: the pull lasts long enough for the second to join
    first, second = await asyncio.gather(pull_lines(app, f"{REPO_ID}:Q8_0"), pull_lines(app, f"hf.co/{REPO_ID}:q8_0"))
    assert first[-1] == second[-1] == {"status": "success"}
    listings = [p for m, p, _ in hub.requests if p.startswith("/api/models/")]
    assert len(listings) == 1 and cdn_gets(hub) == 1  # one pull for both: one listing, one transfer
    assert [x["completed"] for x in second if "digest" in x][-1] == models["large"].stat().st_size  # the joiner saw it to the end


async def test_the_last_client_leaving_stops_the_pull_and_the_next_resumes(app: Router, hub: FakeHub, models) -> None:
    hub.trickle = 0.02  # 64 KiB every 20 ms: about 2 s for the large file
    size = models["large"].stat().st_size
    answer = await app.manage.pull({"model": f"{REPO_ID}:Q8_0"})
    assert isinstance(answer, manage.PullAnswer)
    sent: list[dict] = []
    gone = asyncio.Event()

    async def receive() -> dict:
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict) -> None:
        if message.get("body"):
            sent.append(json.loads(message["body"]))
            if sent[-1].get("completed"):  # a MiB has come: the client goes
                gone.set()

    await asyncio.wait_for(answer(None, receive, send), 30)
    await asyncio.wait_for(answer.job.done.wait(), 30)
    assert answer.job.final is not None and "stopped: its clients went away" in answer.job.final[0]["error"]
    part = next(blobs().glob("*.incomplete"))
    kept = part.stat().st_size
    assert 0 < kept < size  # stopped in the middle, what came is kept
    hub.trickle = 0.0
    lines = await pull_lines(app, f"{REPO_ID}:Q8_0")
    assert lines[-1] == {"status": "success"}
    assert [x["completed"] for x in lines if "digest" in x][0] == kept  # it started where the last one stopped
    assert hub.ranges()[-1] == f"bytes={kept}-"
    assert registry.find("synth:q8_0").path.read_bytes() == models["large"].read_bytes()


async def test_with_models_a_pull_is_refused(tmp_path: Path) -> None:
    import ollama

    pool = Pool(_spawn(tmp_path), models_max=1, keep_alive=None, max_waiting=1, say=lambda s: None)
    app = Router(Catalog(["smollm2"]), pool, key=KEY, internal_key="internal")
    with pytest.raises(ollama.ResponseError) as info:
        await ollama_client(app).pull(REPO_ID)
    assert info.value.status_code == 403 and "--models" in info.value.error
    await app.aclose()


# -- delete ----------------------------------------------------------------------------


async def test_delete_removes_what_localllm_pulled_and_refuses_the_rest(app: Router, hub: FakeHub, tmp_path: Path, models) -> None:
    import ollama

    mine = rt.copy_of(models["small"], tmp_path / "mine", "my-model.gguf")
    registry.add_path(mine)  # before the router's catalog first reads the registry
    client = ollama_client(app)
    assert (await pull_lines(app, REPO_ID))[-1] == {"status": "success"}
    path = registry.find("synth:q4_k_m").path
    assert (await client.delete("synth:q4_k_m:latest")).status == "success"
    assert "synth:q4_k_m" not in {m.model for m in (await client.list()).models}  # gone at once
    assert not path.exists() and not list(blobs().iterdir()) and registry.load_record().pulled == []
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("synth:q4_k_m")
    assert info.value.status_code == 404 and "model 'synth:q4_k_m' not found" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("smollm2")  # built in: a pip package's
    assert info.value.status_code == 403 and "pip uninstall" in info.value.error and "localllm deletes only what it stored" in info.value.error
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("my-model")
    assert info.value.status_code == 403 and "a file you added" in info.value.error
    assert mine.exists() and registry.find("my-model") is not None  # neither deleted nor forgotten
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("../etc/passwd")
    assert info.value.status_code == 400


async def test_a_loaded_model_is_unloaded_first_and_a_busy_one_is_a_409(app: Router, hub: FakeHub) -> None:
    import ollama

    client = ollama_client(app)
    assert (await pull_lines(app, REPO_ID))[-1] == {"status": "success"}
    entry = await app._entry("synth:q4_k_m", required=True)
    child = await app.pool.acquire(entry)  # a request in flight
    with pytest.raises(ollama.ResponseError) as info:
        await client.delete("synth:q4_k_m")
    assert info.value.status_code == 409 and "1 request(s)" in info.value.error
    assert registry.find("synth:q4_k_m") is not None
    app.pool.release(child)  # done: loaded and idle
    assert "synth:q4_k_m" in app.pool.children
    assert (await client.delete("synth:q4_k_m")).status == "success"
    assert "synth:q4_k_m" not in app.pool.children and not child.running and registry.find("synth:q4_k_m") is None


async def test_both_need_the_key(app: Router, hub: FakeHub) -> None:
    import ollama

    for call in (lambda c: c.pull(REPO_ID), lambda c: c.delete("smollm2")):
        for key in (None, "wrong"):
            with pytest.raises(ollama.ResponseError) as info:
                await call(ollama_client(app, key))
            assert info.value.status_code == 401
    assert hub.requests == [] and registry.find("smollm2") is not None


# -- a router process, the sync client, real HTTP ------------------------------------------


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, models: dict[str, Path]):
    """A router process whose Hub is a loopback hub serving a small model that can chat."""
    root = tmp_path_factory.mktemp("manage-router")
    chat = mutated(models["small"], root, "chat.gguf", lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, CHATML), add=True))
    h = FakeHub().start()
    h.add("acme/Chat-GGUF", "Chat-Q4_K_M.gguf", chat)
    h.add(REPO_ID, "Synth-Q8_0.gguf", models["large"])
    env = {**rt.isolated_env(root), "HF_ENDPOINT": h.endpoint}
    s = rt.start(env)
    try:
        yield s, h, env
    finally:
        s.stop()
        h.stop()


def test_pull_list_chat_delete_with_the_official_client(served) -> None:
    import ollama

    server, h, env = served
    client = ollama.Client(host=server.base, headers={"Authorization": f"Bearer {KEY}"})
    parts = list(client.pull("hf.co/acme/Chat-GGUF", stream=True))
    assert parts[0].status == "pulling manifest" and parts[-1].status == "success"
    assert any(p.total and p.completed == p.total and p.digest.startswith("sha256:") for p in parts)
    assert "chat:q4_k_m" in {m.model for m in client.list().models}
    reply = client.chat(model="chat:q4_k_m", messages=[{"role": "user", "content": "hi"}], options={"num_predict": 4, "temperature": 0})
    assert reply.done and reply.message.role == "assistant"
    assert "chat:q4_k_m" in {m.model for m in client.ps().models}
    assert client.delete("chat:q4_k_m").status == "success"
    assert "chat:q4_k_m" not in {m.model for m in client.list().models}
    assert "chat:q4_k_m" not in {m.model for m in client.ps().models}  # unloaded before its file went
    assert rt.count(server, r"unloading chat:q4_k_m") == 1 and rt.count(server, r"DELETE /api/delete 200 deleted chat:q4_k_m") == 1
    with pytest.raises(ollama.ResponseError) as info:
        client.delete("smollm2")
    assert info.value.status_code == 403
    assert (Path(env["HF_HOME"]) / "hub" / "models--acme--Chat-GGUF").exists()
    assert not list((Path(env["HF_HOME"]) / "hub" / "models--acme--Chat-GGUF" / "blobs").iterdir())


def test_a_client_that_leaves_mid_stream_stops_the_pull(served) -> None:
    import httpx2

    server, h, env = served
    h.trickle = 0.02
    try:
        with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=60) as http:
            with http.stream("POST", "/api/pull", json={"model": f"{REPO_ID}:Q8_0"}) as resp:
                assert resp.status_code == 200 and resp.headers["content-type"] == "application/x-ndjson"
                for line in resp.iter_lines():
                    if json.loads(line).get("completed"):
                        break  # a MiB has come: the client goes
        rt.wait_for(lambda: rt.count(server, r"POST /api/pull 499 .*stopped, every client went away"), timeout=20)
        part = next((Path(env["HF_HOME"]) / "hub" / "models--acme--Synth-GGUF" / "blobs").glob("*.incomplete"))
        assert 0 < part.stat().st_size < os.path.getsize(h.files[(REPO_ID, "Synth-Q8_0.gguf")].path)
        with httpx2.Client(base_url=server.base, timeout=60) as bare:  # and without the key: 401, for both
            assert bare.post("/api/pull", json={"model": REPO_ID}).status_code == 401
            assert bare.request("DELETE", "/api/delete", json={"model": "smollm2"}).status_code == 401
    finally:
        h.trickle = 0.0
