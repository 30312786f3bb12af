"""``localllm bench --url``: against localllm serve (real model) and a loopback
server that omits ``usage`` (the client then counts the stream and says so)."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time

import pytest

from localllm.measure.loadtest import Sample, api_base, summarize
from tests.helpers.cli import cli


def test_api_base() -> None:
    assert api_base("127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert api_base("http://h:1/v1/") == "http://h:1/v1"


def test_summarize_sources_and_missing_figures() -> None:
    a = Sample(ok=True, ttft_ms=10.0, gaps_ms=[1.0, 3.0], chunks=3, completion_tokens=5, prompt_tokens=7, first_s=1.0, last_s=1.004)
    b = Sample(ok=True, ttft_ms=30.0, gaps_ms=[2.0], chunks=2, first_s=2.0, last_s=2.002)
    row = summarize([a, b], 2, 2.0)
    assert row.token_source == "mixed" and row.gen_tokens == 5 + 2 and row.tokens_per_s == 3.5
    assert row.ttft_p50_ms == 20.0 and row.itl_max_ms == 3.0 and row.prompt_tokens == 7
    failed = summarize([Sample(ok=False, error="HTTP 500: x")], 1, 1.0)
    assert failed.errors == 1 and failed.tokens_per_s is None and failed.ttft_p50_ms is None and failed.first_error == "HTTP 500: x"


@pytest.fixture()
def no_usage_server():
    """A loopback OpenAI-style server that streams three chunks and never sends usage."""
    import asyncio

    import uvicorn
    from starlette.applications import Starlette
    from starlette.responses import JSONResponse, StreamingResponse
    from starlette.routing import Route

    async def models(request):
        return JSONResponse({"object": "list", "data": [{"id": "stub", "object": "model"}]})

    async def completions(request):
        body = await request.json()
        assert body["stream"] is True and body["model"] == "stub"

        async def gen():
            for word in ("one", " two", " three"):
                await asyncio.sleep(0.01)
                yield f"data: {json.dumps({'choices': [{'index': 0, 'text': word, 'finish_reason': None}]})}\n\n"
            yield "data: [DONE]\n\n"

        return StreamingResponse(gen(), media_type="text/event-stream")

    app = Starlette(routes=[Route("/v1/models", models), Route("/v1/completions", completions, methods=["POST"])])
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="error"))
    t = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    t.start()
    while not server.started:
        time.sleep(0.02)
    yield f"http://127.0.0.1:{sock.getsockname()[1]}"
    server.should_exit = True
    t.join(10)


@pytest.mark.slow
def test_bench_url_counts_the_stream_when_usage_is_missing(no_usage_server: str) -> None:
    proc = cli("bench", "--url", no_usage_server, "--concurrency", "1,2", "--requests", "3", "--gen-tokens", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["concurrency"] for r in rows] == [1, 2]
    for r in rows:
        assert r["model"] == "stub" and r["errors"] == 0 and r["requests"] == 3
        assert r["token_source"] == "stream" and r["gen_tokens"] == 9 and r["prompt_tokens"] is None
        assert r["ttft_p50_ms"] > 0 and r["itl_p50_ms"] > 5  # the stub sleeps 10 ms between chunks


@pytest.mark.slow
def test_bench_url_unreachable() -> None:
    proc = cli("bench", "--url", "http://127.0.0.1:9", "--concurrency", "1", "--requests", "1")
    assert proc.returncode == 1
    assert proc.stderr.startswith("localllm: error: cannot bench http://127.0.0.1:9") and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_bench_url_against_localllm_serve(tmp_path) -> None:
    from tests.helpers.server import Server

    server = Server("smollm2", "--parallel", "2", "--ctx", "256", "--threads", "1", "--json", env={"LOCALLLM_HOME": str(tmp_path)})
    try:
        proc = cli("bench", "--url", server.base, "--concurrency", "1,2", "--requests", "2", "--prompt-tokens", "16",
                       "--gen-tokens", "8", "--json")
        assert proc.returncode == 0, proc.stderr
        rows = json.loads(proc.stdout)
        for r in rows:
            assert r["model"] == "smollm2" and r["errors"] == 0
            assert r["token_source"] == "usage" and r["gen_tokens"] == 2 * 8  # ignore_eos honoured
            assert 10 <= r["prompt_tokens"] <= 40
            assert r["tokens_per_s"] > 0 and r["ttft_p50_ms"] <= r["ttft_max_ms"] and r["itl_p50_ms"] <= r["itl_p95_ms"]
        text = cli("bench", "--url", server.base, "--concurrency", "2", "--requests", "2", "--prompt-tokens", "8", "--gen-tokens", "4")
        assert text.returncode == 0 and "| 2 | 2 | 0 |" in text.stdout and "usage |" in text.stdout
        # serve --json: the request log is one JSON object per line
        logged = [json.loads(line) for line in server.lines if line.startswith("{")]
        gens = [e for e in logged if e["path"] == "/v1/completions" and e["status"] == 200 and e["generated_tokens"] == 8]
        # >= 0: speculation gives a verified draft's tokens together (a gap of 0 between them is what a client sees)
        assert len(gens) >= 4 and all(e["ttft_ms"] > 0 and e["itl_p50_ms"] >= 0 for e in gens)
        server.proc.send_signal(signal.SIGTERM)  # like SIGINT: drain, clean up, exit 0
        assert server.proc.wait(60) == 0
        deadline = time.monotonic() + 10  # the reader thread takes the last lines after the exit
        while "stopped after" not in server.log and time.monotonic() < deadline:
            time.sleep(0.02)
        assert "stopped after" in server.log
    finally:
        server.stop()
