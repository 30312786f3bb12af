"""Draftless speculation in serve's scheduler: each slot drafts from its prompt and
reply, a step verifies the drafts in the batch's rows, and the reply is the one
without speculation; llama-server's ``timings.draft_n``/``draft_n_accepted`` and
its ``/metrics`` speculative counters report it. On SmolLM2, served in-process."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.engine_api import SamplingConfig
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.serve import ServeOptions, Server
from localllm.speculation import rows

pytestmark = pytest.mark.slow
GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
H = {"Authorization": "Bearer k"}
TEXT = "The keeper climbed the ninety steps every evening to light the lamp, and wrote the weather in his log. " * 3
ASK = [{"role": "user", "content": f"Repeat this text exactly:\n\n{TEXT}"}]


def _server(model: Path, mode: str, parallel: int):
    request = runtime.LoadRequest(model=model, options=fitting.LoadOptions(n_ctx=1024 * parallel, threads=1, n_gpu_layers=0,
                                                                           flash_attn="off", type_k="f32", type_v="f32"),
                                  hardware=ROOMY, serving=True, parallel=parallel,
                                  n_outputs=parallel * (rows(mode, serving=True) or 1) if mode != "none" else None)
    loaded = runtime.open_model(request)
    return loaded, Server(loaded, ServeOptions(port=0, api_key="k", metrics=True, sampling=SamplingConfig(speculate=mode)),
                          say=lambda _: None).start()


@pytest.fixture(scope="module")
def pair(smollm2: Path) -> Iterator[tuple[str, str]]:
    a_loaded, a = _server(smollm2, "none", 2)
    b_loaded, b = _server(smollm2, "lookup", 2)
    with a_loaded, a, b_loaded, b:
        yield f"http://127.0.0.1:{a.port}", f"http://127.0.0.1:{b.port}"


def _chat(base: str, **kw) -> dict:
    r = httpx.post(f"{base}/v1/chat/completions", headers=H, json={"messages": ASK, "max_tokens": 40, "temperature": 0, **kw}, timeout=300)
    assert r.status_code == 200, r.text
    return r.json()


def test_a_reply_is_the_one_without_speculation_and_its_timings_count_the_drafts(pair: tuple[str, str]) -> None:
    plain, sped = (_chat(base) for base in pair)
    assert sped["choices"][0]["message"]["content"] == plain["choices"][0]["message"]["content"]
    assert "draft_n" not in plain["timings"]
    t = sped["timings"]
    assert t["draft_n"] > 0 and 0 < t["draft_n_accepted"] <= t["draft_n"] and t["predicted_n"] == plain["timings"]["predicted_n"]
    streamed: list[str] = []
    with httpx.stream("POST", f"{pair[1]}/v1/chat/completions", headers=H, timeout=300,
                      json={"messages": ASK, "max_tokens": 40, "temperature": 0, "stream": True}) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                streamed.extend(c["delta"].get("content") or "" for c in json.loads(line[6:])["choices"])
    assert "".join(streamed) == plain["choices"][0]["message"]["content"]
    metrics = httpx.get(f"{pair[1]}/metrics", headers=H).text
    counts = {line.split()[0]: float(line.split()[1]) for line in metrics.splitlines() if line.startswith("llamacpp:spec_decode")}
    assert counts["llamacpp:spec_decode_num_draft_tokens_total"] >= t["draft_n"] and counts["llamacpp:spec_decode_num_drafts_total"] >= 1


def test_two_requests_at_once_each_draft_in_their_own_rows(pair: tuple[str, str]) -> None:
    """Each slot's drafts come from its own text and go back to it alone. (Two sequences in one
    batch round differently from one alone, with or without drafts, so only the start is compared.)"""
    import concurrent.futures

    plain = _chat(pair[0])["choices"][0]["message"]["content"]
    other = [{"role": "user", "content": "Count from one to twenty in words."}]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        a = pool.submit(_chat, pair[1])
        b = pool.submit(_chat, pair[1], messages=other)
        first, second = a.result(), b.result()
    said = first["choices"][0]["message"]["content"]
    assert said[:20] == plain[:20] and first["timings"]["draft_n_accepted"] > 0
    assert "keeper" not in second["choices"][0]["message"]["content"] and "draft_n" in second["timings"]
