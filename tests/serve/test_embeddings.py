"""``/v1/embeddings`` (issue 25, item 4): OpenAI's shape through the ``openai``
client, pooled as the model declares or, for a chat model, mean pooling (said
in the response), L2-normalized, batched, from the process that serves chat;
vectors checked against llama-cpp-python's own ``Llama.embed``."""

from __future__ import annotations

import base64
import os
import struct
import sys
from pathlib import Path

import numpy as np
import pytest

from localllm.engine_api import LoadConfig
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.server import http_client, openai_client, smollm2_server

TEXTS = ["Hello world", "The sky is blue today because of Rayleigh scattering.", "<|im_end|><|im_start|>system x", "Bonjour"]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    s = smollm2_server(tmp_path_factory, "--parallel", "2", "--ctx", "256", "--threads", "1")
    yield s
    s.stop()


def _reference(path: Path, texts: list[str], pooling: int) -> np.ndarray:
    """llama-cpp-python's embedding path (its own context, tokenizer and pooling; normalized), flash attention as serve resolves it."""
    import llama_cpp

    llm = llama_cpp.Llama(model_path=str(path), embedding=True, pooling_type=pooling, n_ctx=256, n_threads=1, flash_attn=True, verbose=False)
    try:
        return np.array([llm.embed(t) for t in texts])
    finally:
        llm.close()


def _cos(a, b) -> float:
    a, b = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    return float(a @ b / np.linalg.norm(a) / np.linalg.norm(b))


@pytest.mark.slow
def test_openai_client_embeddings_match_llama_cpp(server, smollm2) -> None:
    import llama_cpp

    r = openai_client(server).embeddings.create(model="smollm2", input=TEXTS)  # the client asks for base64
    assert [d.index for d in r.data] == [0, 1, 2, 3] and r.model_extra["pooling"] == "mean"
    ref = _reference(smollm2, TEXTS, llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    for d, want in zip(r.data, ref):
        assert len(d.embedding) == 576 and abs(np.linalg.norm(d.embedding) - 1) < 1e-5
        assert _cos(d.embedding, want) >= 0.999
    assert _cos(r.data[0].embedding, r.data[1].embedding) < 0.99  # different texts, different vectors
    with http_client(server) as c:
        toks = c.post("/v1/embeddings", json={"input": TEXTS[1]}).json()["usage"]["prompt_tokens"]
    assert r.usage.prompt_tokens > toks > 5


@pytest.mark.slow
def test_float_base64_token_ids_and_batching_agree(server) -> None:
    with http_client(server) as c:
        one = [c.post("/v1/embeddings", json={"input": t, "encoding_format": "float"}).json()["data"][0]["embedding"] for t in TEXTS]
        batch = c.post("/v1/embeddings", json={"input": TEXTS, "encoding_format": "base64"}).json()
        b64 = [struct.unpack(f"<{len(one[0])}f", base64.b64decode(d["embedding"])) for d in batch["data"]]
        ids = c.post("/v1/embeddings", json={"input": [[504, 3458, 282], [28, 29]]}).json()
        ids_one = c.post("/v1/embeddings", json={"input": [504, 3458, 282]}).json()
    # in one batch or alone, each input pools only its own tokens
    assert all(_cos(a, b) > 0.9999 for a, b in zip(one, b64))
    assert ids["usage"]["prompt_tokens"] == 5 and _cos(ids["data"][0]["embedding"], ids_one["data"][0]["embedding"]) > 0.9999


@pytest.mark.slow
def test_bad_inputs_are_400s_naming_the_cause(server) -> None:
    with http_client(server) as c:
        for body, field, words in (
            ({"input": ["short", "word " * 400]}, "input", "input[1] is 40"),
            ({"input": "hi", "dimensions": 64}, "dimensions", "576"),
            ({"input": ""}, "input", "[0] is empty"),
            ({"input": []}, "input", "must be"),
            ({"input": [[1, 10**9]]}, "input", "outside the vocabulary"),
            ({"input": [3.5]}, "input", "[0] must be"),
            ({"input": "hi", "encoding_format": "int8"}, "encoding_format", "float or base64"),
            ({"input": "hi", "embd_normalize": 1}, "embd_normalize", "only be 2"),
        ):
            r = c.post("/v1/embeddings", json=body)
            err = r.json()["error"]
            assert r.status_code == 400 and err["param"] == field and words in err["message"], (body, err)
        ok = c.post("/v1/embeddings", json={"input": "hi", "dimensions": 576, "user": "u", "vendor_extra": 1})
        assert ok.status_code == 200 and ok.headers["X-Ignored-Fields"] == "vendor_extra"


@pytest.mark.slow
def test_llama_servers_input_forms_embed_as_their_text(server) -> None:
    """llama-server's forms (its test_embedding.py): strings among token ids, in one
    prompt or several; ``prompt_string`` and ``content`` text parts objects; each
    embeds as the same text written as a string does."""
    with http_client(server) as c:
        def vectors(value: object) -> list[list[float]]:
            r = c.post("/v1/embeddings", json={"input": value})
            assert r.status_code == 200, (value, r.text)
            return [d["embedding"] for d in r.json()["data"]]

        ids = c.post("/tokenize", json={"content": "Hello world", "add_special": True}).json()["tokens"]
        world = c.post("/tokenize", json={"content": " world"}).json()["tokens"]
        string = vectors("Hello world")[0]
        assert _cos(vectors(["Hello", *world])[0], vectors(ids)[0]) > 0.9999  # a leading string gets the model's specials
        assert len(vectors([12, 34, "string", 56, 78])) == 1 and len(vectors([[12, 34, 56], [12, "string", 34, 56]])) == 2
        assert _cos(vectors({"prompt_string": "Hello world"})[0], string) > 0.9999
        parts = vectors(["Hello world", {"content": [{"type": "text", "text": "Hello "}, {"type": "text", "text": "world"}]}])
        assert _cos(parts[0], parts[1]) > 0.9999
        assert len(vectors(["a", {"prompt_string": "b"}, {"content": [{"type": "text", "text": "c"}]}])) == 3
        for bad in ({"content": "string"}, {"content": [{"type": "unknown"}]},
                    {"content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}]}):
            r = c.post("/v1/embeddings", json={"input": bad})
            assert r.status_code == 400 and r.json()["error"]["param"] == "input", (bad, r.text)


@pytest.mark.slow
def test_fuzzed_bodies_get_200_or_400(server) -> None:
    import json
    import random

    rng = random.Random(25)
    values: list[object] = [None, True, 0, -1, 576, 2**70, 1.5, "", "x", "float", "base64", [], [""], [1, 2], [[1], "a"], [[]], [[-1]], {"a": 1}, ["ok"] * 3000]
    with http_client(server) as c:
        for _ in range(120):
            body = {k: rng.choice(values) for k in rng.sample(["input", "encoding_format", "dimensions", "embd_normalize", "model", "user"], 3)}
            r = c.post("/v1/embeddings", content=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
            assert r.status_code in (200, 400), (body, r.status_code, r.text[:300])
            assert r.status_code == 200 or set(r.json()["error"]) == {"message", "type", "param", "code"}
        assert c.post("/v1/embeddings", json={"input": "still here"}).status_code == 200


@pytest.mark.slow
def test_chat_is_unchanged_beside_embeddings(server) -> None:
    import threading

    body = {"prompt": "The capital of France is", "max_tokens": 12, "temperature": 0, "ignore_eos": True}  # each step waits on a batch of embeddings
    with http_client(server) as c:
        before = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
        stop = threading.Event()

        def embed() -> None:
            with http_client(server) as c2:
                while not stop.is_set():
                    assert c2.post("/v1/embeddings", json={"input": TEXTS}).status_code == 200

        t = threading.Thread(target=embed)
        t.start()
        try:
            during = c.post("/v1/completions", json={**body, "cache_prompt": False}).json()["choices"][0]["text"]
        finally:
            stop.set()
            t.join()
        after = c.post("/v1/completions", json=body).json()["choices"][0]["text"]
    assert before == during == after


@pytest.mark.slow
def test_pooling_as_declared_and_overridden(tmp_path: Path) -> None:
    """A GGUF that declares last-token pooling gets it; --pooling cls overrides; both match llama-cpp-python's."""
    import llama_cpp

    from localllm.engine.batch import BatchModel

    path = write_llama_gguf(tmp_path / "last.gguf", SynthSpec(pooling_type=3))
    texts = ["abc def", "hello there friend"]
    for asked, want, code in ((None, "last", llama_cpp.LLAMA_POOLING_TYPE_LAST), ("cls", "cls", llama_cpp.LLAMA_POOLING_TYPE_CLS)):
        m = BatchModel()
        try:
            m.load(path, LoadConfig(n_ctx=256, n_threads=1), 1)
            emb = m.embedder(256, asked)
            got = emb.embed([m.tok.tokenize(t, add_special=True) for t in texts])
        finally:
            m.close()
        assert emb.pooling == want
        ref = _reference(path, texts, code)
        assert all(_cos(a, b) >= 0.999 for a, b in zip(got, ref)), want


@pytest.mark.slow
def test_batched_inputs_share_one_decode(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Several inputs go into one llama_decode, each its own sequence, while they fit the batch."""
    from localllm.engine import embed as embed_module
    from localllm.engine.batch import BatchModel

    m = BatchModel()
    try:
        m.load(smollm2, LoadConfig(n_ctx=256, n_threads=1), 1)
        emb = m.embedder(256, None)
        calls = []
        real = embed_module.llama_cpp.llama_decode

        def counting(ctx, batch):
            calls.append(batch.n_tokens)
            return real(ctx, batch)

        toks = [m.tok.tokenize(t) for t in TEXTS]
        emb.open()  # its probe's two decodes are not counted
        monkeypatch.setattr(embed_module.llama_cpp, "llama_decode", counting)
        emb.embed(toks)
        emb.embed(toks * 20)  # 80 inputs: 16 sequences a decode at most
        monkeypatch.undo()
    finally:
        m.close()
    n = sum(map(len, toks))
    assert calls[0] == n and len(calls) == 1 + 5 and sum(calls[1:]) == 20 * n


@pytest.mark.slow
@pytest.mark.parametrize("which", ["smollm2", "gemma"])
def test_the_lm_head_is_skipped_and_the_vectors_stay_llama_cpps(which: str, request: pytest.FixtureRequest) -> None:
    """Every decode ends before the vocabulary projection (SmolLM2's is 49,152 rows,
    Gemma 3's 262,144), and the vectors are still those of llama.cpp's own mean pooling."""
    import llama_cpp

    from localllm.engine.batch import BatchModel

    path = request.getfixturevalue(which)
    m = BatchModel()
    try:
        m.load(path, LoadConfig(n_ctx=256, n_threads=1), 1)
        emb = m.embedder(256, None)
        got = emb.embed([m.tok.tokenize(t, add_special=True) for t in TEXTS[:2]])
        got += emb.embed([m.tok.tokenize(TEXTS[3], add_special=True)])
    finally:
        m.close()
    assert emb.lm_head_skipped and emb.graphs_ended == 1 + 2  # the probe's ended decode, then each of ours
    ref = _reference(path, [*TEXTS[:2], TEXTS[3]], llama_cpp.LLAMA_POOLING_TYPE_MEAN)
    assert all(_cos(a, b) >= 0.999 for a, b in zip(got, ref))


def _opened_then_embedded(path: Path, on_cpu: bool = True):
    """(embedder, nodes its callback was asked for once it had opened, the vectors of
    TEXTS[:2], llama-cpp-python's mean-pooled vectors of the same texts)."""
    import llama_cpp

    from localllm.engine.batch import BatchModel

    m = BatchModel()
    try:
        m.load(path, LoadConfig(n_ctx=256, n_threads=1), 1)
        m._on_cpu = on_cpu  # False: what a load with layers on a GPU or an RPC worker sets
        emb = m.embedder(256, None)
        emb.open()
        asked = emb.nodes_asked
        got = emb.embed([m.tok.tokenize(t, add_special=True) for t in TEXTS[:2]])
    finally:
        m.close()
    return emb, asked, got, _reference(path, TEXTS[:2], llama_cpp.LLAMA_POOLING_TYPE_MEAN)


@pytest.mark.slow
def test_a_probe_that_disagrees_keeps_the_whole_graph(smollm2: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Ended at a node of the first layer, the probe's vectors differ from the whole
    graph's: the context is made again without the callback, and the vectors are right."""
    from localllm.engine import embed as embed_module

    monkeypatch.setattr(embed_module, "STOP_AT", b"attn_norm-0")
    emb, asked, got, ref = _opened_then_embedded(smollm2)
    assert not emb.lm_head_skipped and emb.graphs_ended == 1  # the probe's only
    assert emb.nodes_asked == asked  # the context made again has no callback
    assert all(_cos(a, b) >= 0.999 for a, b in zip(got, ref))


@pytest.mark.slow
def test_no_callback_where_nothing_follows_the_hidden_states_or_off_the_cpu(tmp_path: Path) -> None:
    """llama-embed's graph ends at the hidden states (no lm_head to skip), and a model
    on other devices would pay the callback per node against a fast batch: both
    compute the whole graph with no callback, and still give llama.cpp's vectors."""
    embed_arch = write_llama_gguf(tmp_path / "embed.gguf", SynthSpec(arch="llama-embed"))
    plain = write_llama_gguf(tmp_path / "plain.gguf", SynthSpec())
    for path, on_cpu in ((embed_arch, True), (plain, False)):
        emb, asked, got, ref = _opened_then_embedded(path, on_cpu)
        assert not emb.lm_head_skipped and emb.nodes_asked == asked, path.name
        assert all(_cos(a, b) >= 0.999 for a, b in zip(got, ref)), path.name


@pytest.mark.slow
def test_embeddings_flag_makes_the_context_at_start(smollm2: Path) -> None:
    """serve --embeddings (llama-server's flag) makes the embedding context as the
    server starts; without it, the first request makes it."""
    from localllm.engine.batch import BatchModel
    from localllm.serve.wiring import embeddings

    for at_start in (False, True):
        m = BatchModel()
        try:
            m.load(smollm2, LoadConfig(n_ctx=256, n_threads=1), 1)
            embeddings(m, 256, None, lambda fn: fn(), at_start=at_start)
            assert m.embedder(256, None).is_open is at_start
        finally:
            m.close()


def _voluntary_switches(pid: int) -> int:
    """Times the threads of ``pid`` have gone to sleep (``voluntary_ctxt_switches`` in /proc)."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                total += int(f.read().split("voluntary_ctxt_switches:")[1].split()[0])
        except FileNotFoundError:  # a thread that has just ended
            pass
    return total


@pytest.mark.slow
@pytest.mark.all_cpus
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads the threads' context switches from /proc")
def test_embeddings_leave_chat_decode_spinning(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Every decode of serve runs on its engine thread (serve/scheduler.py's docstring).
    With --threads at the CPUs the process may use, embeddings decoded in a worker
    thread gave libgomp a second team, and then chat decode slept at every op's
    barrier while that thread lived (an agent's embed-then-chat kept it alive).
    Here, one client: 565-730 voluntary context switches a generated token after an
    embeddings request, against 1.3-3.4 (8 clients on 2 threads, an embeddings
    request before each level: 40-56 against 0.3-0.5, at 0.76x the rate)."""
    cpus = len(os.sched_getaffinity(0))
    if cpus < 2:
        pytest.skip("one CPU: llama.cpp starts no OpenMP team")
    s = smollm2_server(tmp_path_factory, "--parallel", "1", "--ctx", "256", "--threads", str(cpus))
    try:
        with open(f"/proc/{s.proc.pid}/maps") as f:
            if "libgomp" not in f.read():
                pytest.skip("this llama.cpp build does not use OpenMP")
        with http_client(s) as c:
            def per_token(seed: int) -> float:
                before = _voluntary_switches(s.proc.pid)
                r = c.post("/v1/completions", json={"prompt": f"Story {seed}: once upon a time", "max_tokens": 16, "temperature": 0,
                                                    "ignore_eos": True})
                r.raise_for_status()
                return (_voluntary_switches(s.proc.pid) - before) / r.json()["usage"]["completion_tokens"]

            quiet = [per_token(0)]  # 16 tokens: the two cases differ 100-fold a token
            after = []
            for i in range(2):
                c.post("/v1/embeddings", json={"input": ["hello world", "bonjour"]}).raise_for_status()
                after.append(per_token(10 + i))
        assert max(quiet) < 20 and max(after) < 20, (quiet, after)  # a token's few wake-ups, not one per op
    finally:
        s.stop()
