"""The Engine protocol and its scripted fake (``localllm.testing``): no model,
no llama.cpp. The fake must implement every member of the protocol, and the
code written against the protocol (generations, chat sessions, speculative
decoding, the layering) is checked on it here; the same behaviour on llama.cpp
is tested in test_engine.py, test_chat.py and test_speculative.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.engine_api import Engine, Generation, LoadConfig, SamplingConfig
from localllm.testing import ScriptedEngine


def protocol_members() -> set[str]:
    return {n for n in vars(Engine) if not n.startswith("_") or n in ("__enter__", "__exit__")} - {"__dict__", "__weakref__"}


def loaded(**kw) -> ScriptedEngine:
    e = ScriptedEngine(ttft_ms=0, itl_ms=0, **kw)
    e.load(Path("scripted.gguf"), LoadConfig(n_ctx=256))
    return e


def test_the_fake_implements_every_member_of_the_protocol() -> None:
    members = protocol_members()
    assert {"stream", "extend", "verify", "cache_tokens", "save_state", "use_template"} <= members
    assert sorted(m for m in members if not hasattr(ScriptedEngine, m)) == []


def test_a_generation_has_its_stats_once_it_ends() -> None:
    e = loaded(tokens=10)
    gen = e.stream("hello there", SamplingConfig(max_tokens=-1))
    assert isinstance(gen, Generation) and gen.stats is None
    first = [next(gen) for _ in range(3)]
    assert gen.stats is None  # still running
    gen.close()
    assert gen.ended and gen.stats is not None and gen.stats.generated_tokens == 3
    assert [ev.index for ev in first] == [0, 1, 2]
    # a second generation's stats are its own: the first keeps its numbers
    again = e.stream("hello", SamplingConfig(max_tokens=5))
    assert again.drain().generated_tokens == 5 and gen.stats.generated_tokens == 3


def test_a_failing_generation_still_ends_with_stats() -> None:
    e = loaded(tokens=10, fail_at=4)
    gen = e.stream("x", SamplingConfig())
    with pytest.raises(RuntimeError, match="scripted failure at token 4"):
        for _ in gen:
            pass
    assert gen.stats is not None and gen.stats.generated_tokens == 4


def test_chat_turns_carry_the_generations_stats() -> None:
    e = loaded(tokens=6)
    chat = ChatSession(e, system_prompt="be brief", sampling=SamplingConfig(max_tokens=4))
    gen = chat.send("hi")
    reply = "".join(ev.text for ev in gen)
    assert gen.stats is not None and chat.turns[-1].stats is gen.stats
    assert chat.turns[-1].reply == reply == " tok0 tok1 tok2 tok3"
    assert chat.context_used == e.context_used == len(e.cache_tokens)
    # a reply stopped early is recorded with what it produced
    gen = chat.send("more")
    next(gen)
    gen.close()
    assert chat.turns[-1].stats.generated_tokens == 1 and chat.turns[-1].reply == " tok0"


def test_a_full_context_shifts_keeping_the_system_prompt() -> None:
    e = ScriptedEngine(ttft_ms=0, itl_ms=0, tokens=30)
    e.load(Path("scripted.gguf"), LoadConfig(n_ctx=64))
    chat = ChatSession(e, system_prompt="you are a terse helper", sampling=SamplingConfig(max_tokens=30))
    for i in range(4):
        "".join(ev.text for ev in chat.send(f"question {i}"))
    head = e.cache_tokens[: chat.n_keep]
    assert chat.shifts and all(s.kept <= 64 for s in chat.shifts)
    assert e.tokenize(e.render_chat(chat.messages[:1], add_generation_prompt=False)) == head
    assert chat.context_used <= 64


def test_a_damaged_prompt_cache_is_rebuilt(tmp_path: Path) -> None:
    e = loaded()
    cache = tmp_path / "system.state"
    cache.write_text("garbage")
    notices: list[str] = []
    chat = ChatSession(e, system_prompt="sys", sampling=SamplingConfig(max_tokens=2), prompt_cache=cache, on_notice=notices.append)
    "".join(ev.text for ev in chat.send("hi"))
    assert notices and "not a scripted prompt cache" in notices[0] and "rebuilding" in notices[0]
    assert not chat.prompt_cache_hit and cache.read_text().startswith("scripted")
    chat2 = ChatSession(loaded(), system_prompt="sys", sampling=SamplingConfig(max_tokens=2), prompt_cache=cache)
    "".join(ev.text for ev in chat2.send("hi"))
    assert chat2.prompt_cache_hit


def test_speculative_output_is_the_greedy_output() -> None:
    """The fake's greedy rule is "t + 1": speculative decoding with prompt-lookup
    drafts must emit exactly that sequence, keep the cache consistent and count
    its drafts."""
    from localllm.chat.speculative import PromptLookup, generate

    e = loaded()
    prompt = [10, 11, 12, 13, 14, 10, 11]
    run = generate(e, prompt, PromptLookup(), max_tokens=12, k=4, stop_at_eog=False)
    out = [ev.token_id for ev in run]
    assert out == list(range(12, 24))
    assert e.cache_tokens == prompt + out[:-1]
    assert run.stats is not None and run.stats.generated_tokens == 12
    assert run.spec is not None and 0 < run.spec.accepted <= run.spec.drafted


def test_bench_measures_through_the_protocol() -> None:
    from localllm.measure.bench import run_bench

    e = ScriptedEngine(ttft_ms=5, itl_ms=2, tokens=100)
    e.load(Path("scripted.gguf"), LoadConfig(n_ctx=512))
    rows = run_bench(e, prompt_lengths=[16], gen_tokens=8, reps=2, n_vocab=100, bos=None)
    assert rows[0].gen_tokens == 8 and rows[0].tg_tokens_per_s == pytest.approx(500, rel=0.01)
