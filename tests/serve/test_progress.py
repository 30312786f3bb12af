"""llama-server's ``return_progress`` (its tools/server/tests/unit/test_chat_completion.py
test_return_progress): a streamed reply reports its prompt's reading, a first
report before any token is read (the cached ones counted as processed), then
one per batch, ``processed`` rising to ``total``; chat completions, /completion
and Responses each in their own shape, read through the real ``openai`` client
where it applies."""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import cast

import pytest

from tests.helpers.server import KEY, http_client, serving

pytestmark = pytest.mark.slow
PROMPT = "This is a test " * 30


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    yield from serving(tmp_path_factory, "--parallel", "1", "--ctx", "512", "--batch", "32", "--ubatch", "32")


def _events(http, path: str, body: dict) -> list[dict]:
    with http.stream("POST", path, json={**body, "stream": True, "return_progress": True}) as r:
        assert r.status_code == 200
        return [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]


def _check(reports: list[dict], *, batches: int | None = None, cached: bool = False) -> None:
    first, last = reports[0], reports[-1]
    assert first["cache"] == first["processed"] and first["time_ms"] == 0 and (first["cache"] > 0) is cached
    assert all(b["processed"] > a["processed"] and b["total"] == a["total"] and b["cache"] == a["cache"] for a, b in zip(reports, reports[1:]))
    assert last["processed"] == last["total"] > 0 and last["time_ms"] > 0
    if batches is not None:
        assert len(reports) == batches


def test_chat_completions_report_each_batch_then_reuse_the_cache(server) -> None:
    from openai import OpenAI
    from openai.types.chat import ChatCompletionChunk

    client = OpenAI(base_url=f"{server.base}/v1", api_key=KEY, max_retries=0)
    messages = [{"role": "user", "content": PROMPT}]
    stream = client.chat.completions.create(model="m", messages=messages, max_tokens=4, stream=True,
                                            extra_body={"return_progress": True, "cache_prompt": False})
    chunks = list(cast(Iterable[ChatCompletionChunk], stream))
    reports = [c.model_extra["prompt_progress"] for c in chunks if "prompt_progress" in (c.model_extra or {})]
    total = reports[0]["total"]
    _check(reports, batches=1 + -(-total // 32))  # the first report, then one per batch of 32
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # the reply follows
    with http_client(server) as http:
        again = [e["prompt_progress"] for e in _events(http, "/v1/chat/completions", {"messages": messages, "max_tokens": 4})
                 if "prompt_progress" in e]
    _check(again, batches=2, cached=True)  # all but the last token from the cache: one batch left


def test_completion_and_responses_report_in_their_shapes(server) -> None:
    with http_client(server) as http:
        native = _events(http, "/completion", {"prompt": PROMPT + "1", "n_predict": 2})
        _check([e["prompt_progress"] for e in native if "prompt_progress" in e])
        assert all(e["content"] == "" and e["stop"] is False for e in native if "prompt_progress" in e)
        with http.stream("POST", "/v1/responses", json={"input": PROMPT + "2", "max_output_tokens": 2, "stream": True,
                                                         "return_progress": True}) as r:
            events = [json.loads(line[6:]) for line in r.iter_lines() if line.startswith("data: {")]
        reports = [e for e in events if "prompt_progress" in e]
        assert reports and all(e["type"] == "response.in_progress" for e in reports)
        _check([e["prompt_progress"] for e in reports])
        with http.stream("POST", "/completion", json={"prompt": PROMPT + "3", "n_predict": 2, "stream": True}) as r:
            plain = [line for line in r.iter_lines() if line.startswith("data: ")]
        assert plain and not any("prompt_progress" in line for line in plain)
