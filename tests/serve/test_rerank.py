"""Rerank (issue 47, item 4): ``serve --rerank`` on a tiny synthetic BERT reranker
(scripts/synth_gguf.py's ``write_reranker_gguf``: cls and cls.output heads,
rank pooling), side by side with the real llama-server ``--rerank`` on the
same file: the same scores per document, the same response keys and token
counts, on all four paths; bad input answered 4xx in OpenAI's error shape with
the server still up; a model without a classification head served as llama-server
serves it, with a warning at start and a header on every answer."""

from __future__ import annotations

import contextlib
import math
import subprocess
import time
from pathlib import Path
from typing import Any

import httpx2
import pytest

from localllm.router.proxy import PROXIED
from localllm.serve.rerank import MAX_DOCUMENTS, PATHS
from scripts import llama_tools
from scripts.synth_gguf import RerankerSpec, write_reranker_gguf
from tests.helpers.server import KEY, Server, http_client
from tests.helpers.workers import free_port

pytestmark = pytest.mark.slow

QUERY = "the cat sat on the mat"
DOCS = ["the cat sat", "hello there world", "paris is a city", "a mat", "", "the the the cat", "héllo ✓ wörld", "on the mat the cat sat"]
# one per path: all documents, top_n, the request's model (llama-server echoes it), top_n 0
BODIES: list[dict[str, Any]] = [{"query": QUERY, "documents": DOCS}, {"query": QUERY, "documents": DOCS, "top_n": 3},
                                {"query": "paris", "documents": DOCS[:3], "model": "mine"}, {"query": "x", "documents": ["y"], "top_n": 0}]
# a context small enough that a long document passes it: 128 tokens a pair (--ctx per sequence)
SIZES = ("-c", "128", "-t", "1")


class LlamaServer:
    def __init__(self, model: Path) -> None:
        self.port = free_port()
        # -np 8 -c 1024: 128 tokens a slot, as serve's --ctx 128; all of DOCS in one batch, as serve's rank context takes them
        self.proc = subprocess.Popen([str(llama_tools.require("llama-server")), "-m", str(model), "--rerank", "-np", "8", "-c", "1024",
                                      "-t", "1", "--no-warmup", "--no-webui", "--port", str(self.port), "--host", "127.0.0.1"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.base = f"http://127.0.0.1:{self.port}"

    def wait(self) -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "llama-server exited"
            with contextlib.suppress(httpx2.HTTPError):
                if httpx2.get(self.base + "/health", timeout=5).status_code == 200:
                    return
            time.sleep(0.05)
        raise TimeoutError("llama-server did not start")

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture(scope="module")
def model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_reranker_gguf(tmp_path_factory.mktemp("reranker") / "reranker.gguf")


@pytest.fixture(scope="module")
def servers(model: Path, tmp_path_factory: pytest.TempPathFactory):
    theirs = LlamaServer(model)  # starts while ours loads
    try:
        # --pooling rank: llama-server's other spelling of --rerank (the parser test covers --rerank itself)
        ours = Server(str(model), "--pooling", "rank", "-np", "1", *SIZES, "--api-key", KEY,
                      env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})
        try:
            theirs.wait()
            yield ours, theirs
        finally:
            ours.stop()
    finally:
        theirs.stop()


def _close(a: float, b: float) -> bool:
    # relative 1e-4, or 1e-4 absolute for a score near 0 (-0.147606 against -0.147590 once, its batch laid out otherwise)
    return a == b or math.isclose(a, b, rel_tol=1e-4, abs_tol=1e-4)


def test_scores_keys_and_usage_match_llama_server(servers) -> None:
    ours, theirs = servers
    exact, worst = 0, 0.0
    with http_client(ours) as c:
        for path, body in zip(PATHS, BODIES):
            mine = c.post(path, json=body)
            ref = httpx2.post(theirs.base + path, json=body, timeout=60).json()
            assert mine.status_code == 200, mine.text
            got = mine.json()
            assert list(got) == list(ref) == ["model", "object", "usage", "results"]
            assert got["object"] == "list" and got["usage"] == ref["usage"]
            assert got["model"] == body.get("model", "reranker")  # the request's, else the served name (llama-server: its path)
            assert len(got["results"]) == len(ref["results"]) == min(body.get("top_n", len(body["documents"])), len(body["documents"]))
            theirs_by_index = {r["index"]: r["relevance_score"] for r in ref["results"]}
            for r in got["results"]:
                assert list(r) == ["index", "relevance_score"]
                assert _close(r["relevance_score"], theirs_by_index[r["index"]]), (path, r, theirs_by_index)
                exact += r["relevance_score"] == theirs_by_index[r["index"]]
                worst = max(worst, abs(r["relevance_score"] - theirs_by_index[r["index"]]) / abs(theirs_by_index[r["index"]]))
            scores = [r["relevance_score"] for r in got["results"]]
            assert scores == sorted(scores, reverse=True)
    print(f"{exact} scores bit for bit equal to llama-server's; largest relative difference {worst:.2e}")
    # a document alone in its batch: the same tokens through the same kernels, bit for bit. In a batch
    # the rows' places move the last digits (llama.cpp's flash attention; llama-server's own score for a
    # document moves as much with what shares its batch), hence the tolerance above.
    with http_client(ours) as c:
        for doc in DOCS:
            body = {"query": QUERY, "documents": [doc]}
            mine = c.post("/v1/rerank", json=body).json()["results"][0]["relevance_score"]
            assert mine == httpx2.post(theirs.base + "/v1/rerank", json=body, timeout=60).json()["results"][0]["relevance_score"], doc


def test_tei_shape_as_llama_server(servers) -> None:
    ours, theirs = servers
    body = {"query": QUERY, "texts": DOCS[:4], "return_text": True, "top_n": 2}
    with http_client(ours) as c:
        got = c.post("/rerank", json=body).json()
    ref = httpx2.post(theirs.base + "/rerank", json=body, timeout=60).json()
    assert [list(r) for r in got] == [list(r) for r in ref] == [["index", "score", "text"]] * 2
    assert [r["index"] for r in got] == [r["index"] for r in ref]
    assert all(_close(a["score"], b["score"]) and a["text"] == b["text"] for a, b in zip(got, ref))


def test_bad_input_is_a_400_and_the_server_stays_up(servers) -> None:
    ours, _ = servers
    long_doc = " ".join(["cat"] * 300)
    bad = {
        "documents": {"query": QUERY, "documents": ["a"] * 100_000},
        "not strings": {"query": QUERY, "documents": ["a", 1, None]},
        "no documents": {"query": QUERY, "documents": []},
        "documents not a list": {"query": QUERY, "documents": "a"},
        "empty query": {"query": "", "documents": ["a"]},
        "no query": {"documents": ["a"]},
        "query not a string": {"query": ["a"], "documents": ["a"]},
        "top_n float": {"query": QUERY, "documents": ["a"], "top_n": 1.5},
        "top_n negative": {"query": QUERY, "documents": ["a"], "top_n": -1},
        "top_n bool": {"query": QUERY, "documents": ["a"], "top_n": True},
        "too long": {"query": QUERY, "documents": ["a", long_doc]},
    }
    with http_client(ours) as c:
        for why, body in bad.items():
            r = c.post("/v1/rerank", json=body)
            assert r.status_code == 400, (why, r.text)
            err = r.json()["error"]
            assert set(err) >= {"message", "type", "param", "code"} and err["type"] == "invalid_request_error", (why, err)
        r = c.post("/v1/rerank", json=bad["documents"])
        assert f"at most {MAX_DOCUMENTS}" in r.json()["error"]["message"]
        r = c.post("/v1/rerank", json=bad["too long"])
        assert r.json()["error"]["code"] == "context_length_exceeded" and "documents[1]" in r.json()["error"]["message"]
        assert c.post("/v1/rerank", content=b"{not json").status_code == 400
        # an encoder cannot generate: the generation routes say so (llama.cpp would abort the process)
        r = c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}]})
        assert r.status_code == 400 and "cannot generate" in r.json()["error"]["message"]
        assert c.get("/health").status_code == 200
        r = c.post("/v1/rerank", json={"query": QUERY, "documents": DOCS[:2]})
        assert r.status_code == 200 and len(r.json()["results"]) == 2


def test_a_model_without_a_classification_head_answers_as_llama_server_and_says_so(tmp_path: Path) -> None:
    """llama-server serves /v1/rerank on any model (its rank pooling then scores the first
    token's first hidden value); serve answers the same, warns at start, and marks
    every answer X-Rerank-Head: none."""
    plain = write_reranker_gguf(tmp_path / "bert.gguf", RerankerSpec(head=False))
    s = Server(str(plain), "--rerank", env={"LOCALLLM_HOME": str(tmp_path / "home")})
    try:
        assert "bert.gguf has no classification head" in s.log and "X-Rerank-Head: none" in s.log
        r = httpx2.post(s.base + "/v1/rerank", json={"query": "a", "documents": ["b", "c"]}, timeout=60)
        assert r.status_code == 200 and len(r.json()["results"]) == 2 and r.headers["X-Rerank-Head"] == "none", r.text
    finally:
        s.stop()
    assert "Traceback" not in s.log


def test_flags_and_router() -> None:
    from localllm.cli import build_parser

    for flag in ("--rerank", "--reranking"):
        assert build_parser().parse_args(["serve", "m.gguf", flag]).rerank
    assert build_parser().parse_args(["serve", "m.gguf", "--pooling", "rank"]).pooling == "rank"
    assert set(PATHS) <= PROXIED  # the router forwards them, by the body's model, to the child
