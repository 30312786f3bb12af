"""``serve MODEL`` with no ``--ctx`` (issue 59, item 3): each request gets the
model's trained context where the plan says it fits (Gemma 3 270M: 32,768 a
request, four of them in a 131,072-cell pool, 421.5 MiB of KV cache), so a
coding agent's first prompt (6,000-20,000 tokens) is taken, and a prompt past
the trained context is the route's context error. ``plan`` says what serve
will choose and ``ps`` says why it chose it.

Gemma 3 270M reads about 100 prompt tokens a second on one thread here, so the
~7,000-token prompt is not read to its end: the request is streamed, and its
200 (sent once the prompt has passed the length check and been queued) is the
answer; the client then leaves, and serve's log line (499, ``prompt=N``) shows
the prompt it took."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.helpers.server import KEY, Server

pytestmark = pytest.mark.slow  # starts serve

LINE = "Line {i}: the quick brown fox jumps over the lazy dog."


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory, gemma: Path) -> Iterator[Server]:
    s = Server(str(gemma), "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("home"))})
    try:
        yield s
    finally:
        s.stop()


def _client(server: Server):
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"x-api-key": KEY, "Authorization": f"Bearer {KEY}"}, timeout=60)


def test_each_request_gets_the_trained_context(server: Server) -> None:
    start = next(ln for ln in server.lines if "serving " in ln)
    assert "4 parallel, 32768 tokens per request (trained), KV pool 131072 cells f16/f16" in start, start
    with _client(server) as c:
        assert c.get("/props").json()["default_generation_settings"]["n_ctx"] == 32768
        model = c.get("/api/ps").json()["models"][0]
        assert model["context_length"] == 32768 and model["localllm"]["context"] == "32768 (trained)"
    r = cli("ps", "--url", server.base, "--api-key", KEY)
    assert r.returncode == 0 and "32768 (trained)" in r.stdout.splitlines()[1], r.stdout + r.stderr


def test_a_coding_agents_first_prompt_is_taken(server: Server) -> None:
    messages = [{"role": "user", "content": " ".join(LINE.format(i=i) for i in range(440))}]
    with _client(server) as c:
        n = c.post("/v1/messages/count_tokens", json={"model": "m", "messages": messages}).json()["input_tokens"]
        assert 6000 < n < 8000  # over the 4096 that was serve's default before
        with c.stream("POST", "/v1/messages", json={"model": "m", "max_tokens": 1, "stream": True, "messages": messages}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    deadline = time.monotonic() + 30
    while not (taken := [ln for ln in server.lines if "POST /v1/messages 499 " in ln]) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert taken and f"prompt={n} " in taken[0], "\n".join(server.lines[-5:])


def test_a_prompt_past_the_trained_context_is_a_context_error(server: Server) -> None:
    text = " ".join(LINE.format(i=i) for i in range(2200))  # about 34,600 tokens
    with _client(server) as c:
        r = c.post("/v1/messages", json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 400 and r.json()["type"] == "error" and r.json()["error"]["type"] == "invalid_request_error", r.text
        m = re.search(r"the prompt is (\d+) tokens but a request's context holds 32768: .*--ctx", r.json()["error"]["message"])
        assert m and int(m.group(1)) > 32768, r.text
        r = c.post("/v1/chat/completions", json={"model": "m", "max_tokens": 1, "messages": [{"role": "user", "content": text}]})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text


def test_plan_says_what_serve_chooses(gemma: Path) -> None:
    r = cli("plan", str(gemma), "--no-dry-run")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.splitlines()
    assert lines[0].startswith("context 4096 tokens (run's default, at most 4096; trained 32768) · "), lines[0]
    assert lines[-1] == ("serve with no --ctx: 32768 tokens per request (trained) x 4 parallel, "
                         "KV cache f16/f16 421.50 MiB (131072 cells), 808.93 MiB in all"), lines[-1]
    d = json.loads(cli("plan", str(gemma), "--no-dry-run", "--json").stdout)
    assert d["context"] == {"n_ctx": 4096, "asked": 4096, "trained": 32768, "why": "default",
                            "text": "4096 (run's default, at most 4096; trained 32768)"}
    assert d["serve"]["context"]["text"] == "32768 (trained)" and d["serve"]["n_ctx"] == 131072 and d["serve"]["parallel"] == 4
    assert d["serve"]["kv_cache_bytes"] == 421.5 * 2**20 and d["serve"]["fits"]


def test_where_the_trained_context_does_not_fit_the_start_line_says_so(tmp_path: Path) -> None:
    """A 400 MiB GPU budget (``--vram``, simulated: the plan counts the layers
    on it) does not hold SmolLM2's two sequences of 8,192 at f16. The default
    context gives way first (``planner.search``), but f16 cannot hold even
    4,096 a sequence, so q8_0 holds the largest it can (6,528 each; a named
    context would have kept its 8,192 at q4_0)."""
    s = Server("smollm2", "--threads", "1", "--parallel", "2", "--vram", "400MiB", env={"LOCALLLM_HOME": str(tmp_path / "home")})
    try:
        start = next(ln for ln in s.lines if "serving " in ln)
        assert re.search(r"2 parallel, (\d+) tokens per request \(largest that fits; trained 8192\), KV pool \d+ cells q8_0/q8_0", start), start
        assert any(ln.startswith("localllm: fitted to --vram 400.00 MiB: context ") for ln in s.lines), s.log
    finally:
        s.stop()
