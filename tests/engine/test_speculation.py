"""Draftless speculation in the engine's generation loop, on the real SmolLM2:
the reply is the one without speculation token for token, for greedy and for a
seeded sampler, and the cache is left as without it.

A drafted token is kept only where the model's sample at its position is that
token, so the tokens are the same wherever a batch of rows gives the same logits
as one row at a time. llama.cpp's CPU kernels round a batch differently from
one-token decodes (SmolLM2 Q4_1 here, measured: a batch's first row up to 0.2
apart in a logit with an f16 cache, exact with an f32 cache and flash attention
off; its later rows up to 0.8 apart), so a seeded sample, or far into a reply a
greedy near-tie, can go the other way, as in llama.cpp's own speculative
decoding. Here a greedy reply short enough for none to; that every sampler
draws each position once and in order is tests/speculation/test_verify.py's."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.engine import LlamaCppBackend
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.speculation import rows

pytestmark = pytest.mark.slow
CODE = Path(__file__).resolve().parents[2] / "localllm" / "speculation" / "control.py"


@pytest.fixture(scope="module")
def engine(smollm2: Path):
    with LlamaCppBackend() as b:
        # f32 cache, no flash attention: a batch's first row is then one-token decoding's row exactly
        b.load(smollm2, LoadConfig(n_ctx=2048, n_outputs_max=rows("auto") or 1, n_threads=2, flash_attn="off", type_k="f32", type_v="f32"))
        yield b


def _prompt() -> str:
    return "Repeat this code exactly, then say done.\n\n" + CODE.read_text()[:400]


def _runs(engine: LlamaCppBackend, sampling: SamplingConfig, modes=("none", "lookup", "auto"), prompt: str | None = None):
    from dataclasses import replace

    out = {}
    for mode in modes:
        gen = engine.stream(prompt or _prompt(), replace(sampling, speculate=mode))
        out[mode] = ([e.token_id for e in gen], engine.cache_tokens, gen.spec)
    return out


def test_a_greedy_reply_is_the_one_without_speculation(engine: LlamaCppBackend) -> None:
    """Token for token, or else only at a near-tie: where the plain reply's two likeliest
    tokens are closer than the batch/one-token rounding measured here (under 1 logit)."""
    runs = _runs(engine, SamplingConfig(temperature=0, max_tokens=40))
    plain = runs["none"][0]
    assert len(plain) == 40
    spec = runs["lookup"][2]
    assert runs["none"][2] is None and spec is not None and spec.drafted > 0 and spec.accepted > 0
    prompt = engine.prompt_tokens(_prompt(), chat=True)
    for mode in ("lookup", "auto"):
        sped = runs[mode][0]
        k = next((i for i, (x, y) in enumerate(zip(plain, sped)) if x != y), None)
        if k is None:
            assert runs[mode][1] == runs["none"][1]  # no kept draft beyond what the plain loop evaluates
            continue
        row = engine.logits(prompt + plain[:k], first=len(prompt) + k - 1)[-1]  # the row that picks token k
        second, first = sorted(row)[-2:]
        assert first - second < 1.0, (mode, k, first - second)


def test_an_end_of_generation_token_inside_a_draft_ends_the_reply_there(engine: LlamaCppBackend) -> None:
    """The earlier answer, with its end-of-turn token, is in the prompt: the draft after "Paris" carries it."""
    ask = [{"role": "user", "content": "What is the capital of France? One word."}, {"role": "assistant", "content": "Paris"},
           {"role": "user", "content": "What is the capital of France? One word."}]
    prompt = engine.tokenize(engine.render_chat(ask), add_special=False, parse_special=True)
    plain = engine.stream(prompt, SamplingConfig(temperature=0, max_tokens=40, speculate="none"))
    said, kept = [e.token_id for e in plain], engine.cache_tokens
    sped = engine.stream(prompt, SamplingConfig(temperature=0, max_tokens=40, speculate="lookup"))
    assert [e.token_id for e in sped] == said and engine.cache_tokens == kept
    assert plain.stats.stop_reason == sped.stats.stop_reason == "stop" and sped.spec is not None and sped.spec.accepted >= 1


def test_a_context_without_draft_rows_does_not_speculate(smollm2: Path) -> None:
    with LlamaCppBackend() as b:
        b.load(smollm2, LoadConfig(n_ctx=512, n_threads=2))
        gen = b.stream("Say hi", SamplingConfig(temperature=0, max_tokens=8, speculate="lookup"))
        gen.drain()
        assert gen.spec is None


def test_a_request_asked_again_drafts_the_reply_given_before(engine: LlamaCppBackend) -> None:
    """The engine remembers its replies by the prompt's end they followed (speculation.history):
    the same request again drafts the earlier reply from its first tokens, while auto is still cold."""
    from localllm.speculation.history import FIRST

    sampling = SamplingConfig(temperature=0, max_tokens=24, speculate="auto")
    first = engine.stream("Write one sentence about the sea.", sampling)
    first.drain()
    again = engine.stream("Write one sentence about the sea.", sampling)
    again.drain()
    assert first.spec is not None and again.spec is not None
    assert again.spec.drafted >= FIRST > first.spec.drafted and again.spec.accepted >= 1, (first.spec, again.spec)
