"""A thinking budget on every route (llama.cpp's ``--reasoning-budget``): after N
tokens of thinking the end-of-thinking marker is forced and the answer follows.

SmolLM2 does not think, so it is served with real thinking templates: DeepSeek
R1's, whose generation prompt opens the thinking (``<think>\\n``), so without a
budget a short reply is all thinking; and Qwen3's, whose generation prompt does
not, held by a grammar to open ``<think>`` itself. The thinking's length is
counted with the server's own tokenizer; greedy, so a budgeted reply's thinking
is the unbudgeted reply's first tokens."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2 as httpx
import pytest

from localllm import runtime
from localllm.engine_api import SamplingConfig
from localllm.plan import fitting
from localllm.plan.hardware import Hardware
from localllm.reasoning.budget import EFFORT_BUDGETS
from localllm.serve import ServeOptions, Server

pytestmark = pytest.mark.slow
GiB = 1024**3
ROOMY = Hardware(None, None, None, "none", 64 * GiB, 64 * GiB)
ROOT = Path(__file__).resolve().parents[1]
R1 = ROOT / "reasoning" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja"
QWEN3 = ROOT / "serve" / "templates" / "Qwen-Qwen3-0.6B.jinja"
ASK = [{"role": "user", "content": "What is two plus two?"}]
H = {"Authorization": "Bearer k"}
QWEN_GRAMMAR = 'root ::= "<think>" [a-z ]{4,200} "</think>" [ \\n]* [A-Za-z ]{4,60}'


def _serve(model: Path, template: Path, budget: int = -1):
    request = runtime.LoadRequest(model=model, options=fitting.LoadOptions(n_ctx=1024, threads=1, n_gpu_layers=0), hardware=ROOMY,
                                  serving=True, parallel=1, template=str(template))
    loaded = runtime.open_model(request)
    server = Server(loaded, ServeOptions(port=0, api_key="k", sampling=SamplingConfig(reasoning_budget=budget)), say=lambda _: None).start()
    return loaded, server


@pytest.fixture(scope="module")
def r1(smollm2: Path) -> Iterator[str]:
    loaded, server = _serve(smollm2, R1)
    with loaded, server:
        yield f"http://127.0.0.1:{server.port}"


def _chat(base: str, **kw) -> dict:
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0, **kw}
    r = httpx.post(f"{base}/v1/chat/completions", headers=H, json=body, timeout=120)
    assert r.status_code == 200, r.text
    return r.json()["choices"][0]["message"]


def _streamed(base: str, **kw) -> tuple[str, str]:
    thinking, content = [], []
    body = {"messages": ASK, "max_tokens": 40, "temperature": 0, "stream": True, **kw}
    with httpx.stream("POST", f"{base}/v1/chat/completions", headers=H, json=body, timeout=120) as r:
        for line in r.iter_lines():
            if line.startswith("data: {"):
                delta = json.loads(line[6:])["choices"][0]["delta"]
                thinking.append(delta.get("reasoning_content") or "")
                content.append(delta.get("content") or "")
    return "".join(thinking), "".join(content)


def _tokens(base: str, text: str) -> int:
    return len(httpx.post(f"{base}/tokenize", headers=H, json={"content": text}).json()["tokens"])


def test_the_end_of_thinking_is_forced_after_n_tokens(r1: str) -> None:
    free = _chat(r1)
    assert free["reasoning_content"] and not free["content"]  # R1's prompt opens the thinking: 40 tokens of it
    for n in (0, 1, 8):
        cut = _chat(r1, reasoning_budget_tokens=n)
        thought = cut.get("reasoning_content") or ""
        # the prompt's "\n" after <think> is the budget's first token (llama.cpp feeds the generation prompt to it)
        assert _tokens(r1, thought) <= max(n - 1, 0), (n, thought)
        assert free["reasoning_content"].startswith(thought)  # greedy: the same thinking, cut
        assert cut["content"], n  # the answer follows the forced </think>
        assert _streamed(r1, reasoning_budget_tokens=n) == (thought, cut["content"])
    assert _chat(r1, thinking_budget_tokens=8) == _chat(r1, reasoning_budget_tokens=8)  # llama-server's other spelling
    assert _chat(r1, reasoning_budget_tokens=-1) == free  # -1: the server's (unlimited here)


def test_every_api_maps_its_own_budget(r1: str) -> None:
    import anthropic
    import ollama
    import openai

    eight = _chat(r1, reasoning_budget_tokens=8)
    msg = anthropic.Anthropic(base_url=r1, api_key="k").messages.create(
        model="smollm2", max_tokens=40, messages=ASK, extra_body={"temperature": 0, "thinking": {"type": "enabled", "budget_tokens": 8}})
    assert [b.type for b in msg.content] == ["thinking", "text"]
    assert msg.content[0].thinking == eight["reasoning_content"] and msg.content[1].text == eight["content"]
    client: Any = openai.OpenAI(base_url=f"{r1}/v1", api_key="k")  # Any: the SDK's overloads do not take a plain list of dicts
    low = _chat(r1, reasoning_budget_tokens=EFFORT_BUDGETS["low"])
    said = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="low").choices[0].message
    assert said.model_extra["reasoning_content"] == low["reasoning_content"] and said.content == low["content"]
    none = client.chat.completions.create(model="smollm2", messages=ASK, max_tokens=40, temperature=0, reasoning_effort="none").choices[0].message
    assert none.content and not none.model_extra.get("reasoning_content")
    resp = client.responses.create(model="smollm2", input=ASK, max_output_tokens=40, temperature=0, reasoning={"effort": "minimal"})
    minimal = _chat(r1, reasoning_budget_tokens=EFFORT_BUDGETS["minimal"])
    assert resp.output_text == minimal["content"]
    lama = ollama.Client(host=r1, headers=H)
    thought = lama.chat(model="smollm2", messages=ASK, think="low", options={"temperature": 0, "num_predict": 40})
    assert thought.message.thinking == low["reasoning_content"] and thought.message.content == low["content"]


def test_a_bad_budget_is_a_400_naming_it(r1: str) -> None:
    for bad in (-2, "8", 1.5, True):
        r = httpx.post(f"{r1}/v1/chat/completions", headers=H, json={"messages": ASK, "max_tokens": 4, "reasoning_budget_tokens": bad})
        assert r.status_code == 400 and "reasoning_budget_tokens" in r.text, bad
    r = httpx.post(f"{r1}/v1/messages", headers=H, json={"model": "m", "messages": ASK, "max_tokens": 4,
                                                        "thinking": {"type": "enabled", "budget_tokens": -5}})
    assert r.status_code == 400 and "budget_tokens" in r.text


def test_the_server_budget_and_a_template_that_does_not_open_the_thinking(smollm2: Path) -> None:
    """Qwen3's generation prompt leaves the thinking to the model: the budget starts at its ``<think>``;
    serve's --reasoning-budget is every request's unless it gives its own."""
    loaded, server = _serve(smollm2, QWEN3, budget=6)
    with loaded, server:
        base = f"http://127.0.0.1:{server.port}"
        cut = _chat(base, grammar=QWEN_GRAMMAR, max_tokens=60)
        free = _chat(base, grammar=QWEN_GRAMMAR, max_tokens=60, reasoning_budget_tokens=100)
        assert _tokens(base, cut["reasoning_content"]) <= 6 < _tokens(base, free["reasoning_content"])
        assert free["reasoning_content"].startswith(cut["reasoning_content"]) and cut["content"]
