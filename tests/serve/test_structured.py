"""Structured output on ``localllm serve`` (issue 25, item 1): ``response_format``
``json_object`` and ``json_schema`` constrain decoding with llama.cpp's grammar
sampler, so even SmolLM2-135M answers valid JSON for the schema; llama-server's
``grammar`` and ``json_schema`` fields work too; a reply that ends by length says
so; a grammar llama.cpp cannot parse is a 400 before any decoding."""

from __future__ import annotations

import enum
import json
from typing import Annotated

import pytest

from tests.helpers.server import KEY, Server


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = Server("smollm2", "--parallel", "2", "--ctx", "1024", "--threads", "1", "--api-key", KEY,
               env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})
    yield s
    s.stop()


def _openai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=120)


@pytest.mark.slow
def test_json_object_is_json(server) -> None:
    r = _openai(server).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": "Give a JSON object with a cat's name and age."}], response_format={"type": "json_object"},
        temperature=0, max_tokens=200)
    choice = r.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.message.content), dict)


@pytest.mark.slow
def test_a_json_object_with_a_schema_is_held_to_it(server) -> None:
    """llama-server's ``{"type": "json_object", "schema": ...}`` (its test_chat_completion.py): the schema holds."""
    import httpx2 as httpx

    def ask(fmt: object):
        return httpx.post(server.base + "/v1/chat/completions", headers={"Authorization": f"Bearer {KEY}"}, timeout=120, json={
            "max_tokens": 6, "messages": [{"role": "user", "content": "Write an example"}], "response_format": fmt})

    r = ask({"type": "json_object", "schema": {"const": "42"}})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] == '"42"', r.text
    for bad in ({"type": "json_object", "schema": 123}, {"type": "json_object", "schema": {"type": "hiccup"}}):
        assert ask(bad).status_code == 400, bad


@pytest.mark.slow
def test_pydantic_parse_with_nested_objects_enums_and_arrays(server) -> None:
    from pydantic import BaseModel, Field

    class Colour(str, enum.Enum):
        red = "red"
        green = "green"
        blue = "blue"

    # bounds a 135M model needs, or it repeats itself until max_tokens: the grammar carries them (maxLength, maxItems)
    # (each toy's length too: greedy, after a cached prefix read in other batch shapes, it once wrote one toy to the 300th token)
    class Owner(BaseModel):
        name: str = Field(max_length=24)
        age: int = Field(ge=0, le=150)

    class Pet(BaseModel):
        name: str = Field(max_length=24)
        colour: Colour
        owner: Owner
        toys: list[Annotated[str, Field(max_length=24)]] = Field(min_length=1, max_length=2)

    client = _openai(server)
    parse = client.chat.completions.parse if hasattr(client.chat.completions, "parse") else client.beta.chat.completions.parse
    r = parse(model="smollm2", messages=[{"role": "user", "content": "Invent a pet with an owner and two toys."}],
              response_format=Pet, temperature=0, max_tokens=300)
    pet = r.choices[0].message.parsed
    assert r.choices[0].finish_reason == "stop" and isinstance(pet, Pet)
    assert isinstance(pet.owner, Owner) and pet.colour in set(Colour) and 1 <= len(pet.toys) <= 2 and len(pet.name) <= 24


@pytest.mark.slow
def test_llama_server_fields_length_and_a_bad_grammar(server) -> None:
    import httpx2

    c = httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    # llama-server's grammar: the reply can only be yes or no
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Is water wet?"}], "temperature": 0,
                                             "grammar": 'root ::= "yes" | "no"'})
    assert r.status_code == 200 and r.json()["choices"][0]["message"]["content"] in ("yes", "no")
    # llama-server's json_schema, cut short by max_tokens: it says "length" and does not pretend to be whole
    schema = {"type": "object", "properties": {"story": {"type": "string"}}, "required": ["story"]}
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Tell a long story."}], "temperature": 0,
                                             "json_schema": schema, "max_tokens": 5})
    choice = r.json()["choices"][0]
    assert r.status_code == 200 and choice["finish_reason"] == "length" and choice["message"]["content"].startswith("{")
    # a grammar llama.cpp cannot parse, and two ways at once: 400s naming the field
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "grammar": "root ::= ("})
    assert r.status_code == 400 and r.json()["error"]["param"] == "grammar" and "does not parse" in r.json()["error"]["message"]
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "grammar": 'root ::= "a"',
                                             "response_format": {"type": "json_object"}})
    assert r.status_code == 400 and "give one way" in r.json()["error"]["message"]
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "response_format": {"type": "xml"}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"
    # the server still answers after all of it
    assert c.get("/health").status_code == 200


@pytest.mark.slow
def test_sampling_fields_are_applied_not_dropped(server) -> None:
    """top_k, min_p, repeat_penalty, presence_penalty and frequency_penalty reach
    llama.cpp's sampler chain: top_k 1 at temperature 1 is greedy, and a strong
    presence penalty changes a greedy reply (it was validated, then dropped)."""
    import httpx2

    c = httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)

    def ask(**kw) -> str:
        body = {"messages": [{"role": "user", "content": "List the days of the week."}], "max_tokens": 40, "seed": 3, **kw}
        r = c.post("/v1/chat/completions", json=body)
        assert r.status_code == 200, r.text
        return r.json()["choices"][0]["message"]["content"]

    greedy = ask(temperature=0)
    assert ask(temperature=1.0, top_k=1) == greedy
    assert ask(temperature=1.0, top_k=0, top_p=1.0, min_p=1.0) == greedy  # min_p 1 keeps the likeliest token only
    assert ask(temperature=0, presence_penalty=2.0) != greedy
    assert ask(temperature=0, frequency_penalty=2.0) != greedy
    assert ask(temperature=0, repeat_penalty=1.5) != greedy
    r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "Hi"}], "top_k": -1})
    assert r.status_code == 400 and r.json()["error"]["param"] == "top_k"


@pytest.mark.slow
def test_nothing_is_silently_ignored(server) -> None:
    """logit_bias reaches the sampler (+100 forces a token); a field no API
    defines is accepted but named in X-Ignored-Fields; a defined field asking
    what the server does not do is a 400 naming it; user/metadata are accepted
    without effect."""
    import httpx2

    c = httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    base = {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 5, "temperature": 0}
    plain = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0}).json()
    forced = c.post("/v1/completions", json={"prompt": "The capital of France is", "max_tokens": 1, "temperature": 0,
                                             "logit_bias": {"42": 100}}).json()
    assert forced["choices"][0]["text"] != plain["choices"][0]["text"]
    r = c.post("/v1/chat/completions", json={**base, "user": "u1", "metadata": {"a": "b"}, "my_vendor_extra": 1, "another": True})
    assert r.status_code == 200 and r.headers["X-Ignored-Fields"] == "another, my_vendor_extra"
    assert "X-Ignored-Fields" not in c.post("/v1/chat/completions", json={**base, "user": "u1"}).headers
    for field, value in (("functions", [{"name": "f"}]), ("n", 3),  # over --parallel 2
                         ("audio", {"voice": "x"}), ("prediction", {"type": "content", "content": "x"})):
        r = c.post("/v1/chat/completions", json={**base, field: value})
        assert r.status_code == 400 and r.json()["error"]["param"] == field, (field, r.text)
    r = c.post("/v1/chat/completions", json={**base, "logit_bias": {"999999": 5}})
    assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias"


@pytest.mark.slow
@pytest.mark.parametrize("shape", ["text pairs", "text object", "id pairs", "id object"])
def test_logit_bias_in_llama_servers_shapes_bans_words(server, shape: str) -> None:
    """llama-server's logit_bias (tools/server/server-schema.cpp, its test_completion.py's
    test_logit_bias): [token or text, bias] pairs or an object, a text standing for
    each of its tokens, false banning; the banned words never appear."""
    import httpx2

    words = ["the", "The", "a", "is", "book", "Book", "and", "to", "of", "I"]
    c = httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    ids = c.post("/tokenize", json={"content": " " + " ".join(words) + " "}).json()["tokens"]
    bias = {"text pairs": [[f" {w} ", -100] for w in words], "text object": {f" {w} ": False for w in words},
            "id pairs": [[t, False] for t in ids], "id object": {str(t): -100 for t in ids}}[shape]
    prompt = {"prompt": "What is the best book", "n_predict": 48, "temperature": 0}
    plain = c.post("/completion", json=prompt).json()["content"]
    assert any(f" {w} " in plain for w in words)  # the check can fail: unbiased, the words are there
    r = c.post("/completion", json={**prompt, "logit_bias": bias})
    assert r.status_code == 200, r.text
    assert not [w for w in words if f" {w} " in r.json()["content"]], r.json()["content"]


def test_logit_bias_bans_a_token(smollm2) -> None:
    """In the engine: -100 on the greedy first token changes it; +100 on another forces that one."""
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig, SamplingConfig

    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=256))
        greedy = next(iter(b.stream("The capital of France is", SamplingConfig(temperature=0, max_tokens=1), chat=False))).token_id
        banned = next(iter(b.stream("The capital of France is", SamplingConfig(temperature=0, max_tokens=1, logit_bias=((greedy, -100.0),)),
                                    chat=False))).token_id
        forced = next(iter(b.stream("The capital of France is", SamplingConfig(temperature=0, max_tokens=1, logit_bias=((42, 100.0),)),
                                    chat=False))).token_id
    assert banned != greedy and forced == 42
