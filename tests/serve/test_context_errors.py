"""A prompt longer than a request's context is a 400 in each route's own shape
(issue 59, item 3), naming the prompt's tokens, the limit and ``--ctx``:
OpenAI's ``context_length_exceeded`` on chat completions and Responses,
Anthropic's ``invalid_request_error`` on Messages, Ollama's ``{"error"}``."""

from __future__ import annotations

import re

import pytest

from tests.helpers.server import KEY, serving

pytestmark = pytest.mark.slow  # starts serve

LONG = "The quick brown fox jumps over the lazy dog. " * 40  # about 400 tokens, over --ctx 128


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "1", "--ctx", "128")


def _says_all(message: str) -> None:
    m = re.search(r"the prompt is (\d+) tokens but a request's context holds 128", message)
    assert m and int(m.group(1)) > 128 and "--ctx" in message, message


@pytest.mark.parametrize("stream", [False, True])
def test_each_route_answers_a_long_prompt_in_its_own_shape(server, stream: bool) -> None:
    """Streamed or not: the length is checked before any event is sent, so a
    streaming client gets the 400 as JSON too (as each vendor's API answers)."""
    import httpx2

    with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}", "x-api-key": KEY}, timeout=60) as c:
        msgs = [{"role": "user", "content": LONG}]
        for path in ("/v1/chat/completions", "/v1/completions"):
            body = {"model": "m", "max_tokens": 1, "stream": stream, **({"messages": msgs} if "chat" in path else {"prompt": LONG})}
            r = c.post(path, json=body)
            assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
            _says_all(r.json()["error"]["message"])
        r = c.post("/v1/responses", json={"model": "m", "input": LONG, "max_output_tokens": 1, "stream": stream})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        _says_all(r.json()["error"]["message"])
        r = c.post("/v1/messages", json={"model": "m", "messages": msgs, "max_tokens": 1, "stream": stream})
        assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        _says_all(r.json()["error"]["message"])
        r = c.post("/api/chat", json={"model": "m", "messages": msgs, "stream": stream})
        assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
        _says_all(r.json()["error"])
        r = c.post("/api/generate", json={"model": "m", "prompt": LONG, "stream": stream})
        assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
        _says_all(r.json()["error"])


def test_deep_but_valid_json_is_named_as_too_deep_not_as_invalid() -> None:
    """Issue 64: valid JSON nested past what the parser reads was refused as "not valid JSON"."""
    from localllm.serve.protocol import RequestError, parse_json

    deep = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(RequestError, match=r"nested deeper than \d+ levels") as info:
        parse_json(deep)
    assert info.value.status == 400
    with pytest.raises(RequestError, match="not valid JSON"):
        parse_json(b'{"messages": [}')
