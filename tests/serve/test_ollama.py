"""``localllm serve``'s Ollama API on loopback with SmolLM2, driven by the real
``ollama`` Python client and by httpx with the request shapes Ollama's api.md
documents (issue 59: the file's sha256 as each listing's digest, /api/embed
and /api/embeddings, tools on /api/chat, ``GET``/``HEAD /``); the server also
listens on two addresses (``--host A,B``) and, with no ``--cors``, sends no
CORS header at all."""

from __future__ import annotations

import hashlib
import json
import math
import sys
from pathlib import Path

import pytest

from tests.helpers.ollama_turns import CALLED, WEATHER
from tests.helpers.server import Server

GREEDY = {"temperature": 0, "num_predict": 6}
HOSTS = "127.0.0.1,127.0.0.2" if sys.platform == "linux" else "127.0.0.1"  # all of 127/8 is loopback on Linux only
TEMPLATE = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("serve-home")


@pytest.fixture(scope="module")
def server(home: Path):
    template = home / "turns.jinja"  # llama-server's --chat-template-file: every route renders with it (Jinja drops the last newline)
    template.write_text(TEMPLATE)
    s = Server("smollm2", "--parallel", "2", "--ctx", "512", "--threads", "1", "--host", HOSTS,
               "--chat-template-file", str(template), env={"LOCALLLM_HOME": str(home)})
    yield s
    s.stop()


def _ollama(server):
    import ollama

    return ollama.Client(host=server.base, timeout=120)


def _http(server, base: str | None = None):
    import httpx2

    return httpx2.Client(base_url=base or server.base, timeout=120)


@pytest.mark.slow
def test_ollama_client_chat_stream_and_not(server) -> None:
    client = _ollama(server)
    msgs = [{"role": "user", "content": "Hi"}]
    r = client.chat(model="smollm2", messages=msgs, options=GREEDY, stream=False)
    assert r.done and r.done_reason == "length" and r.eval_count == 6 and r.prompt_eval_count > 5 and r.model == "smollm2:latest"
    assert r.message.role == "assistant" and r.message.content
    assert r.total_duration and r.eval_duration and r.prompt_eval_duration and r.total_duration >= r.eval_duration
    # the phases are measured spans inside the request: they never add up past its total (a cached prompt once made
    # eval_duration, then the mean gap times eval_count, exceed total_duration)
    assert r.prompt_eval_duration + r.eval_duration <= r.total_duration
    again = client.chat(model="smollm2", messages=msgs, options=GREEDY, stream=False)  # the prompt from the slot's cache
    assert again.prompt_eval_duration + again.eval_duration <= again.total_duration
    parts = list(client.chat(model="smollm2", messages=msgs, options=GREEDY, stream=True))
    assert all(not p.done for p in parts[:-1]) and parts[-1].done and parts[-1].done_reason == "length"
    assert "".join(p.message.content or "" for p in parts) == r.message.content  # greedy: the same reply either way
    # the same conversation over OpenAI's route gives the same text: one engine under both APIs
    with _http(server) as c:
        o = c.post("/v1/chat/completions", json={"messages": msgs, "max_tokens": 6, "temperature": 0}).json()
    assert o["choices"][0]["message"]["content"] == r.message.content


@pytest.mark.slow
def test_ollama_client_generate_tags_show_version(server) -> None:
    client = _ollama(server)
    g = client.generate(model="smollm2", prompt="Hi", options=GREEDY)
    assert g.done and g.response and g.eval_count == 6
    raw = client.generate(model="smollm2", prompt="The capital of France is", raw=True, options={"temperature": 0, "num_predict": 3})
    assert raw.prompt_eval_count is not None and raw.prompt_eval_count < 10  # no chat template around a raw prompt
    with _http(server) as c:
        ref = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 3, "temperature": 0}).json()
    assert raw.response == ref["choices"][0]["text"]
    loaded = client.generate(model="smollm2", prompt="")  # Ollama's way to load a model: nothing generated
    assert loaded.done and loaded.done_reason == "load" and loaded.response == ""
    tags = client.list()
    assert [m.model for m in tags.models] == ["smollm2:latest"] and tags.models[0].details.format == "gguf"
    assert tags.models[0].size and tags.models[0].size > 10_000_000 and tags.models[0].details.quantization_level == "Q4_1"
    assert [m.model for m in client.ps().models] == ["smollm2:latest"]
    show = client.show("smollm2")
    assert show.template == TEMPLATE and show.details.family == "llama"
    with _http(server) as c:  # the file's template, not the model's (which adds a system prompt)
        rendered = c.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]}).json()["prompt"]
        assert rendered == "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant" and c.get("/props").json()["chat_template"] == TEMPLATE
    with _http(server) as c:
        assert c.get("/api/version").json()["version"]


@pytest.mark.slow
def test_ndjson_stream_and_documented_shapes(server) -> None:
    with _http(server) as c:
        body = {"model": "smollm2", "prompt": "Why is the sky blue?", "system": "Answer briefly.", "options": {**GREEDY, "seed": 42, "top_k": 20,
                "top_p": 0.9, "stop": ["\n\n"], "repeat_penalty": 1.1, "num_ctx": 512, "num_gpu": 1}}
        with c.stream("POST", "/api/generate", json=body) as r:  # streamed by default
            assert r.headers["content-type"].startswith("application/x-ndjson")
            assert r.headers["x-ignored-fields"] == "options.num_gpu"  # an option this server does not apply is named, not dropped silently
            lines = [json.loads(line) for line in r.iter_lines() if line]
        assert all(set(x) == {"model", "created_at", "response", "done"} and not x["done"] for x in lines[:-1])
        last = lines[-1]
        assert last["done"] and {"total_duration", "load_duration", "prompt_eval_count", "prompt_eval_duration", "eval_count",
                                 "eval_duration", "done_reason"} <= set(last)
        assert last["load_duration"] is None  # the model was loaded before: nothing measured for this request
        assert last["created_at"].endswith("Z") and last["eval_count"] >= len(lines) - 1  # a piece may hold more than one token
        r = c.post("/api/chat", json={"model": "smollm2", "messages": [{"role": "user", "content": "Give a JSON object with a key a."}],
                                      "format": "json", "stream": False, "options": {"temperature": 0, "num_predict": 24}})
        assert r.status_code == 200 and r.json()["message"]["content"].lstrip().startswith("{")
        schema = {"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"], "additionalProperties": False}
        r = c.post("/api/generate", json={"model": "smollm2", "prompt": "Is water wet? Answer in JSON.", "format": schema, "stream": False,
                                          "options": {"temperature": 0, "num_predict": 32}})
        assert isinstance(json.loads(r.json()["response"])["ok"], bool) and r.json()["done_reason"] == "stop"


@pytest.mark.slow
def test_ollama_errors_are_ollamas_shape(server) -> None:
    import ollama

    with _http(server) as c:
        for body, field in (({"model": "m", "prompt": "Hi", "images": ["aGk="]}, "'images[0]' is an image, but this server's model reads text only: "
                                                                                  "start serve with --mmproj FILE"),
                            ({"model": "m", "prompt": "Hi", "options": {"num_ctx": 100000}}, "num_ctx"),
                            ({"model": "m", "prompt": "Hi", "options": {"temperature": "hot"}}, "temperature"),
                            ({"model": "m", "prompt": "Hi", "options": {"num_predict": 0}}, "num_predict"),
                            ({"model": "m", "prompt": "Hi", "format": "xml"}, "format"),
                            ({"model": "m", "prompt": 5}, "prompt")):
            r = c.post("/api/generate", json=body)
            assert r.status_code == 400 and set(r.json()) == {"error"} and field in r.json()["error"], (body, r.text)
        r = c.post("/api/chat", json={"model": "m", "messages": [{"role": "wizard", "content": "x"}]})
        assert r.status_code == 400 and "role" in r.json()["error"]
        r = c.post("/api/chat", content=b"{not json")
        assert r.status_code == 400 and set(r.json()) == {"error"}
    with pytest.raises(ollama.ResponseError) as exc:
        _ollama(server).chat(model="m", messages=[{"role": "user", "content": "x", "images": ["aGk="]}])
    assert exc.value.status_code == 400 and "'messages[0].images[0]' is an image" in exc.value.error and "--mmproj" in exc.value.error


@pytest.mark.slow
def test_second_host_no_cors_and_gated_routes(server) -> None:
    port = server.base.rsplit(":", 1)[1]
    for host in HOSTS.split(","):  # --host A,B: listening on both
        with _http(server, f"http://{host}:{port}") as c:
            assert c.get("/health").json() == {"status": "ok"}
    with _http(server) as c:
        pre = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST"}
        r = c.options("/v1/chat/completions", headers=pre)
        assert not any(h.startswith("access-control-") for h in r.headers)  # no --cors: no CORS header at all
        r = c.get("/v1/models", headers={"Origin": "http://app.example"})
        assert r.status_code == 200 and not any(h.startswith("access-control-") for h in r.headers)
        assert c.get("/slots").status_code == 501 and c.get("/metrics").status_code == 501


@pytest.mark.slow
def test_listings_give_the_files_sha256_as_digest(server, home: Path, smollm2: Path) -> None:
    """llm-ollama takes models of one digest for one model: a null digest made every model one (issue 59)."""
    want = hashlib.sha256(smollm2.read_bytes()).hexdigest()
    client = _ollama(server)
    assert [m.digest for m in client.list().models] == [want] and [m.digest for m in client.ps().models] == [want]
    with _http(server) as c:
        show = c.post("/api/show", json={"model": "smollm2"}).json()
    assert show["digest"] == want and show["capabilities"] == ["completion", "tools"]
    assert json.loads((home / "cache" / "digests.json").read_text())[str(smollm2)]["sha256"] == want  # read once, kept for the next start


@pytest.mark.slow
def test_ollama_client_embed_and_embeddings(server) -> None:
    client = _ollama(server)
    both = client.embed(model="smollm2", input=["Hello", "The sky is blue."])
    assert both.model == "smollm2:latest" and len(both.embeddings) == 2 and both.prompt_eval_count and both.total_duration
    assert all(len(v) == 576 and math.isclose(sum(x * x for x in v), 1, rel_tol=1e-4) for v in both.embeddings)  # L2-normalized, as Ollama's
    with _http(server) as c:  # the engine of /v1/embeddings
        ref = c.post("/v1/embeddings", json={"input": ["Hello", "The sky is blue."]}).json()["data"]
    assert all(math.isclose(a, b, abs_tol=1e-5) for v, r in zip(both.embeddings, ref) for a, b in zip(v, r["embedding"]))
    one = client.embed(model="smollm2", input="Hello")
    assert len(one.embeddings) == 1 and all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(one.embeddings[0], both.embeddings[0]))
    legacy = client.embeddings(model="smollm2", prompt="Hello")
    assert all(math.isclose(a, b, abs_tol=1e-5) for a, b in zip(legacy.embedding, one.embeddings[0]))
    short = client.embed(model="smollm2", input="Hello", dimensions=64)  # the first 64, normalized again (Ollama's way)
    head = one.embeddings[0][:64]
    norm = math.sqrt(sum(x * x for x in head))
    assert len(short.embeddings[0]) == 64 and all(math.isclose(a, b / norm, abs_tol=1e-5) for a, b in zip(short.embeddings[0], head))
    assert client.embed(model="smollm2", input=[]).embeddings == [] and client.embeddings(model="smollm2", prompt="").embedding == []
    long = "word " * 700  # past the 512 tokens an input may hold: cut to them, unless truncate is false
    assert client.embed(model="smollm2", input=long).prompt_eval_count == 512
    import ollama

    with pytest.raises(ollama.ResponseError) as exc:
        client.embed(model="smollm2", input=long, truncate=False)
    assert exc.value.status_code == 400 and "truncate" in exc.value.error
    with _http(server) as c:
        r = c.post("/api/embed", json={"model": "smollm2", "input": [1, 2]})
        assert r.status_code == 400 and r.json() == {"error": "'input' must be a string or a list of strings"}


@pytest.mark.slow
def test_ollama_client_tools_whole_and_streamed(server) -> None:
    client = _ollama(server)
    r = client.chat(model="smollm2", messages=CALLED, tools=[WEATHER], options={"temperature": 0, "num_predict": 30})
    assert r.done_reason == "stop" and r.message.content == ""  # Ollama's reason, not OpenAI's tool_calls
    assert [(c.function.name, dict(c.function.arguments)) for c in r.message.tool_calls] == [("get_weather", {"city": "Paris"})]
    parts = list(client.chat(model="smollm2", messages=CALLED, tools=[WEATHER], options={"temperature": 0, "num_predict": 30}, stream=True))
    calls = [c for p in parts for c in p.message.tool_calls or []]
    assert [(c.function.name, dict(c.function.arguments)) for c in calls] == [("get_weather", {"city": "Paris"})]
    assert "".join(p.message.content or "" for p in parts) == "" and parts[-1].done and parts[-1].done_reason == "stop"
    with _http(server) as c:  # the wire: arguments an object, as Ollama sends them
        raw = c.post("/api/chat", json={"model": "smollm2", "messages": CALLED, "tools": [WEATHER], "stream": False,
                                        "options": {"temperature": 0, "num_predict": 30}}).json()
        assert raw["message"]["tool_calls"][0]["function"]["arguments"] == {"city": "Paris"}
        bad = c.post("/api/generate", json={"model": "smollm2", "prompt": "Hi", "tools": [WEATHER]})
        assert bad.status_code == 400 and bad.json() == {"error": "'tools' go to /api/chat: /api/generate calls none"}


def test_ollama_turns_with_calls_become_openais() -> None:
    """Ollama's calls get an id each (the same every turn, for the prompt cache) and a
    result the id of the call it answers: its own, else its tool_name's, else the first waiting."""
    from localllm.serve.ollama import _parse, _translate

    body = {"model": "m", "stream": False, "tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather and time?"},
        {"role": "assistant", "content": "", "tool_calls": [{"function": {"name": "now", "arguments": {}}},
                                                            {"function": {"name": "get_weather", "arguments": {"city": "Rome"}}}]},
        {"role": "tool", "content": "sunny", "tool_name": "get_weather"},
        {"role": "tool", "content": "noon"},
        {"role": "tool", "content": "late", "tool_call_id": "mine"}]}
    msgs = _translate(body, chat=True, n_ctx=None)[0]["messages"]  # the OpenAI body parse_gen takes
    assert [c["id"] for c in msgs[1]["tool_calls"]] == ["call_1_0", "call_1_1"]
    assert [c["function"] for c in msgs[1]["tool_calls"]] == [{"name": "now", "arguments": "{}"}, {"name": "get_weather", "arguments": '{"city": "Rome"}'}]
    assert [(m["tool_call_id"], m.get("name")) for m in msgs[2:]] == [("call_1_1", "get_weather"), ("call_1_0", None), ("mine", None)]
    prompt = _parse(body, chat=True, n_vocab=100, generate=False).messages  # as the template gets them (the generic format: JSON text)
    assert prompt[2] == {"role": "assistant", "content": '{"name": "now", "arguments": {}}\n{"name": "get_weather", "arguments": {"city": "Rome"}}'}
    assert '"tool_call_id": "call_1_1", "content": "sunny"' in prompt[3]["content"]


@pytest.mark.slow
def test_root_says_ollama_is_running(server) -> None:
    """Ollama's clients check GET or HEAD / before anything else."""
    with _http(server) as c:
        r = c.get("/")
        assert r.status_code == 200 and r.text == "Ollama is running" and r.headers["content-type"].startswith("text/plain")
        head = c.head("/")
        assert head.status_code == 200 and head.content == b""
