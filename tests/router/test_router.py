"""``localllm serve`` with no MODEL, as a real process on loopback, through the
official ``openai`` and ``ollama`` clients and plain HTTP: every model of
``localllm list`` by name, each in a child process of its own, loaded on demand."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import pytest

from tests.helpers import router as rt
from tests.helpers.server import KEY, http_client, openai_client

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict[str, str]:
    """A data directory with the built-in models, a copy of SmolLM2 that only the
    concurrency test asks for, and a copy cut short that cannot load."""
    root = tmp_path_factory.mktemp("router")
    env = rt.isolated_env(root)
    rt.add(env, rt.copy_of(smollm2, root / "mine", "smol-twin.gguf"))
    broken = rt.copy_of(smollm2, root / "mine", "broken.gguf")
    rt.add(env, broken)  # add checks the file: it breaks afterwards, as a disk or a half-finished copy can break it
    with open(broken, "r+b") as f:
        f.truncate(8 * 2**20)  # a whole header, then the weights cut short
    return env


@pytest.fixture(scope="module")
def router(env: dict[str, str]):
    s = rt.start(env)
    try:
        yield s
    finally:
        s.stop()


def test_openai_client_reaches_each_model_by_name(router) -> None:
    client = openai_client(router)
    listed = {m.id: m for m in client.models.list().data}
    assert {"smollm2", "gemma3-270m", "smol-twin", "broken"} <= set(listed)
    assert all(m.model_extra["status"]["value"] in ("loaded", "loading", "unloaded") for m in listed.values())
    prompt = "The three primary colors are"
    texts: dict[str, str] = {}
    for _ in range(2):  # alternated: each request goes to its own model's process, loaded once
        chat = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Say hi."}], max_tokens=6, temperature=0)
        assert chat.model == "smollm2" and chat.choices[0].message.content
        for name in ("gemma3-270m", "smollm2"):
            done = client.completions.create(model=name, prompt=prompt, max_tokens=8, temperature=0)
            assert done.model == name
            assert texts.setdefault(name, done.choices[0].text) == done.choices[0].text  # greedy: the same model, the same text
    assert texts["gemma3-270m"] != texts["smollm2"]  # two models, two answers
    status = {m.id: m.model_extra["status"]["value"] for m in client.models.list().data}
    assert status["smollm2"] == status["gemma3-270m"] == "loaded"
    assert rt.count(router, r"^localllm: loading gemma3-270m \(") == 1  # assembled from its package on first use, then loaded once


def test_streams_token_by_token_and_a_client_that_goes_stops_the_generation(router) -> None:
    client = openai_client(router)
    seen: list[float] = []
    stream = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": "Count to fifty."}], max_tokens=24,
                                            temperature=0, stream=True)
    for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            seen.append(time.monotonic())
    assert len(seen) >= 10 and seen[-1] - seen[0] > 0.05  # the pieces came as they were made, not in one burst
    with http_client(router) as http:
        body = {"model": "smollm2", "messages": [{"role": "user", "content": "Write a long story."}], "max_tokens": 200, "stream": True,
                "temperature": 0}
        with http.stream("POST", "/v1/chat/completions", json=body) as resp:
            assert resp.status_code == 200
            for i, _ in enumerate(resp.iter_lines()):
                if i >= 3:
                    break  # and the client goes away
    rt.wait_for(lambda: rt.count(router, r"smollm2: POST /v1/chat/completions 499 "), timeout=10)  # the child saw the client go


def test_ollama_client_lists_chats_and_unloads_with_keep_alive_0(router) -> None:
    import ollama

    client = ollama.Client(host=router.base, headers={"Authorization": f"Bearer {KEY}"})
    names = {m.model for m in client.list().models}
    assert {"smollm2:latest", "gemma3-270m:latest"} <= names
    reply = client.chat(model="smollm2", messages=[{"role": "user", "content": "Say hi."}], options={"num_predict": 6, "temperature": 0})
    assert reply.message.content
    assert "smollm2:latest" in {m.model for m in client.ps().models}
    client.chat(model="smollm2:latest", messages=[{"role": "user", "content": "Bye."}], options={"num_predict": 4}, keep_alive=0)
    rt.wait_for(lambda: "smollm2:latest" not in {m.model for m in client.ps().models}, timeout=30)
    assert rt.count(router, r"unloading smollm2: keep_alive 0") >= 1
    reply = client.chat(model="smollm2", messages=[{"role": "user", "content": "Again."}], options={"num_predict": 4})  # loads it again
    assert reply.message.content


def test_unknown_names_and_paths_are_refused_without_loading_anything(router, smollm2: Path) -> None:
    loads = rt.count(router, r"^localllm: loading ")
    with http_client(router) as http:
        r = http.post("/v1/chat/completions", json={"model": "no-such-model", "messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 404 and "localllm list" in r.json()["error"]["message"] and "localllm pull" in r.json()["error"]["message"]
        r = http.post("/api/chat", json={"model": "no-such-model", "messages": []})
        assert r.status_code == 404 and "localllm list" in r.json()["error"]  # Ollama's shape on its routes
        for name in ("../../etc/passwd", "/etc/passwd", str(smollm2), "~/x.gguf", "a\nb", "x" * 300, "..\\x"):
            r = http.post("/v1/completions", json={"model": name, "prompt": "hi"})
            assert r.status_code in (400, 404), (name, r.text)
        r = http.post("/v1/completions", json={"model": 7, "prompt": "hi"})
        assert r.status_code == 400
        r = http.get("/no/such/route")
        assert r.status_code == 404
    assert rt.count(router, r"^localllm: loading ") == loads  # nothing was loaded for any of them


def test_messages_and_responses_reach_the_model_they_name(router) -> None:
    """Anthropic's Messages API and OpenAI's Responses API (issue 47) go to the child of the body's
    model, as chat completions do; an unknown model is a 404 in the route's own error shape."""
    hi = [{"role": "user", "content": "Hi"}]
    with http_client(router) as http:
        for name in ("gemma3-270m", "smollm2"):
            m = http.post("/v1/messages", json={"model": name, "max_tokens": 3, "temperature": 0, "messages": hi})
            assert m.status_code == 200 and m.json()["type"] == "message" and m.json()["model"] == name, m.text
            r = http.post("/v1/responses", json={"model": name, "input": "Hi", "max_output_tokens": 3, "temperature": 0})
            assert r.status_code == 200 and r.json()["object"] == "response" and r.json()["model"] == name, r.text
            assert r.json()["output"][0]["content"][0]["text"] == m.json()["content"][0]["text"]  # one model, one engine, greedy: one text
            n = http.post("/v1/messages/count_tokens", json={"model": name, "messages": hi}).json()["input_tokens"]
            assert http.post("/v1/responses/input_tokens", json={"model": name, "input": "Hi"}).json() == {"object": "response.input_tokens", "input_tokens": n}
        loads = rt.count(router, r"^localllm: loading ")
        r = http.post("/v1/messages", json={"model": "no-such-model", "max_tokens": 3, "messages": hi})
        assert r.status_code == 404 and r.json()["type"] == "error" and r.json()["error"]["type"] == "not_found_error"
        r = http.post("/v1/responses", json={"model": "no-such-model", "input": "Hi"})
        assert r.status_code == 404 and r.json()["error"]["code"] == "model_not_found"
    assert rt.count(router, r"^localllm: loading ") == loads


def test_the_api_key_is_the_routers_and_the_children_have_their_own(router) -> None:
    import httpx2

    with httpx2.Client(base_url=router.base, timeout=60) as bare:
        assert bare.get("/health").status_code == 200  # public, as serve's
        assert bare.get("/v1/models").status_code == 401
        assert bare.post("/v1/completions", json={"model": "smollm2", "prompt": "hi"}).status_code == 401
        assert bare.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
        assert bare.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200
        r = bare.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2}, headers={"Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200
    child = rt.wait_for(lambda: rt.child_url(router, "smollm2"))
    with httpx2.Client(base_url=child, timeout=60) as direct:  # the child does not take the user's key
        assert direct.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 401
    assert not any(KEY in line and "loading" in line for line in router.lines)


def test_concurrent_first_requests_start_one_child(router) -> None:
    results: list[int] = []

    def ask() -> None:
        with http_client(router) as http:
            r = http.post("/v1/completions", json={"model": "smol-twin", "prompt": "Hello", "max_tokens": 2})
            results.append(r.status_code)

    threads = [threading.Thread(target=ask) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [200, 200, 200]
    assert rt.count(router, r"^localllm: loading smol-twin \(") == 1
    assert rt.count(router, r"^localllm: loaded smol-twin in ") == 1


def test_a_broken_model_fails_its_own_requests_and_the_others_keep_serving(router) -> None:
    with http_client(router) as http:
        r = http.post("/v1/completions", json={"model": "broken", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 502, r.text
        message = r.json()["error"]["message"]
        assert message.startswith("broken did not load") and "truncated GGUF file" in message, message  # the child's own words
        r = http.post("/api/generate", json={"model": "broken", "prompt": "hi", "stream": False})
        assert r.status_code == 502 and "did not load" in r.json()["error"]  # tried again, failed again, in Ollama's shape
        r = http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200
    status = {m["id"]: m["status"]["value"] for m in http_client(router).get("/v1/models").json()["data"]}
    assert status["broken"] == "unloaded"
    print("\n".join(router.lines))


def test_a_model_whose_process_dies_is_loaded_again_and_the_router_lives_on(router) -> None:
    """Isolation: a llama.cpp abort kills its model's process, never the router."""
    with http_client(router) as http:
        assert http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2}).status_code == 200
        pid = rt.child_pid(router, "smollm2")
        os.kill(pid, signal.SIGKILL)
        rt.wait_for(lambda: rt.count(router, r"^localllm: smollm2 exited \(code -9, killed by SIGKILL\)"))
        assert "smollm2:latest" not in [m["name"] for m in http.get("/api/ps").json()["models"]]
        r = http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2})
        assert r.status_code == 200 and rt.child_pid(router, "smollm2") != pid
