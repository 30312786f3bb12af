"""What the router (``localllm serve`` with no MODEL, issue 46) promised and no
other test held it to, each against a real router on loopback with the real
SmolLM2 and gemma3-270m:

- ``--models all`` serves what ``localllm list`` shows, as a bare ``serve`` does;
- ``/api/tags`` carries each model's size, quant and family, and ``/v1/models``
  and ``/models`` its live ``status``;
- llama-server's own routes (``/tokenize``, ``/completion``, ``/apply-template``,
  ``/v1/embeddings``) answer with the model the request names;
- the official ``ollama`` client alternates two models on one router;
- CORS answers as the single-model server's, on the router's answers and the
  children's alike;
- past ``--max-queue`` waiting requests, a 503 with ``Retry-After`` at once.

Two routers serve the module, on one data directory (gemma3-270m is assembled
once): a bare ``serve --cors ORIGIN`` with room for every model, and a
``--models all --models-max 1 --max-queue 1`` one that holds one model at a time.
"""

from __future__ import annotations

import json
import queue
import threading
import time
from pathlib import Path

import pytest

from localllm.modelfile.model_info import inspect_model
from tests.helpers import router as rt
from tests.helpers.cli import cli
from tests.helpers.server import KEY, Server, http_client

pytestmark = pytest.mark.slow  # every test here talks to a real router and its models' processes

ORIGIN = "http://app.example"
TWO = ("smollm2", "gemma3-270m")


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory, smollm2: Path) -> dict[str, str]:
    """The built-in models and a copy of SmolLM2 added by hand (a model of
    ``localllm list`` that is neither built in nor pulled); a config file whose
    ``[models."gemma3-270m"]`` table names gemma3-270m's chat template."""
    root = tmp_path_factory.mktemp("router-gaps")
    env = rt.isolated_env(root)
    rt.add(env, rt.copy_of(smollm2, root / "mine", "smol-twin.gguf"))
    config = root / "config.toml"  # gemma3-270m is a base model, with no chat template of its own: its config table gives it one
    config.write_text('[models."gemma3-270m"]\nchat-template = "gemma"\n')
    env["LOCALLLM_CONFIG"] = str(config)
    return env


@pytest.fixture(scope="module")
def router(env: dict[str, str]):
    """A bare ``serve`` (every model, up to 4 loaded) with CORS for ``ORIGIN``."""
    s = rt.start(env, "--cors", ORIGIN)
    try:
        yield s
    finally:
        s.stop()


@pytest.fixture(scope="module")
def capped(env: dict[str, str]):
    """``serve --models all`` holding one model at a time, with room for one waiting request."""
    s = rt.start(env, "--models", "all", "--models-max", "1", "--max-queue", "1")
    try:
        yield s
    finally:
        s.stop()


def listed(env: dict[str, str]) -> dict[str, dict]:
    """``localllm list --json`` in the routers' data directory, by name."""
    r = cli("list", "--json", env=env)
    assert r.returncode == 0, r.stderr
    return {row["name"]: row for row in json.loads(r.stdout)}


def statuses(http, path: str) -> dict[str, str]:
    return {m["id"]: m["status"]["value"] for m in http.get(path).json()["data"]}


# -- 1. --models all ----------------------------------------------------------------


def test_models_all_serves_every_model_of_localllm_list_as_a_bare_serve_does(router, capped, env) -> None:
    names = set(listed(env))
    assert {"smollm2", "gemma3-270m", "smol-twin"} <= names
    with http_client(router) as bare, http_client(capped) as every:
        plain = [m["id"] for m in bare.get("/v1/models").json()["data"]]
        all_ = [m["id"] for m in every.get("/v1/models").json()["data"]]
        assert sorted(all_) == sorted(plain) == sorted(names)  # the same list, and nothing twice
        assert {m["name"] for m in every.get("/api/tags").json()["models"]} == {f"{n}:latest" for n in names}
        r = every.post("/tokenize", json={"model": "smol-twin", "content": "Hello"})  # an added model, served by name too
        assert r.status_code == 200 and r.json()["tokens"], r.text
    assert rt.count(capped, rf"serving {len(names)} model\(s\) on ") == 1


# -- 2. the listings' fields ----------------------------------------------------------


def test_tags_carry_size_quant_and_family_and_the_model_lists_carry_live_status(capped, env) -> None:
    with http_client(capped) as http:
        for first, second in (TWO, TWO[::-1]):  # --models-max 1: loading one unloads the other
            r = http.post("/models/load", json={"model": first})
            assert r.status_code == 200 and r.json() == {"success": True}, r.text
            for path in ("/v1/models", "/models"):  # OpenAI's and llama-server router's
                s = statuses(http, path)
                assert (s[first], s[second], s["smol-twin"]) == ("loaded", "unloaded", "unloaded"), (path, s)
        tags = {m["name"]: m for m in http.get("/api/tags").json()["models"]}
    rows = listed(env)  # after both loaded: gemma3-270m is assembled, its file and header are there
    want = {"smollm2": ("llama", "Q4_1"), "gemma3-270m": ("gemma3", "Q4_K_M")}
    for name, (family, quant) in want.items():
        tag, row = tags[f"{name}:latest"], rows[name]
        assert tag["size"] == row["size_bytes"] == Path(row["path"]).stat().st_size > 50 * 2**20, (name, tag)
        details = tag["details"]
        assert details["family"] == row["architecture"] == family, (name, details)
        assert details["quantization_level"] == row["quant"] == quant, (name, details)
        assert details["format"] == "gguf" and details["families"] == [family] and details["parameter_size"].endswith("M"), details
    assert tags["smollm2:latest"]["details"]["parameter_size"] != tags["gemma3-270m:latest"]["details"]["parameter_size"]


# -- 3. llama-server's own routes, by the model named ------------------------------------


def test_llama_server_routes_answer_with_the_model_the_request_names(router, env) -> None:
    text = "Hello world, how are you today?"
    hi = [{"role": "user", "content": "Hi"}]
    got: dict[str, dict] = {}
    with http_client(router) as http:
        for name in (*TWO, *TWO):  # alternated: each answer from its own model every time
            r = http.post("/tokenize", json={"model": name, "content": text})
            assert r.status_code == 200, r.text
            tokens = r.json()["tokens"]
            back = http.post("/detokenize", json={"model": name, "tokens": tokens}).json()["content"]
            assert back.strip() == text, (name, back)  # the same model's vocabulary read them back
            done = http.post("/completion", json={"model": name, "prompt": "The capital of France is", "n_predict": 6, "temperature": 0})
            assert done.status_code == 200 and done.json()["model"] == name, done.text
            prompt = http.post("/apply-template", json={"model": name, "messages": hi})
            assert prompt.status_code == 200, prompt.text
            emb = http.post("/v1/embeddings", json={"model": name, "input": text})  # served beside chat by default (serve --help)
            assert emb.status_code == 200 and emb.json()["model"] == name, emb.text
            now = {"tokens": tokens, "content": done.json()["content"], "prompt": prompt.json()["prompt"],
                   "dims": len(emb.json()["data"][0]["embedding"])}
            assert got.setdefault(name, now) == now, name  # greedy, same model: the same answers
    smol, gemma = got["smollm2"], got["gemma3-270m"]
    assert smol["tokens"] != gemma["tokens"]  # each model's own tokenizer
    assert smol["content"] != gemma["content"]
    assert "<|im_start|>user\nHi<|im_end|>" in smol["prompt"] and "<start_of_turn>" not in smol["prompt"]  # each model's own template
    assert "<start_of_turn>user\nHi<end_of_turn>" in gemma["prompt"] and "<|im_start|>" not in gemma["prompt"]  # from its config table
    paths = {name: row["path"] for name, row in listed(env).items()}
    for name in TWO:  # each model's own width: its header's embedding length
        assert got[name]["dims"] == inspect_model(Path(paths[name])).n_embd > 0, name
    assert smol["dims"] != gemma["dims"]


# -- 4. the ollama client, two models alternated ---------------------------------------------


def test_ollama_client_alternates_two_models_with_chat_and_generate(router) -> None:
    import ollama

    client = ollama.Client(host=router.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    greedy = {"temperature": 0, "num_predict": 8}
    chats: dict[str, str] = {}
    gens: dict[str, str] = {}
    loads = -1
    for round_ in range(2):
        if round_ == 1:
            loads = rt.count(router, r"^localllm: loading ")
        for name in TWO:
            chat = client.chat(model=name, messages=[{"role": "user", "content": "Name a fruit."}], options=greedy)
            assert chat.model.split(":")[0] == name and chat.message.content, chat
            gen = client.generate(model=name, prompt="The three primary colors are", options=greedy)
            assert gen.model.split(":")[0] == name and gen.response, gen
            assert chats.setdefault(name, chat.message.content) == chat.message.content, name  # greedy: the same model, the same text
            assert gens.setdefault(name, gen.response) == gen.response, name
    assert chats["smollm2"] != chats["gemma3-270m"] and gens["smollm2"] != gens["gemma3-270m"]  # two models, two answers
    assert rt.count(router, r"^localllm: loading ") == loads  # both stayed loaded: the second round loaded nothing
    assert {f"{n}:latest" for n in TWO} <= {m.model for m in client.ps().models}


# -- 5. CORS per request ------------------------------------------------------------------


def cors(r) -> dict[str, str]:
    """The answer's CORS headers, each asserted to come once (a browser refuses two)."""
    out = {}
    for k in {k.lower() for k in r.headers if k.lower().startswith("access-control-")}:
        values = r.headers.get_list(k)
        assert len(values) == 1, (k, values)
        out[k] = values[0]
    return out


def cors_answers(server: Server, models: tuple[str, ...]) -> list[tuple[str, int, dict[str, str]]]:
    """What ``server`` answers a browser's requests with: status and CORS headers."""
    import httpx2

    pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
    key = {"Authorization": f"Bearer {KEY}"}
    out = []
    with httpx2.Client(base_url=server.base, timeout=120, trust_env=False) as c:  # a browser's preflight never has the key
        for what, r in (
            ("preflight", c.options("/v1/chat/completions", headers=pre)),
            ("preflight, other origin", c.options("/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})),
            ("GET, no key", c.get("/v1/models", headers={"Origin": ORIGIN})),
            ("GET", c.get("/v1/models", headers={"Origin": ORIGIN, **key})),
            ("GET, no Origin", c.get("/v1/models", headers=key)),
        ):
            out.append((what, r.status_code, cors(r)))
        for name in models:  # answered by the model's own process, through the router
            r = c.post("/v1/completions", headers={"Origin": ORIGIN, **key}, json={"model": name, "prompt": "Hi", "max_tokens": 2})
            out.append(("POST", r.status_code, cors(r)))
            body = {"model": name, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True}
            with c.stream("POST", "/v1/chat/completions", headers={"Origin": ORIGIN, **key}, json=body) as s:
                assert "[DONE]" in s.read().decode(), name
                out.append(("POST, streamed", s.status_code, cors(s)))
    return out


def test_cors_in_router_mode_answers_as_the_single_model_server(router, env) -> None:
    routed = cors_answers(router, TWO)
    single = Server("smollm2", "--api-key", KEY, *rt.SMALL, "--cors", ORIGIN, env=env)
    try:
        alone = cors_answers(single, ("smollm2",))
    finally:
        single.stop()
    by_what = {what: (status, headers) for what, status, headers in alone}
    for what, status, headers in routed:
        assert (status, headers) == by_what[what], (what, status, headers, by_what[what])
    preflight = by_what["preflight"][1]
    assert by_what["preflight"][0] == 200 and preflight["access-control-allow-origin"] == ORIGIN and "POST" in preflight["access-control-allow-methods"]
    assert {h.strip().lower() for h in preflight["access-control-allow-headers"].split(",")} >= {"authorization", "content-type"}
    assert by_what["preflight, other origin"][0] == 200 and "access-control-allow-origin" not in by_what["preflight, other origin"][1]
    assert by_what["GET, no key"] == (401, {"access-control-allow-origin": ORIGIN, "access-control-allow-credentials": "true",
                                            "access-control-expose-headers": "X-Ignored-Fields"})
    assert by_what["GET"][0] == 200 and by_what["GET"][1]["access-control-allow-origin"] == ORIGIN
    assert by_what["GET, no Origin"] == (200, {})
    assert [s for w, s, _ in routed if w.startswith("POST")] == [200] * 4
    assert all(h.get("access-control-allow-origin") == ORIGIN for w, _, h in routed if w.startswith("POST"))


# -- 6. the waiting bound -------------------------------------------------------------------


def test_past_the_waiting_bound_a_request_gets_503_with_retry_after_at_once(capped) -> None:
    """``--models-max 1 --max-queue 1``: while a stream holds SmolLM2, three requests for
    gemma3-270m come at once. One may wait (the bound is one); the two others are
    answered 503 with Retry-After before the stream ends, in the shape of their route,
    and the one that waited is answered once SmolLM2 is free."""
    answers: queue.Queue = queue.Queue()
    routes = {"/v1/completions": {"prompt": "Hi", "max_tokens": 2}, "/api/generate": {"prompt": "Hi", "stream": False, "options": {"num_predict": 2}},
              "/v1/chat/completions": {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}}

    def ask(route: str) -> None:
        t0 = time.monotonic()
        with http_client(capped) as h:
            r = h.post(route, json={"model": "gemma3-270m", **routes[route]})
        answers.put((route, r.status_code, r.headers.get("retry-after"), r.json(), time.monotonic() - t0, time.monotonic()))

    with http_client(capped) as http:
        # gemma3-270m's fit made (its file assembled) before the race, so that the burst below only queues; then SmolLM2 loaded
        for name in TWO[::-1]:
            assert http.post("/models/load", json={"model": name}).status_code == 200
        room = rt.count(capped, r"unloading smollm2: to make room for gemma3-270m \(--models-max 1\)")
        # 80 tokens, 2-3 s on one core: the two refusals come in milliseconds (took < 10 below)
        body = {"model": "smollm2", "prompt": "Once upon a time", "max_tokens": 80, "stream": True, "temperature": 0, "ignore_eos": True}
        with http.stream("POST", "/v1/completions", json=body) as resp:
            assert resp.status_code == 200
            lines = resp.iter_lines()
            next(lines)  # SmolLM2 is generating: busy
            threads = [threading.Thread(target=ask, args=(route,)) for route in routes]
            for t in threads:
                t.start()
            refused = [answers.get(timeout=30) for _ in range(2)]  # never a hang: two answers come while the stream runs
            text = "".join(lines)
            stream_end = time.monotonic()
        for t in threads:
            t.join(120)
    waited = answers.get(timeout=1)
    assert "[DONE]" in text and text.count("data: ") > 60  # the stream ran to its end (80 tokens)
    for route, status, retry, body, took, at in refused:
        assert status == 503 and retry is not None and int(retry) > 0, (route, status, retry, body)
        message = body["error"] if route.startswith("/api/") else body["error"]["message"]  # Ollama's shape, OpenAI's
        assert "gemma3-270m" in message and "--models-max 1" in message and "retry later" in message, message
        if not route.startswith("/api/"):
            assert body["error"]["code"] == "models_busy"
        assert at < stream_end and took < 10, (route, took)  # at once, not after the wait's 60 s
    route, status, _, body, _, at = waited
    assert status == 200 and at >= stream_end, (route, status, body)  # the one that waited got SmolLM2's room
    assert rt.count(capped, r"unloading smollm2: to make room for gemma3-270m \(--models-max 1\)") == room + 1  # once the stream was done


def test_a_base_model_on_apply_template_is_a_400_and_its_next_request_is_answered(env: dict[str, str], tmp_path: Path) -> None:
    """gemma3-270m without a template from the config: ``/apply-template`` is a 400 naming the
    fix (it was a 500 with a traceback), and the request after it to the same child is answered
    (after a 500 the router had reused the connection the child closed: 502 "did not answer")."""
    plain = {**env, "LOCALLLM_CONFIG": str(tmp_path / "none.toml")}
    s = rt.start(plain)
    try:
        with http_client(s) as http:
            for _ in range(3):
                r = http.post("/apply-template", json={"model": "gemma3-270m", "messages": [{"role": "user", "content": "hi"}]})
                assert r.status_code == 400, r.text
                assert r.json()["error"]["message"] == ("this model has no chat template (a base model): use /completion with plain text, "
                                                        "or start serve with --chat-template FILE|NAME"), r.text
                t = http.post("/tokenize", json={"model": "gemma3-270m", "content": "Hello"})
                assert t.status_code == 200 and t.json()["tokens"], t.text
    finally:
        s.stop()


def test_half_sent_requests_at_the_routers_door_do_not_stop_a_valid_one(router) -> None:
    """Slowloris at the router (its own front door: a child never sees a slow client): 300 idle
    half-sent request heads, and /health, a refused request and a generation are still answered."""
    import socket

    host, port = router.base.removeprefix("http://").rsplit(":", 1)
    socks = []
    try:
        for _ in range(300):
            s = socket.create_connection((host, int(port)), timeout=10)
            s.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nX-Slow: ")
            socks.append(s)
        t0 = time.monotonic()
        with http_client(router) as http:
            assert http.get("/health").status_code == 200
            assert http.get("/v1/models", headers={"Authorization": "Bearer wrong"}).status_code == 401
            r = http.post("/v1/completions", json={"model": "smollm2", "prompt": "Hello", "max_tokens": 2, "temperature": 0})
            assert r.status_code == 200, r.text
        assert time.monotonic() - t0 < 15
    finally:
        for s in socks:
            s.close()
