"""ChatSession.rewind: the last exchange taken back (the cockpit's regenerate
and edit), the KV cache cut back to what came before it instead of read again,
unless a context shift in that turn moved it."""

from __future__ import annotations

from pathlib import Path

from localllm.chat.session import ChatSession
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.testing import ScriptedEngine


def _chat(n_ctx: int | None = None) -> tuple[ChatSession, ScriptedEngine]:
    engine = ScriptedEngine(ttft_ms=0, itl_ms=0, tokens=3, n_ctx=n_ctx)
    engine.load(Path("scripted.gguf"), LoadConfig(n_ctx=1024))
    return ChatSession(engine, sampling=SamplingConfig(max_tokens=8)), engine


def _say(chat: ChatSession, text: str) -> None:
    reply = chat.send(text)
    list(reply)
    reply.close()


def test_rewind_cuts_the_cache_back_to_before_the_last_exchange() -> None:
    chat, engine = _chat()
    _say(chat, "first question")
    kept, messages = engine.cache_tokens, list(chat.messages)
    _say(chat, "second question")
    assert len(engine.cache_tokens) > len(kept)
    assert chat.rewind() == "second question"
    assert chat.messages == messages and len(chat.turns) == 1
    assert engine.cache_tokens == kept  # cut back, not emptied
    _say(chat, "another second question")
    assert engine.cache_tokens[:len(kept)] == kept  # the next turn extends it


def test_rewind_after_a_shift_reads_the_conversation_again() -> None:
    chat, engine = _chat(n_ctx=18)  # the second turn (22 tokens) shifts; the first and "twelve" (17) fit
    _say(chat, "one two three four five")
    _say(chat, "six seven eight nine ten eleven")
    assert chat.turns[-1].stats.context_shifts  # the second turn shifted the cache
    assert chat.rewind() == "six seven eight nine ten eleven"
    _say(chat, "twelve")
    rendered = engine.tokenize(engine.render_chat([*chat.messages[:-1]]))
    assert engine.cache_tokens[:len(rendered)] == rendered  # read again from the start, not a shifted leftover


def test_rewind_with_nothing_to_take_back() -> None:
    chat, _ = _chat()
    assert chat.rewind() is None
