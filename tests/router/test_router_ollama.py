"""The router (``serve`` with no MODEL) as Ollama's own clients see it (issue 59):
the real ``ollama`` client and the ``llm`` CLI with its ``llm-ollama`` plugin,
on the two built-in models. Each model's digest is its file's sha256, so
llm-ollama keeps them apart and the model named is the one that answers;
/api/embed and /api/embeddings reach the model named; ``keep_alive: 0`` with
nothing to say unloads and answers ``done_reason: "unload"`` once the model is
out of memory; ``GET``/``HEAD /`` answer ``Ollama is running``, without the key."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest

from localllm.store import builtin
from tests.helpers import router as rt
from tests.helpers.ollama_turns import CALLED, WEATHER
from tests.helpers.server import KEY, http_client

pytestmark = pytest.mark.slow
HI = [{"role": "user", "content": "Say hi."}]
GREEDY = {"temperature": 0, "num_predict": 8}


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, gemma: Path) -> dict[str, str]:
    """The built-in models, gemma3-270m assembled already (a link to the session's), so that both are listed with a file."""
    return rt.with_gemma(rt.isolated_env(tmp_path_factory.mktemp("router-ollama")), gemma)


@pytest.fixture(scope="module")
def router(env: dict[str, str]):
    yield from rt.running(env)


@pytest.fixture(scope="module")
def files(env: dict[str, str], smollm2: Path) -> dict[str, str]:
    """Each built-in model's sha256, read here."""
    gemma = Path(env["LOCALLLM_HOME"]) / "models" / builtin._GEMMA_FILE
    return {name: hashlib.sha256(path.read_bytes()).hexdigest() for name, path in (("smollm2:latest", smollm2), ("gemma3-270m:latest", gemma))}


def _client(router):
    import ollama

    return ollama.Client(host=router.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def test_each_model_is_listed_with_its_files_sha256(router, files: dict[str, str]) -> None:
    client = _client(router)
    listed = {m.model: m.digest for m in client.list().models}
    assert {k: listed[k] for k in files} == files and len(set(files.values())) == 2
    client.chat(model="gemma3-270m", messages=HI, options={"num_predict": 1})
    assert {m.model: m.digest for m in client.ps().models}["gemma3-270m:latest"] == files["gemma3-270m:latest"]
    with http_client(router) as http:  # answered by the model's own process: the same digest
        show = http.post("/api/show", json={"model": "smollm2"}).json()
    assert show["digest"] == files["smollm2:latest"] and show["capabilities"] == ["completion", "tools"]


def test_embed_and_embeddings_reach_the_model_named(router) -> None:
    client = _client(router)
    widths = {name: len(client.embed(model=name, input=["Hello", "world"]).embeddings[1]) for name in ("smollm2", "gemma3-270m")}
    assert widths == {"smollm2": 576, "gemma3-270m": 640}  # each model's own embedding length
    assert len(client.embeddings(model="gemma3-270m", prompt="Hello").embedding) == 640


def test_tools_through_the_router(router) -> None:
    r = _client(router).chat(model="smollm2", messages=CALLED, tools=[WEATHER], options={"temperature": 0, "num_predict": 30})
    assert [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls] == [("get_weather", {"city": "Paris"})]


def test_keep_alive_0_with_nothing_to_say_unloads_then_answers(router) -> None:
    client = _client(router)
    client.chat(model="smollm2", messages=HI, options={"num_predict": 1})
    pid = rt.wait_for(lambda: rt.child_pid(router, "smollm2"))
    r = client.chat(model="smollm2", messages=[], keep_alive=0)
    assert r.done and r.done_reason == "unload" and r.message.role == "assistant" and r.message.content == ""
    assert "smollm2:latest" not in {m.model for m in client.ps().models}  # out of memory by the time it answers
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)
    loads = rt.count(router, r"^localllm: loading gemma3-270m \(")
    for _ in range(2):  # loaded or not, nothing is loaded to be unloaded
        g = client.generate(model="gemma3-270m", prompt="", keep_alive=0)
        assert g.done and g.done_reason == "unload" and g.response == ""
    assert rt.count(router, r"^localllm: loading gemma3-270m \(") == loads
    assert "gemma3-270m:latest" not in {m.model for m in client.ps().models}


def test_root_says_ollama_is_running_without_the_key(router) -> None:
    import httpx2

    with httpx2.Client(base_url=router.base, timeout=60) as bare:
        r = bare.get("/")
        assert r.status_code == 200 and r.text == "Ollama is running"
        head = bare.head("/")
        assert head.status_code == 200 and head.content == b""
        assert bare.get("/api/tags").status_code == 401  # the rest still asks for it


def test_llm_cli_with_llm_ollama_gets_the_model_it_names(router, files: dict[str, str], tmp_path: Path) -> None:
    """The bug report's set-up: ``llm -m ollama/smollm2`` through the router was answered by another model,
    llm-ollama having taken every model of one (null) digest for one."""
    llm_env = {**os.environ, "OLLAMA_HOST": router.base, "OLLAMA_API_KEY": KEY, "LLM_USER_PATH": str(tmp_path), "LLM_LOAD_PLUGINS": "llm-ollama"}

    def llm(*args: str) -> str:
        r = subprocess.run([str(Path(sys.executable).parent / "llm"), *args], env=llm_env, capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        return r.stdout

    table = llm("ollama", "models")
    for name, sha in files.items():
        assert any(line.split()[:2] == [name, sha[:12]] for line in table.splitlines()), table
    models = llm("models", "list")
    assert "ollama/smollm2:latest (aliases: ollama/smollm2)" in models and "ollama/gemma3-270m:latest (aliases: ollama/gemma3-270m)" in models
    before = {name: rt.count(router, rf"^localllm: {name}: POST /api/chat 200") for name in ("smollm2", "gemma3-270m")}
    said = llm("-m", "ollama/smollm2", "Say hi.", "-o", "temperature", "0", "-o", "num_predict", "8", "--no-log")

    def answered(name: str) -> int:
        return rt.count(router, rf"^localllm: {name}: POST /api/chat 200") - before[name]

    rt.wait_for(lambda: answered("smollm2") == 1)  # smollm2's process answered it (its line reaches the router's log after the reply)
    assert answered("gemma3-270m") == 0
    want = {name: _client(router).chat(model=name, messages=HI, options=GREEDY).message.content for name in ("smollm2", "gemma3-270m")}
    assert said.strip() == want["smollm2"].strip() != want["gemma3-270m"].strip()  # greedy: smollm2's own words
