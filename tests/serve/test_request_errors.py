"""Requests serve refuses, each with a 400 that names the cause, in the route's
own shape. A prompt longer than a request's context (issue 59, item 3): OpenAI's
``context_length_exceeded`` on chat completions and Responses, Anthropic's
``invalid_request_error`` on Messages, Ollama's ``{"error"}``, each naming the
prompt's tokens, the limit and ``--ctx``. Deep but valid JSON, and tool results
that answer no call, said as such (issue 64)."""

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
            error = r.json()["error"]
            assert r.status_code == 400 and error["code"] == "context_length_exceeded", r.text
            # llama-server's type and fields beside OpenAI's code (its tools/server/tests/unit/test_chat_completion.py)
            assert error["type"] == "exceed_context_size_error" and error["n_prompt_tokens"] > error["n_ctx"] > 0, r.text
            _says_all(error["message"])
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


def test_a_tool_result_must_answer_a_call_on_every_api() -> None:
    """Issue 64 item 3: /v1/responses took a function_call_output answering no call (Messages refused
    the same), and /v1/messages took two tool_use blocks with one id. The same rule now on both."""
    from localllm.serve import anthropic, responses
    from localllm.serve.protocol import RequestError

    call = {"type": "function_call", "call_id": "call_1", "name": "f", "arguments": "{}"}
    answer = {"type": "function_call_output", "call_id": "call_1", "output": "ok"}
    assert responses._input([{"role": "user", "content": "hi"}, call, answer], None)[-1]["tool_call_id"] == "call_1"
    with pytest.raises(RequestError, match=r"input\[1\]\.call_id.*answers no function_call"):
        responses._input([{"role": "user", "content": "hi"}, {**answer, "call_id": "call_9"}], None)
    with pytest.raises(RequestError, match="repeats the call_id"):
        responses._input([{"role": "user", "content": "hi"}, call, call], None)
    use = {"type": "tool_use", "id": "toolu_1", "name": "f", "input": {}}
    with pytest.raises(RequestError, match=r"content\[1\]\.id.*repeats the id of an earlier tool_use"):
        anthropic.translate({"max_tokens": 4, "messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": [use, use]}]})
