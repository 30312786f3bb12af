"""A prompt longer than a request's context is a 400 in each route's own shape
(issue 59, item 3), naming the prompt's tokens, the limit and ``--ctx``:
OpenAI's ``context_length_exceeded`` on chat completions and Responses,
Anthropic's ``invalid_request_error`` on Messages, Ollama's ``{"error"}``."""

from __future__ import annotations

import re

import pytest

from tests.helpers.server import KEY, serving

LONG = "The quick brown fox jumps over the lazy dog. " * 40  # about 400 tokens, over --ctx 128


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "1", "--ctx", "128")


def _says_all(message: str) -> None:
    m = re.search(r"the prompt is (\d+) tokens but a request's context holds 128", message)
    assert m and int(m.group(1)) > 128 and "--ctx" in message, message


def test_each_route_answers_a_long_prompt_in_its_own_shape(server) -> None:
    import httpx2

    with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}", "x-api-key": KEY}, timeout=60) as c:
        msgs = [{"role": "user", "content": LONG}]
        r = c.post("/v1/chat/completions", json={"model": "m", "messages": msgs, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        _says_all(r.json()["error"]["message"])
        r = c.post("/v1/responses", json={"model": "m", "input": LONG, "max_output_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        _says_all(r.json()["error"]["message"])
        r = c.post("/v1/messages", json={"model": "m", "messages": msgs, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        _says_all(r.json()["error"]["message"])
        r = c.post("/api/chat", json={"model": "m", "messages": msgs, "stream": False})
        assert r.status_code == 400 and set(r.json()) == {"error"}, r.text
        _says_all(r.json()["error"])
