"""``localllm serve`` on loopback with SmolLM2: real clients (openai, curl, raw
sockets), continuous batching against sequential greedy runs, auth, limits,
disconnects, a bounded fuzz, and SIGINT draining. One server per module."""

from __future__ import annotations

import contextlib
import json
import random
import re
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.helpers.server import KEY, Server


def _start(home: Path, *extra: str) -> Server:
    # One thread: llama.cpp's spinning thread barriers crawl on a busy shared CI machine.
    # No RAM prompt cache: the tests below compare greedy replies across runs, and a prompt
    # put back into other cells can part from a fresh read at a near-tie (llama.cpp's CPU
    # flash attention sums V in f16, in cell order); tests/serve/test_prompt_cache.py has it.
    return Server("smollm2", "--cache-ram", "0", "--parallel", "4", "--ctx", "512", "--max-queue", "4", "--prefill-chunk", "16",
                  "--threads", "1", "--api-key", KEY, "--metrics", *extra, env={"LOCALLLM_HOME": str(home)})


@contextlib.contextmanager
def _own_server(tmp_path: Path, *extra: str) -> Iterator[Server]:
    """A server for one test: one that stops it, or compares greedy replies with a
    fresh read (which the cells earlier requests left can part at a near-tie)."""
    server = _start(tmp_path / "serve-home", *extra)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = _start(tmp_path_factory.mktemp("serve-home"))
    yield s
    s.stop()


def _wait_log(server, pattern: str, timeout: float = 10) -> bool:
    """The log line of a request is written as its response ends: wait for it."""
    deadline = time.time() + timeout
    while not re.search(pattern, server.log):
        if time.time() > deadline:
            return False
        time.sleep(0.05)
    return True


def _client(server):
    import httpx2

    return httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)


def _openai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=120)


PROMPTS = ["What is the capital of France?", "Name three colours.", "Write a haiku about the sea.", "Count from one to five."]


@pytest.mark.slow
def test_openai_client_chat_and_stream(tmp_path: Path) -> None:
    """A server of its own, as the greedy comparison below needs (see
    test_four_concurrent_streams_match_sequential_greedy): after other tests, in
    another order, its reply parted from localllm run's at a near-tie."""
    with _own_server(tmp_path) as server:
        _chat_and_stream(server)


def _chat_and_stream(server: Server) -> None:
    client = _openai(server)
    models = client.models.list()
    assert [m.id for m in models.data] == ["smollm2"]
    r = client.chat.completions.create(model="smollm2", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=24, temperature=0)
    text = r.choices[0].message.content
    # The same greedy reply as localllm run (one sequence, engine.py) gives.
    ran = cli("run", "-p", PROMPTS[0], "--temp", "0", "-n", "24", "--ctx", "512", "--threads", "1", "--json")
    assert ran.returncode == 0, ran.stderr
    assert text == json.loads(ran.stdout)["text"] and text.strip()
    assert r.usage.completion_tokens > 0 and r.usage.prompt_tokens > 5
    assert r.choices[0].finish_reason in ("stop", "length")
    pieces, usage, finish = [], None, None
    for chunk in client.chat.completions.create(
        model="smollm2", messages=[{"role": "user", "content": PROMPTS[0]}], max_tokens=24, temperature=0, stream=True, stream_options={"include_usage": True}
    ):
        if chunk.usage:
            usage = chunk.usage
        for c in chunk.choices:
            pieces.append(c.delta.content or "")
            finish = c.finish_reason or finish
    assert "".join(pieces) == text  # same greedy reply, streamed
    assert usage is not None and usage.completion_tokens == r.usage.completion_tokens and finish == r.choices[0].finish_reason
    # The second identical request reused the cached prompt.
    assert _wait_log(server, r"POST /v1/chat/completions 200 prompt=\d+ cached=[1-9]\d* gen=\d+ ttft=[\d.]+ms itl_p50=[\d.]+ms")


@pytest.mark.slow
def test_openai_completions_max_tokens_and_stop(server) -> None:
    client = _openai(server)
    r = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=5, temperature=0)
    assert r.usage.completion_tokens == 5 and r.choices[0].finish_reason == "length"
    long = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0).choices[0].text
    assert "7" in long
    cut = client.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=12, temperature=0, stop=["7"])
    assert cut.choices[0].finish_reason == "stop" and cut.choices[0].text == long[: long.index("7")]
    # seeded sampling repeats itself
    a = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7).choices[0].text
    b = client.completions.create(model="smollm2", prompt="Once upon a time", max_tokens=8, temperature=1.0, seed=7).choices[0].text
    assert a == b


@pytest.mark.slow
def test_four_concurrent_streams_match_sequential_greedy(tmp_path: Path) -> None:
    """A server of its own: the cells a reply's prompt lands in follow what earlier
    requests left in the cache, and llama.cpp's CPU flash attention sums V in cell
    order, so a near-tie could part the two runs after other tests in another order. No
    speculation: a draft's rows round apart from one-token steps (tests/serve/test_speculation.py
    holds speculation's own replies to the plain ones)."""
    with _own_server(tmp_path, "--speculate", "none") as server:
        _concurrent_matches_sequential(server)


def _concurrent_matches_sequential(server: Server) -> None:
    client = _openai(server)

    def ask(prompt: str) -> str:
        out: list[str] = []
        for chunk in client.chat.completions.create(
            model="smollm2", messages=[{"role": "user", "content": prompt}], max_tokens=20, temperature=0, seed=1, stream=True
        ):
            out.extend(c.delta.content or "" for c in chunk.choices)
        return "".join(out)

    sequential = [ask(p) for p in PROMPTS]
    results: dict[int, str] = {}
    threads = [threading.Thread(target=lambda i=i: results.__setitem__(i, ask(PROMPTS[i]))) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(300)
    assert [results[i] for i in range(4)] == sequential
    assert len(set(sequential)) == 4 and all(sequential)


LONG = (
    "The old lighthouse keeper climbed the spiral stairs every evening, counting the steps as his father had taught him, "
    "and at the top he wiped the salt from the great lens before lighting the lamp that guided the fishing boats home. "
) * 3


def _run_greedy(prompt: str, n: int) -> str:
    ran = cli("run", "--raw", "-p", prompt, "--temp", "0", "-n", str(n), "--ctx", "512", "--threads", "1", "--json")
    assert ran.returncode == 0, ran.stderr
    return json.loads(ran.stdout)["text"]


@pytest.mark.slow
def test_shared_prefix_and_chunked_prefill_match_single_sequence_runs(server) -> None:
    """While A generates: B shares A's prompt cells (llama_memory_seq_cp) and reads only
    its own tail; C's long new prompt is read 16 tokens per step beside A's tokens.
    Both replies equal what one sequence alone (localllm run) produces. Both prompts
    continue text the model has just read, so greedy decoding has no near-ties:
    llama.cpp's sums are not bit-identical across batch shapes, and an open-ended
    prompt ("...Storm") flipped a near-tied token when the machine was busy."""
    import httpx2

    # a start no other test's prompt has: in any order, nothing of it is in the cache
    other = "Quartz lanterns glowed in a small village by the sea, " * 8
    with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
        with c.stream("POST", "/v1/completions", json={"prompt": LONG + "Lamp", "max_tokens": 150, "ignore_eos": True, "stream": True}) as a:
            lines = a.iter_lines()
            next(lines)
            b = c.post("/v1/completions", json={"prompt": LONG + "The old lighthouse keeper", "max_tokens": 10, "temperature": 0}).json()
            cc = c.post("/v1/completions", json={"prompt": other, "max_tokens": 10, "temperature": 0}).json()
            assert b["usage"]["prompt_tokens_details"]["cached_tokens"] >= b["usage"]["prompt_tokens"] - 4
            assert cc["usage"]["prompt_tokens_details"]["cached_tokens"] == 0 and cc["usage"]["prompt_tokens"] > 64
            assert _metric(server, "localllm_requests_running") == 1  # A was generating all along
    assert b["choices"][0]["text"] == _run_greedy(LONG + "The old lighthouse keeper", 10)
    assert cc["choices"][0]["text"] == _run_greedy(other, 10)


@pytest.mark.slow
def test_curl_sse_framing(server) -> None:
    body = json.dumps({"model": "x", "prompt": "Hello", "max_tokens": 6, "stream": True, "stream_options": {"include_usage": True}})
    proc = subprocess.run(
        ["curl", "-sS", "-N", "-i", "-H", f"Authorization: Bearer {KEY}", "-H", "Content-Type: application/json", "-d", body, server.base + "/v1/completions"],
        capture_output=True,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    head, _, payload = proc.stdout.decode().partition("\r\n\r\n")
    assert "content-type: text/event-stream" in head.lower()
    events = payload.split("\n\n")
    assert events[-1] == "" and events[-2] == "data: [DONE]"
    objs = [json.loads(e[len("data: ") :]) for e in events[:-2]]
    assert all(e.startswith("data: ") and "\n" not in e for e in events[:-2])
    assert objs[-1]["usage"]["completion_tokens"] == 6 and objs[-1]["choices"] == []
    assert objs[-2]["choices"][0]["finish_reason"] == "length"
    assert sum(1 for o in objs if o["choices"] and o["choices"][0]["text"]) >= 1


@pytest.mark.slow
def test_auth(server) -> None:
    import httpx2

    with httpx2.Client(base_url=server.base, timeout=30) as c:
        assert c.get("/health").status_code == 200  # no key needed
        for method, path in (("GET", "/v1/models"), ("GET", "/metrics"), ("POST", "/v1/completions"), ("POST", "/v1/chat/completions")):
            for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": f"Basic {KEY}"}, {"Authorization": KEY}, {"x-api-key": "wrong"}):
                r = c.request(method, path, headers=headers, json={"prompt": "hi"})
                assert r.status_code == 401, (method, path, headers)
                assert r.json()["error"]["type"] == "authentication_error"
        assert c.get("/v1/models", headers={"Authorization": f"Bearer {KEY}"}).status_code == 200
        assert c.get("/v1/models", headers={"x-api-key": KEY}).status_code == 200  # Anthropic's clients send it so


@pytest.mark.slow
def test_limits(server) -> None:
    with _client(server) as c:
        r = c.post("/v1/completions", content=b"{" + b" " * (1024 * 1024 + 10) + b"}", headers={"Content-Type": "application/json"})
        assert r.status_code == 413 and r.json()["error"]["code"] == "request_too_large"
        r = c.post("/v1/completions", json={"prompt": " ".join(["word"] * 700), "max_tokens": 4})
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded" and "512" in r.json()["error"]["message"]
        for bad in (
            {"prompt": "x", "max_tokens": 0},
            {"prompt": "x", "max_tokens": -3},
            {"prompt": "x", "max_tokens": "9"},
            {"prompt": "x", "temperature": "hot"},
            {"prompt": "x", "n": 5},  # over the 4 sequences
            {"prompt": 5},
            {"prompt": [10**9]},
            {"messages": "hi"},
        ):
            path = "/v1/chat/completions" if "messages" in bad else "/v1/completions"
            r = c.post(path, json=bad)
            assert r.status_code == 400, bad
            assert set(r.json()["error"]) == {"message", "type", "param", "code"}
        r = c.post("/v1/completions", content=b"{not json", headers={"Content-Type": "application/json"})
        assert r.status_code == 400 and "JSON" in r.json()["error"]["message"]
        # no --rerank: llama-server's 501 and words (tests/serve/test_rerank.py has the rest)
        r = c.post("/v1/rerank", json={"query": "q", "documents": ["d"]})
        assert r.status_code == 501 and "--reranking" in r.json()["error"]["message"]


def _metric(server, name: str) -> float:
    with _client(server) as c:
        text = c.get("/metrics").text
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    assert m, name
    return float(m.group(1))


@pytest.mark.slow
def test_queue_limit_and_disconnect_frees_sequences(server) -> None:
    import httpx2

    streams = []
    c = httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120)
    try:
        body = {"prompt": "Tell me a long story.", "max_tokens": 400, "ignore_eos": True, "stream": True}
        for _ in range(4):  # one per slot
            cm = c.stream("POST", "/v1/completions", json=body)
            r = cm.__enter__()
            lines = r.iter_lines()  # keep it: a dropped iterator closes the connection
            streams.append((cm, r, lines))
            assert r.status_code == 200
            next(lines)
        deadline = time.time() + 120
        while _metric(server, "localllm_requests_running") < 4 and time.time() < deadline:
            time.sleep(0.05)
        assert _metric(server, "localllm_requests_running") == 4
        queued = []
        with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c2:
            for _ in range(4):  # fill the queue (--max-queue 4) ...
                cm = c2.stream("POST", "/v1/completions", json=body)
                queued.append((cm, cm.__enter__()))
            r = c2.post("/v1/completions", json={"prompt": "one more", "max_tokens": 2})  # ... and one too many
            assert r.status_code == 429 and r.json()["error"]["type"] == "rate_limit_error"
            for cm, _resp in queued:
                cm.__exit__(None, None, None)
        for cm, *_ in streams:
            cm.__exit__(None, None, None)  # clients go away mid-stream
        steps = _metric(server, "localllm_decode_steps_total")
        t0 = time.time()
        while _metric(server, "localllm_requests_running") > 0 and time.time() - t0 < 120:
            time.sleep(0.05)
        assert _metric(server, "localllm_requests_running") == 0
        # Freed within one step of noticing (the step in flight may finish), however slow a step is here.
        assert _metric(server, "localllm_decode_steps_total") - steps <= 2
        assert _metric(server, "localllm_requests_queued") == 0
        assert _wait_log(server, r"POST /v1/completions 499 ")
    finally:
        c.close()
    with _client(server) as c:  # still serving
        r = c.post("/v1/completions", json={"prompt": "1, 2, 3,", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3


@pytest.mark.slow
def test_metrics(server) -> None:
    with _client(server) as c:
        for _ in range(2):  # its own traffic, whatever ran before: the second read finds the first's prompt cached
            c.post("/v1/completions", json={"prompt": "Metrics: one, two, three, four,", "max_tokens": 2, "temperature": 0}).raise_for_status()
        text = c.get("/metrics").text
    for name in (
        "localllm_requests_total",
        "localllm_generated_tokens_total",
        "localllm_time_to_first_token_seconds_bucket",
        "localllm_inter_token_latency_seconds_count",
        "localllm_kv_cells_used",
        "localllm_batch_sequences",
        "localllm_kv_cells_total",
    ):
        assert name in text, name
    assert _metric(server, "localllm_generated_tokens_total") > 0
    assert _metric(server, "localllm_kv_cells_total") >= 2048
    assert _metric(server, "localllm_prompt_tokens_cached_total") > 0
    assert 'localllm_threads{kind="token",mode="fixed"} 1' in text  # --threads 1: fixed, and exported (issue 50)


@pytest.mark.slow
def test_llama_servers_metrics_by_its_rules(server) -> None:
    """llama-server's names, types and help lines (its tools/server/tests/unit/test_metrics.py):
    prompt tokens counted processed and cached apart, predicted tokens as the
    replies' timings say, decode calls, and its start-time header."""
    def scrape(c) -> tuple[dict[str, float], str]:
        r = c.get("/metrics")
        assert r.status_code == 200 and int(r.headers["Process-Start-Time-Unix"]) > 1.7e9
        types = {line.split()[2]: line.split()[3] for line in r.text.splitlines() if line.startswith("# TYPE llamacpp:")}
        values = {name: float(v) for name, v in (line.split(" ", 1) for line in r.text.splitlines() if line.startswith("llamacpp:"))}
        assert set(types) == set(values) and all(f"# HELP {n} " in r.text for n in values)
        assert {n for n, t in types.items() if t == "gauge"} == {f"llamacpp:{g}" for g in (
            "prompt_tokens_seconds", "predicted_tokens_seconds", "requests_processing", "requests_deferred", "n_busy_slots_per_decode")}
        return values, r.text

    with _client(server) as c:
        before, _ = scrape(c)
        prompt, cached, predicted = 0, 0, 0
        for n in (1, 4, 4):  # the third reads the second's prompt from the cache
            t = c.post("/completion", json={"prompt": "Metrics by llama-server's rules:", "n_predict": n, "temperature": 0}).json()["timings"]
            prompt, cached, predicted = prompt + t["prompt_n"], cached + t["cache_n"], predicted + t["predicted_n"]
        after, _ = scrape(c)
    assert cached > 0 and predicted == 9
    assert after["llamacpp:prompt_tokens_total"] - before["llamacpp:prompt_tokens_total"] == prompt
    assert after["llamacpp:prompt_tokens_cached_total"] - before["llamacpp:prompt_tokens_cached_total"] == cached
    assert after["llamacpp:tokens_predicted_total"] - before["llamacpp:tokens_predicted_total"] == predicted
    assert after["llamacpp:n_decode_total"] > before["llamacpp:n_decode_total"] and after["llamacpp:requests_processing"] == 0
    assert after["llamacpp:predicted_tokens_seconds"] > 0 and after["llamacpp:prompt_seconds_total"] > 0


def _fuzz_cases(rng: random.Random) -> list[tuple[str, str, bytes]]:
    valid = {"prompt": "hi", "max_tokens": 2}
    values: list[object] = [
        None,
        True,
        False,
        0,
        -1,
        1.5,
        1e309 if False else 1e308,
        "",
        "x" * 5000,
        [],
        {},
        [1, "a"],
        {"a": {"b": []}},
        "\u0000\ud7ff\uffff",
        -(2**63),
        2**70,
    ]
    keys = [
        "prompt",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "seed",
        "stop",
        "n",
        "stream",
        "stream_options",
        "model",
        "logprobs",
        "top_logprobs",
        "n_probs",
        "cache_prompt",
        "tools",
        "echo",
        "suffix",
        "ignore_eos",
        "presence_penalty",
    ]
    cases: list[tuple[str, str, bytes]] = []
    for _ in range(220):
        body = dict(valid) if rng.random() < 0.5 else {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 2}
        for _ in range(rng.randint(1, 3)):
            body[rng.choice(keys)] = rng.choice(values)
        path = "/v1/chat/completions" if "messages" in body and rng.random() < 0.7 else "/v1/completions"
        cases.append(("POST", path, json.dumps(body).encode()))
    for _ in range(40):
        cases.append(("POST", rng.choice(["/v1/completions", "/v1/chat/completions"]), bytes(rng.randrange(256) for _ in range(rng.randint(0, 300)))))
    cases += [
        ("POST", "/v1/completions", b"[" * 100000 + b"]" * 100000),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]}).encode()),
        ("POST", "/v1/chat/completions", json.dumps({"messages": [{"role": "wizard", "content": "x"}]}).encode()),
        ("POST", "/v1/completions", b'{"prompt": "x", "max_tokens": NaN}'),
        ("POST", "/v1/completions", b'{"prompt": "x", "temperature": Infinity}'),
        ("GET", "/v1/completions", b""),
        ("DELETE", "/v1/models", b""),
        ("GET", "/../../etc/passwd", b""),
        ("GET", "/v1/" + "a" * 3000, b""),
        ("PUT", "/metrics", b"x"),
    ]
    return cases


@pytest.mark.slow
def test_fuzz_leaves_server_answering(server) -> None:
    client = _openai(server)
    # read afresh both times (llama-server's cache_prompt false): a prefix reused from an earlier request is the
    # same cells but its last token's logits come from another batch shape, which can flip a greedy near-tie
    ask = dict(model="smollm2", messages=[{"role": "user", "content": PROMPTS[1]}], max_tokens=16, temperature=0,
               extra_body={"cache_prompt": False})
    before = client.chat.completions.create(**ask).choices[0].message.content
    rng = random.Random(1234)
    cases = _fuzz_cases(rng)
    statuses = set()
    with _client(server) as c:
        for method, path, body in cases:
            r = c.request(method, path, content=body, headers={"Content-Type": "application/json"})
            statuses.add(r.status_code)
            assert r.status_code in (200, 400, 404, 405, 413), (path, body[:200], r.status_code, r.text[:300])
            assert "Traceback" not in r.text and 'File "' not in r.text
            if r.status_code != 200:
                assert r.json()["error"]["message"]
    # raw garbage on the socket
    host, port = server.base.removeprefix("http://").rsplit(":", 1)
    for junk in (
        b"\x00\x01\x02garbage\r\n\r\n",
        b"GET / HTTP/1.1\r\nHost: x\r\nContent-Length: -5\r\n\r\n",
        b"POST /v1/completions HTTP/1.1\r\n" + b"X: y\r\n" * 2000,
    ):
        with socket.create_connection((host, int(port)), timeout=10) as s:
            s.sendall(junk)
            s.shutdown(socket.SHUT_WR)
            data = s.recv(4096)
            assert b"Traceback" not in data
    assert 400 in statuses and 200 in statuses
    assert client.chat.completions.create(**ask).choices[0].message.content == before
    assert "Traceback" not in server.log


@pytest.mark.slow
def test_sigint_drains_then_exits(tmp_path: Path) -> None:
    """A server of its own, since this test stops it: the module's server answers the
    other tests in any order."""
    import httpx2

    server = _start(tmp_path / "serve-home")
    try:
        with httpx2.Client(base_url=server.base, headers={"Authorization": f"Bearer {KEY}"}, timeout=120) as c:
            with c.stream(
                "POST",
                "/v1/completions",
                json={"prompt": "Count:", "max_tokens": 10, "ignore_eos": True, "stream": True, "stream_options": {"include_usage": True}},
            ) as r:
                lines = r.iter_lines()
                assert next(lines).startswith("data: ")
                server.proc.send_signal(signal.SIGINT)
                rest = [line for line in lines if line]
        assert rest[-1] == "data: [DONE]"
        assert json.loads(rest[-2][6:])["usage"]["completion_tokens"] == 10  # the running request finished
        assert server.proc.wait(60) == 0
        assert "stopped after" in server.log
    finally:
        server.stop()


def test_non_loopback_host_warns_without_key(tmp_path: Path) -> None:
    proc = cli("serve", str(tmp_path / "missing.gguf"), "--host", "0.0.0.0")
    assert proc.returncode == 1
    assert "warning: listening on 0.0.0.0 without --api-key" in proc.stderr and "Traceback" not in proc.stderr


# -- the scheduler alone, on a stand-in model (no llama.cpp): its own rules ----------


class _CountingModel:
    """Predicts token t+1 after t; token k reads as chr(ord('a') + k % 26); 99 is end-of-generation."""

    def __init__(self) -> None:
        self.batches: list[list[tuple[int, int, int, bool]]] = []
        self.copies: list[tuple[int, int, int]] = []
        self.last: dict[int, int] = {}

    def seq_rm(self, seq, p0=0, p1=-1):
        return True

    def seq_cp(self, src, dst, n):
        self.copies.append((src, dst, n))

    def new_sampler(self, sampling, prompt=()):
        return object()

    def free_sampler(self, sampler):
        pass

    def decode(self, entries):
        self.batches.append(list(entries))
        self.rows = {i: tok for i, (tok, _, _, want) in enumerate(entries) if want}

    def sample(self, sampler, i):
        return self.rows[i] + 1

    def sample_all(self, picks):
        return [self.sample(sampler, i) for sampler, i in picks]

    def is_eog(self, tok):
        return tok == 99

    def piece(self, tok):
        return chr(ord("a") + tok % 26).encode()


def _scheduler(model, **kw):
    from localllm.serve.prometheus import ServerMetrics
    from localllm.serve.scheduler import Scheduler

    args = dict(n_seq=2, n_ctx_seq=64, n_batch=32, prefix_reuse=True, max_queue=4, prefill_chunk=4, metrics=ServerMetrics())
    args.update(kw)
    return Scheduler(model, **args)


def _job(tokens, max_tokens=5, stop=()):
    from localllm.engine_api import SamplingConfig
    from localllm.serve.scheduler import Job

    events = []
    job = Job(
        tokens=list(tokens),
        sampling=SamplingConfig(temperature=0, max_tokens=max_tokens),
        max_tokens=max_tokens,
        emit=lambda kind, payload: events.append((kind, payload)),
        stop=tuple(stop),
    )
    return job, events


def _drain(sched, steps=100):
    for _ in range(steps):
        sched._step()
        if not sched.pending and not any(s.job for s in sched.slots):
            return


def test_scheduler_stop_string_across_tokens_is_cut_and_never_sent() -> None:
    model = _CountingModel()
    sched = _scheduler(model)
    job, events = _job([0, 1, 2], max_tokens=10, stop=["fgh"])  # replies d e f g h ...
    sched.submit(job)
    _drain(sched)
    texts = [p for k, p in events if k == "text"]
    assert "".join(texts) == "de" and events[-1] == ("done", "stop")
    assert not any("f" in t for t in texts)  # the held-back prefix of the stop string never went out


def test_scheduler_length_eog_and_usage() -> None:
    model = _CountingModel()
    sched = _scheduler(model)
    a, ea = _job([0, 1], max_tokens=3)
    b, eb = _job([95, 96], max_tokens=10)  # 97, 98, then 99 = end of generation
    sched.submit(a)
    sched.submit(b)
    _drain(sched)
    assert "".join(p for k, p in ea if k == "text") == "cde" and ea[-1] == ("done", "length") and a.n_gen == 3
    assert b.n_gen == 2 and eb[-1] == ("done", "stop")
    assert a.usage()["total_tokens"] == 5


def test_scheduler_chunked_prefill_and_prefix_sharing() -> None:
    model = _CountingModel()
    sched = _scheduler(model)
    a, _ = _job(range(10), max_tokens=20)
    sched.submit(a)
    for _ in range(4):  # A reads its prompt (no one generates: whole prompt at once) and generates
        sched._step()
    assert len(model.batches[0]) == 10
    b, eb = _job(list(range(8)) + [50, 51, 52, 53, 54, 55, 56, 57], max_tokens=2)
    sched.submit(b)
    _drain(sched)
    # B shares A's first 8 cells (A is busy) and reads its 8 new tokens 4 per step beside A's token.
    assert model.copies == [(0, 1, 8)] and b.n_cached == 8
    mixed = [bt for bt in model.batches if any(seq == 1 for _, _, seq, _ in bt) and any(seq == 0 for _, _, seq, _ in bt)]
    assert [sum(1 for e in bt if e[2] == 1) for bt in mixed[:2]] == [4, 4]
    assert eb[-1] == ("done", "length")
    # a repeat of B's prompt in its own idle slot: everything but the last token is reused
    c, _ = _job(b.tokens, max_tokens=1)
    sched.submit(c)
    _drain(sched)
    assert c.n_cached == len(b.tokens) - 1


def test_scheduler_cancel_and_queue_limit() -> None:
    model = _CountingModel()
    sched = _scheduler(model, max_queue=1)
    a, ea = _job([1, 2], max_tokens=50)
    sched.submit(a)
    sched._step()
    sched.cancel(a)
    sched._step()
    assert all(s.job is None for s in sched.slots) and ea == [("text", "d")]
    assert sched.submit(_job([1])[0]) and not sched.submit(_job([1])[0])


def test_scheduler_n_siblings_share_the_prompt_read_once() -> None:
    """Choice 1 waits for choice 0 to read the prompt, then shares its cells (seq_cp): the prompt is decoded once."""
    from localllm.serve.scheduler import Job

    model = _CountingModel()
    sched = _scheduler(model)
    a, _ = _job(range(10), max_tokens=3)
    b, eb = _job(range(10), max_tokens=3)
    b = Job(tokens=b.tokens, sampling=b.sampling, max_tokens=3, emit=b.emit, after=a)
    sched.submit(a)
    sched.submit(b)
    _drain(sched)
    prompt_reads = sum(1 for bt in model.batches for tok, pos, seq, _ in bt if pos < 9)
    assert prompt_reads == 9 and model.copies == [(0, 1, 9)] and b.n_cached == 9 and eb[-1] == ("done", "length")


def test_scheduler_cache_prompt_false_reuses_nothing() -> None:
    model = _CountingModel()
    sched = _scheduler(model)
    a, _ = _job(range(10), max_tokens=1)
    sched.submit(a)
    _drain(sched)
    b, _ = _job(range(10), max_tokens=1)
    b.cache_prompt = False
    sched.submit(b)
    _drain(sched)
    assert b.n_cached == 0 and not model.copies


@pytest.mark.slow
def test_serve_over_a_worker(tmp_path: Path) -> None:
    """serve --rpc: the model's layers go to one loopback worker (its own
    process), a request answers, and the worker is held by the server while it
    serves (a worker serves one client at a time) and free again after."""
    from localllm.errors import InputError
    from localllm.plan.workers import probe
    from tests.helpers.workers import WorkerProc

    w = WorkerProc()
    try:
        s = Server("smollm2", "--rpc", str(w.ep), "--parallel", "2", "--ctx", "512", "--threads", "1", env={"LOCALLLM_HOME": str(tmp_path)})
        try:
            import httpx2

            r = httpx2.post(
                s.base + "/v1/chat/completions",
                timeout=120,
                json={"model": "smollm2", "messages": [{"role": "user", "content": "What is the capital of France?"}], "max_tokens": 12, "temperature": 0},
            )
            assert r.status_code == 200, r.text
            d = r.json()
            assert d["choices"][0]["message"]["content"] and d["usage"]["completion_tokens"] == 12
            with pytest.raises(InputError, match="one client at a time"):
                probe(w.ep, timeout=1)  # the server holds the worker's one connection: its layers are there
        finally:
            s.stop()
        assert s.proc.returncode == 0, s.log
        assert probe(w.ep, timeout=5).devices  # released when the server stopped
    finally:
        w.stop()


def test_the_scheduler_lets_the_emits_go_before_each_decode_and_when_idle() -> None:
    calls: list[str] = []

    class Recorder:
        def engine_thread(self, on: bool) -> None:
            calls.append(f"thread {on}")

        def flush(self) -> None:
            calls.append("flush")

    model = _CountingModel()
    real = model.decode

    def decode(entries):
        calls.append("decode")
        return real(entries)

    model.decode = decode  # type: ignore[method-assign]
    sched = _scheduler(model, handoff=Recorder())
    job, events = _job([0, 1, 2], max_tokens=3)
    done = threading.Event()
    job.emit = lambda kind, payload: (events.append((kind, payload)), done.set() if kind == "done" else None)  # type: ignore[func-returns-value]
    sched.start()
    sched.submit(job)
    assert done.wait(10)
    sched.stop()
    decodes = [i for i, c in enumerate(calls) if c == "decode"]
    assert decodes and all(calls[i - 1] == "flush" for i in decodes)  # every decode right after a flush
    assert calls[0] == "thread True" and calls[-2:] == ["thread False", "flush"]
    last = decodes[-1]
    assert "flush" in calls[last + 1:-2]  # the last step's emits ("done") went out when the engine idled
