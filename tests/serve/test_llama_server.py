"""``localllm serve`` as a drop-in for llama.cpp's llama-server, on loopback with
SmolLM2: its routes and fields side by side with llama-server's real answers
(``llama_server_answers.json``, recorded from the llama-server built from the
same vendored llama.cpp, same model), its server-side defaults (--temp, -n),
/slots, /metrics gating, and CORS before the API key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.server import KEY, Server

LLAMA = json.loads((Path(__file__).parent / "llama_server_answers.json").read_text())
ORIGIN = "http://app.example"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    home = tmp_path_factory.mktemp("serve-home")
    # --temp 0 and -n 8: llama-server's server-side defaults, for requests that name neither
    s = Server("smollm2", "-np", "2", "-c", "512", "-t", "1", "--api-key", KEY, "--slots", "--cors", ORIGIN,
               "--temp", "0", "-n", "8", "--jinja", env={"LOCALLLM_HOME": str(home)})
    yield s
    s.stop()


def _client(server):
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def _sse(text: str) -> list[dict]:
    return [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: {")]


def _missing(ours: dict, theirs: dict, skip: tuple[str, ...] = ()) -> set[str]:
    """llama-server's keys that our answer lacks."""
    return set(theirs) - set(ours) - set(skip)


@pytest.mark.slow
def test_completion_matches_llama_server(server) -> None:
    with _client(server) as c:
        r = c.post("/completion", json={"prompt": "Hello", "n_predict": 4, "temperature": 0})
        assert r.status_code == 200
        d = r.json()
        # llama-server's keys (but the sampler parameters only it has) and, greedy on the same model, its text
        assert not _missing(d, LLAMA["completion"])
        assert d["content"] == LLAMA["completion"]["content"] and d["tokens_predicted"] == 4 and d["tokens_evaluated"] == 1
        assert d["stop"] is True and d["stop_type"] == "limit"
        assert not _missing(d["timings"], LLAMA["completion"]["timings"])
        t = d["timings"]
        assert t["predicted_n"] == 4 and t["prompt_n"] + t["cache_n"] == 1 and t["prompt_ms"] > 0 and t["predicted_per_second"] > 0
        # a stop word, named as llama-server names it
        r = c.post("/completion", json={"prompt": "Hello", "n_predict": 8, "temperature": 0, "stop": ["date"]})
        assert r.json()["stop_type"] == "word" and r.json()["stopping_word"] == "date" and r.json()["content"] == "-by-"
        # streamed as llama-server streams it: pieces, then the final object, no [DONE]
        r = c.post("/completion", json={"prompt": "Hello", "n_predict": 3, "temperature": 0, "stream": True})
        chunks = _sse(r.text)
        assert "[DONE]" not in r.text
        ref = LLAMA["completion_stream"]
        assert len(chunks) == len(ref) and all(not _missing(a, b) for a, b in zip(chunks, ref))
        assert "".join(ch["content"] for ch in chunks) == "".join(ch["content"] for ch in ref)
        assert [ch["stop"] for ch in chunks] == [False, False, False, True] and chunks[-1]["timings"]["predicted_n"] == 3
        # timings per token, when asked: every chunk carries the timings so far
        r = c.post("/completion", json={"prompt": "Hello", "n_predict": 3, "temperature": 0, "stream": True, "timings_per_token": True})
        assert [ch["timings"]["predicted_n"] for ch in _sse(r.text)] == [1, 2, 3, 3]
        assert "timings" not in chunks[0]
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True,
                                                 "timings_per_token": True})
        assert [ch.get("timings", {}).get("predicted_n") for ch in _sse(r.text)] == [None, 1, 2, 3, 3]


@pytest.mark.slow
def test_openai_fields_and_stream_shape(server) -> None:
    with _client(server) as c:
        r = c.post("/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3})  # the unprefixed alias
        d = r.json()
        assert not _missing(d, LLAMA["chat"]) and not _missing(d["timings"], LLAMA["chat"]["timings"])
        assert d["choices"][0]["message"]["content"] == LLAMA["chat"]["choices"][0]["message"]["content"]  # --temp 0: greedy
        assert d["system_fingerprint"].startswith("localllm-")
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3, "stream": True})
        chunks = _sse(r.text)
        assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": None}  # null, as llama-server and OpenAI send it
        assert LLAMA["chat_stream"][0]["choices"][0]["delta"] == {"role": "assistant", "content": None}
        last = chunks[-1]
        assert last["choices"][0]["finish_reason"] == "length" and last["usage"]["completion_tokens"] == 3
        assert not _missing(last, LLAMA["chat_stream"][-1]) and last["timings"]["predicted_n"] == 3
        r = c.post("/v1/completions", json={"prompt": "Hi", "max_tokens": 3, "stream": True})
        last = _sse(r.text)[-1]
        assert not _missing(last, LLAMA["v1_completions_stream"][-1]) and last["usage"]["completion_tokens"] == 3
        # llama-server's unprefixed /completions is its own /completion, not OpenAI's
        assert c.post("/completions", json={"prompt": "Hello", "n_predict": 4}).json()["content"] == LLAMA["completion"]["content"]
        # llama-server's fields on its OpenAI routes too: n_predict, its samplers only when off
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Write a story."}], "n_predict": 2, "typical_p": 1})
        assert r.json()["usage"]["completion_tokens"] == 2 and "x-ignored-fields" not in r.headers
        r = c.post("/v1/completions", json={"prompt": "Hi", "mirostat": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "mirostat"
        # -n 8 is the server's default for a request that names no limit
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Write a long story."}]})
        assert r.json()["usage"]["completion_tokens"] == 8 and r.json()["choices"][0]["finish_reason"] == "length"
        assert c.get("/models").json()["data"][0]["id"] == "smollm2"
    import httpx2

    assert httpx2.get(server.base + "/v1/health").json() == {"status": "ok"}  # public, as llama-server's /health and /v1/health


@pytest.mark.slow
def test_openai_client_reads_the_stream(server) -> None:
    from openai import OpenAI

    client = OpenAI(base_url=server.base, api_key=KEY, max_retries=0, timeout=120)  # no /v1: llama-server's aliases
    text, usage = "", None
    for chunk in client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Hi"}], max_tokens=3, stream=True):
        text += (chunk.choices[0].delta.content or "") if chunk.choices else ""
        usage = chunk.usage or usage
    assert text == LLAMA["chat"]["choices"][0]["message"]["content"] and usage is not None and usage.completion_tokens == 3


@pytest.mark.slow
def test_tokenize_detokenize_apply_template(server) -> None:
    with _client(server) as c:
        assert c.post("/tokenize", json={"content": "Hello world"}).json() == LLAMA["tokenize"]
        assert c.post("/tokenize", json={"content": "Hello world", "with_pieces": True}).json() == LLAMA["tokenize_with_pieces"]
        # llama-server's defaults: no BOS added, special tokens parsed
        assert c.post("/tokenize", json={"content": "<|im_start|>Hi"}).json() == {"tokens": [1, 26843]}
        assert c.post("/tokenize", json={"content": "<|im_start|>Hi", "parse_special": False}).json()["tokens"][0] != 1
        assert c.post("/detokenize", json={"tokens": LLAMA["tokenize"]["tokens"]}).json() == LLAMA["detokenize"]
        assert c.post("/apply-template", json={"messages": [{"role": "user", "content": "Hi"}]}).json() == LLAMA["apply_template"]
        for path, body in (("/tokenize", {"content": 5}), ("/detokenize", {"tokens": [10**9]}), ("/tokenize", {"content": "x", "with_pieces": "yes"}),
                           ("/apply-template", {"messages": "hi"})):
            r = c.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["message"], (path, r.text)


@pytest.mark.slow
def test_props_slots_metrics_and_errors(server) -> None:
    with _client(server) as c:
        props = c.get("/props").json()
        for key in ("default_generation_settings", "total_slots", "model_path", "chat_template", "bos_token", "eos_token", "build_info",
                    "endpoint_slots", "endpoint_metrics", "modalities", "model_alias"):
            assert key in props and key in LLAMA["props"]
        assert props["total_slots"] == 2 and props["default_generation_settings"]["n_ctx"] == 512
        assert props["default_generation_settings"]["params"]["temperature"] == 0 and props["default_generation_settings"]["params"]["n_predict"] == 8
        assert props["chat_template"] == LLAMA["props"]["chat_template"] and props["eos_token"] == LLAMA["props"]["eos_token"]
        slots = c.get("/slots").json()
        assert [s["id"] for s in slots] == [0, 1] and all(not _missing(s, LLAMA["slots"][0], ("id_task", "params", "next_token",
                                                                                                  "n_prompt_tokens_processed")) for s in slots)
        m = c.get("/metrics")  # no --metrics: as llama-server
        assert m.status_code == 501 and "--metrics" in m.json()["error"]["message"]
        long = "x " * 3000 + "\n"  # the prompt llama-server was given
        e = c.post("/completion", json={"prompt": long, "n_predict": 2}).json()["error"]
        assert e["n_prompt_tokens"] == LLAMA["exceed_context"]["error"]["n_prompt_tokens"] and e["n_ctx"] == 512
        r = c.post("/completion", json={"prompt": "Hi", "grammar": "root ::= foo"})
        assert r.status_code == 400 == LLAMA["bad_grammar"]["error"]["code"]
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 0})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n_predict"
        # llama-server's samplers serve does not have: accepted when off (as its web UI sends them), else a 400 naming them
        off = {"prompt": "Hi", "n_predict": 2, "mirostat": 0, "typical_p": 1.0, "dry_multiplier": 0, "dry_base": 1.75, "n_keep": 0, "id_slot": -1}
        r = c.post("/completion", json=off)
        assert r.status_code == 200 and "x-ignored-fields" not in r.headers
        for field, value in (("mirostat", 2), ("typical_p", 0.5), ("xtc_probability", 0.5), ("top_n_sigma", 1.0), ("repeat_last_n", 128)):
            r = c.post("/completion", json={**off, field: value})
            assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
        r = c.post("/completion", json={"prompt": "Hi", "n_predict": 2, "json_schema": {"type": "integer"}})
        assert r.status_code == 200 and r.json()["content"].strip().lstrip("-").isdigit()


@pytest.mark.slow
def test_cors_preflight_before_the_key(server) -> None:
    import httpx2

    with httpx2.Client(base_url=server.base, timeout=30) as c:  # no key: a browser's preflight never has one
        pre = {"Origin": ORIGIN, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "authorization, content-type"}
        r = c.options("/v1/chat/completions", headers=pre)
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN
        assert "POST" in r.headers["access-control-allow-methods"]
        assert {"authorization", "content-type"} <= {h.strip().lower() for h in r.headers["access-control-allow-headers"].split(",")}
        r = c.options("/v1/chat/completions", headers={**pre, "Origin": "http://evil.example"})  # answered as llama-server does:
        assert r.status_code == 200 and "access-control-allow-origin" not in r.headers  # no Allow-Origin, so the browser refuses
        r = c.get("/v1/models", headers={"Origin": ORIGIN})  # the key is still required, and the page may read why
        assert r.status_code == 401 and r.headers["access-control-allow-origin"] == ORIGIN
        r = c.get("/v1/models", headers={"Origin": ORIGIN, "Authorization": f"Bearer {KEY}"})
        assert r.status_code == 200 and r.headers["access-control-allow-origin"] == ORIGIN


@pytest.mark.slow
def test_bad_bodies_on_the_new_routes_get_one_json_error(server) -> None:
    """Untrusted bodies on every new route: a 4xx with a JSON error naming the cause, never a 500 or a hang."""
    bodies = [b"[]", b"null", b"{", b'"x"', b"{}", json.dumps({"prompt": {"a": 1}}).encode(), json.dumps({"content": ["x", 1]}).encode(),
              json.dumps({"tokens": "abc"}).encode(), json.dumps({"tokens": [-1]}).encode(), json.dumps({"messages": [{"role": 1}]}).encode(),
              json.dumps({"prompt": "x", "n_predict": "many"}).encode(), json.dumps({"prompt": "x", "logit_bias": [["a", "x"]]}).encode(),
              json.dumps({"prompt": "x", "options": [1]}).encode(), json.dumps({"prompt": "x", "raw": "yes"}).encode(),
              json.dumps({"messages": [{"role": "user", "content": "x"}], "options": {"stop": 5}}).encode(),
              json.dumps({"prompt": "x", "timings_per_token": "yes"}).encode(), json.dumps({"prompt": [10**12]}).encode()]
    routes = ("/completion", "/completions", "/tokenize", "/detokenize", "/apply-template", "/api/chat", "/api/generate")
    with _client(server) as c:
        for path in routes:
            for raw in bodies:
                r = c.post(path, content=raw, headers={"Content-Type": "application/json"})
                if r.status_code == 200:  # a body the route may take: {} on /tokenize, /detokenize, /api/generate (loads)
                    continue
                assert 400 <= r.status_code < 500, (path, raw, r.status_code, r.text)
                err = r.json()["error"]
                assert (err if isinstance(err, str) else err["message"]), (path, raw)
    assert "Traceback" not in server.log
