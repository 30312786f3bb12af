"""A model process killed mid-answer, through the router and the real clients:
each streaming route ends with an error event in its own shape (the client
raises, rather than taking a cut answer for a whole one), a non-streamed
request gets a 502 naming the model, the router's log names the real cause
(the signal), and the next request loads the model again."""

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
LONG = "Write a long story about a dragon who learns to count."


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory, smollm2: Path):
    env = rt.isolated_env(tmp_path_factory.mktemp("cutoff"))
    yield from rt.running(env)


def _kill(router) -> int:
    """SIGKILL smollm2's process, as the OOM killer or a llama.cpp abort would end it."""
    pid = rt.child_pid(router, "smollm2")
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    return pid


def _reloads(router, pid: int) -> None:
    """The kill is logged with its signal (not an earlier request's line), and the model comes back."""
    rt.wait_for(lambda: rt.count(router, r"^localllm: smollm2 exited \(code -9, killed by SIGKILL\)"))
    with http_client(router) as http:
        r = http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2})
    assert r.status_code == 200 and rt.child_pid(router, "smollm2") != pid


def _cut(router, stream, error: type[BaseException]) -> tuple[BaseException, int]:
    """Read ``stream``'s first item, kill the model, and read on: the error the client raised, and the pid."""
    items = iter(stream)
    next(items)
    pid = _kill(router)
    with pytest.raises(error) as caught:
        for _ in items:
            pass
    return caught.value, pid


def _warm(router) -> None:
    with http_client(router) as http:
        # an earlier request's 400 is logged with "invalid_request_error": never the cause named for a kill
        assert http.post("/v1/chat/completions", json={"model": "smollm2", "messages": []}).status_code == 400
        assert http.post("/v1/completions", json={"model": "smollm2", "prompt": "hi", "max_tokens": 2}).status_code == 200


def test_openai_chat_stream_ends_with_an_error_the_client_raises(router) -> None:
    import openai

    _warm(router)
    stream = openai_client(router).chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": LONG}], max_tokens=200, stream=True, extra_body={"ignore_eos": True})
    caught, pid = _cut(router, stream, openai.APIError)
    assert "smollm2 stopped mid-answer" in str(caught) and "killed by SIGKILL" in str(caught)
    assert rt.count(router, r"smollm2 stopped mid-answer: smollm2's process ended \(code -9, killed by SIGKILL\)")
    _reloads(router, pid)


def test_anthropic_stream_ends_with_an_error_event(router) -> None:
    import anthropic

    _warm(router)
    client = anthropic.Anthropic(base_url=router.base, api_key=KEY, max_retries=0)
    with client.messages.stream(model="smollm2", max_tokens=200, messages=[{"role": "user", "content": LONG}]) as stream:
        caught, pid = _cut(router, stream, anthropic.APIStatusError)
    assert "killed by SIGKILL" in str(caught)
    _reloads(router, pid)


def test_ollama_stream_ends_with_an_error_line(router) -> None:
    import ollama

    _warm(router)
    client = ollama.Client(host=router.base, headers={"Authorization": f"Bearer {KEY}"})
    parts = client.chat(model="smollm2", messages=[{"role": "user", "content": LONG}], stream=True, options={"num_predict": 200})
    caught, pid = _cut(router, parts, ollama.ResponseError)
    assert isinstance(caught, ollama.ResponseError)
    assert "smollm2 stopped mid-answer" in caught.error and "killed by SIGKILL" in caught.error
    _reloads(router, pid)


def test_responses_stream_ends_with_an_error_event(router) -> None:
    _warm(router)
    with http_client(router) as http, http.stream("POST", "/v1/responses", json={
            "model": "smollm2", "input": LONG, "max_output_tokens": 200, "stream": True}) as r:
        lines = r.iter_lines()
        assert next(lines).startswith("event: response.created")
        pid = _kill(router)
        rest = list(lines)
    assert "event: error" in rest and not any("response.completed" in line for line in rest)
    assert any('"type":"error"' in line and "killed by SIGKILL" in line for line in rest)
    _reloads(router, pid)


def test_a_request_not_streamed_gets_a_502_naming_the_model_and_the_cause(router) -> None:
    _warm(router)
    pid = rt.child_pid(router, "smollm2")
    assert pid is not None
    threading.Timer(1.0, os.kill, (pid, signal.SIGKILL)).start()
    started = time.monotonic()
    with http_client(router) as http:
        r = http.post("/v1/chat/completions", json={"model": "smollm2", "messages": [{"role": "user", "content": LONG}],
                                                    "max_tokens": 200, "ignore_eos": True})
    assert r.status_code == 502, r.text
    message = r.json()["error"]["message"]
    assert message.startswith("smollm2 did not answer") and "killed by SIGKILL" in message and "invalid_request" not in message
    assert time.monotonic() - started < 30
    _reloads(router, pid)
