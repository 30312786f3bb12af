"""llama-server's request forms and routes as its own tests call them
(tools/server/tests/unit/test_compat_gcp.py, test_chat_completion.py,
test_compat_oai_responses.py, test_completion.py): Vertex AI's ``/predict``
(``AIP_MODE=PREDICTION``), the token count of a chat body, the unprefixed
``/responses``, and /completion's prompt forms; on SmolLM2 served in-process."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server, gcp

GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
ASK = [{"role": "system", "content": "Book"}, {"role": "user", "content": "What is the best book"}]


def test_route_names_are_llama_servers_camel_case() -> None:
    assert gcp.alias("/v1/chat/completions") == "chatCompletions"
    assert gcp.alias("/apply-template") == "applyTemplate"
    assert gcp.alias("/slots/{id}") == "slots"
    assert gcp.settings({}) is None and gcp.settings({"AIP_MODE": "x"}) is None
    assert gcp.settings({"AIP_MODE": "PREDICTION", "AIP_PREDICT_ROUTE": "p", "AIP_HEALTH_ROUTE": "/h"}) == ("/p", "/h")


@pytest.fixture(scope="module")
def base(smollm2: Path) -> Iterator[str]:
    mp = pytest.MonkeyPatch()
    mp.setenv("AIP_MODE", "PREDICTION")
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=2 * 512, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=2)
    try:
        with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0, api_key="k"), say=lambda _: None).start() as s:
            yield f"http://127.0.0.1:{s.port}"
    finally:
        mp.undo()


@pytest.mark.slow
def test_predict_answers_each_instance_by_its_route(base: str) -> None:
    h = {"Authorization": "Bearer k"}
    chat = {"@requestFormat": "chatCompletions", "max_tokens": 4, "stream": True, "messages": [{"role": "user", "content": "Say hello"}]}
    r = httpx.post(f"{base}/predict", headers=h, timeout=60, json={"instances": [chat, {**chat, "messages": [{"role": "user", "content": "Hi"}]},
                                                                                 {"@requestFormat": "/tokenize", "content": "Paris"},
                                                                                 {"@requestFormat": "noSuchRoute"}, "not an object"]})
    assert r.status_code == 200, r.text
    first, second, tokens, unknown, bad = r.json()["predictions"]
    for p in (first, second):
        assert p["choices"][0]["message"]["role"] == "assistant" and p["choices"][0]["message"]["content"]
    assert tokens["tokens"]
    assert "noSuchRoute" in unknown["error"]["message"] and "JSON object" in bad["error"]["message"]
    assert httpx.post(f"{base}/predict", headers=h, json={"instances": "x"}).status_code == 400
    assert httpx.post(f"{base}/predict", headers=h, json={"instances": [{}] * 129}).status_code == 400
    assert httpx.post(f"{base}/predict", json={"instances": []}).status_code == 401  # behind the key as every route


@pytest.mark.slow
def test_a_chat_body_is_counted_as_the_chat_route_reads_it(base: str) -> None:
    h = {"Authorization": "Bearer k"}
    counts = [httpx.post(f"{base}{p}", headers=h, json={"messages": ASK}).json() for p in ("/chat/completions/input_tokens",
                                                                                         "/v1/chat/completions/input_tokens")]
    read = httpx.post(f"{base}/v1/chat/completions", headers=h, json={"messages": ASK, "max_tokens": 1}, timeout=60).json()
    assert counts[0] == counts[1] == {"object": "response.input_tokens", "input_tokens": read["usage"]["prompt_tokens"]}
    assert httpx.post(f"{base}/chat/completions/input_tokens", headers=h, json={"messages": "x"}).status_code == 400


@pytest.mark.slow
def test_responses_answer_without_the_v1_prefix(base: str) -> None:
    h = {"Authorization": "Bearer k"}
    r = httpx.post(f"{base}/responses", headers=h, json={"input": "Say hi", "max_output_tokens": 4}, timeout=60)
    assert r.status_code == 200 and r.json()["object"] == "response"
    assert httpx.post(f"{base}/responses/input_tokens", headers=h, json={"input": "Say hi"}).json()["input_tokens"] > 0


@pytest.mark.slow
def test_completion_prompts_in_every_llama_server_form(base: str) -> None:
    h = {"Authorization": "Bearer k"}
    text = "I believe the meaning of life is"

    def complete(prompt: object) -> object:
        r = httpx.post(f"{base}/completion", headers=h, json={"prompt": prompt, "n_predict": 4, "temperature": 0}, timeout=120)
        assert r.status_code == 200, (prompt, r.text)
        return r.json()

    ids = httpx.post(f"{base}/tokenize", headers=h, json={"content": text, "add_special": True}).json()["tokens"]
    alone = complete(ids)["content"]
    assert complete(text)["content"] == alone and complete({"prompt_string": text})["content"] == alone
    for several in ([ids, ids], [ids, text], [ids, {"prompt_string": text}]):
        replies = complete(several)
        assert isinstance(replies, list) and [r["content"] for r in replies] == [alone, alone], several
    replies = complete(["a b c", text])
    assert isinstance(replies, list) and len(replies) == 2 and replies[1]["content"] == alone
    assert isinstance(complete([1, 2, 3, text, 7, 8, text])["content"], str)  # strings among ids: one prompt
    for bad in ({"prompt_string": 3}, [1, 2.5, "x"], {"prompt_string": "x", "multimodal_data": ["AAAA"]}):
        r = httpx.post(f"{base}/completion", headers=h, json={"prompt": bad, "n_predict": 1})
        assert r.status_code == 400 and r.json()["error"]["param"] == "prompt", (bad, r.text)
    r = httpx.post(f"{base}/completion", headers=h, json={"prompt": [ids, ids], "stream": True})
    assert r.status_code == 400 and r.json()["error"]["param"] == "stream"


@pytest.mark.slow
def test_generation_settings_list_the_biases_ignore_eos_adds(base: str) -> None:
    """llama-server's test_ignore_eos.py: each end-of-generation token at -inf (null), none without ignore_eos."""
    h = {"Authorization": "Bearer k"}

    def settings(**kw: object) -> dict:
        r = httpx.post(f"{base}/completion", headers=h, json={"prompt": "Once upon a time", "n_predict": 2, "temperature": 0, **kw}, timeout=60)
        assert r.status_code == 200, r.text
        return r.json()["generation_settings"]

    eog = settings(ignore_eos=True)["logit_bias"]
    assert eog and all(e["bias"] is None for e in eog) and {e["token"] for e in eog} >= {2}  # SmolLM2's <|im_end|> is id 2
    assert settings()["logit_bias"] == [] and settings(logit_bias=[[5, -1.0]])["logit_bias"] == [{"bias": -1.0, "token": 5}]


@pytest.mark.slow
def test_an_embedding_request_counts_in_llama_servers_metrics(base: str) -> None:
    """Its prompt tokens and decodes count, no predicted token (llama-server's test_metrics.py)."""
    h = {"Authorization": "Bearer k"}

    def metrics() -> dict[str, float]:
        text = httpx.get(f"{base}/metrics", headers=h).text
        return {ln.split()[0]: float(ln.split()[1]) for ln in text.splitlines() if ln.startswith("llamacpp:")}

    before = metrics()
    r = httpx.post(f"{base}/v1/embeddings", headers=h, json={"input": ["hello world", "goodbye world"]}, timeout=60)
    assert r.status_code == 200, r.text
    after = metrics()
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == r.json()["usage"]["prompt_tokens"]
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"]
    assert after["llamacpp:tokens_predicted_total"] == before["llamacpp:tokens_predicted_total"]


@pytest.mark.slow
def test_responses_deltas_carry_the_timings_when_asked(base: str) -> None:
    """llama-server's timings_per_token on /responses (its test_compat_oai_responses.py): each text delta has them."""
    import json

    body = {"input": "This is a test " * 10, "max_output_tokens": 4, "stream": True, "timings_per_token": True}
    with httpx.stream("POST", f"{base}/responses", headers={"Authorization": "Bearer k"}, json=body, timeout=60) as r:
        events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: ") and line != "data: [DONE]"]
    deltas = [e for e in events if e["type"] == "response.output_text.delta"]
    assert deltas and all("prompt_per_second" in e["timings"] and "predicted_per_second" in e["timings"] for e in deltas)


@pytest.mark.slow
def test_pooling_none_refuses_embeddings_as_llama_server_does(smollm2: Path) -> None:
    """``--pooling none`` (its test_embedding.py's test_embedding_pooling_none_oai): /v1/embeddings is a 400 naming the cause."""
    request = runtime.LoadRequest(model=smollm2, options=fitting.LoadOptions(n_ctx=256, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1)
    with runtime.open_model(request) as loaded, Server(loaded, ServeOptions(port=0, pooling="none"), say=lambda _: None).start() as s:
        for path in ("/v1/embeddings", "/embeddings", "/api/embed"):
            r = httpx.post(f"http://127.0.0.1:{s.port}{path}", json={"input": "hello hello hello", "model": "m"})
            assert r.status_code == 400 and "--pooling none" in r.text, (path, r.text)
