"""ChatSession.rewind: the last exchange taken back (the cockpit's regenerate
and edit), the KV cache cut back to what came before it instead of read again,
unless a context shift in that turn moved it."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.engine_api.errors import InvalidSetting
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


def test_a_conversation_read_again_past_the_context_keeps_its_newest_tokens(smollm2: Path) -> None:
    """A turn taken back after the window slid (the cockpit's regenerate; bench_compact's
    questions): the conversation read again no longer fits, so, the sliding window being
    on, its oldest tokens are left out as a shift would drop them, instead of the engine
    refusing the turn as longer than the context."""
    from localllm.engine import LlamaCppBackend

    notices: list[str] = []
    with LlamaCppBackend() as engine:
        engine.load(smollm2, LoadConfig(n_ctx=256, n_threads=2))
        chat = ChatSession(engine, system_prompt="You are terse.", sampling=SamplingConfig(temperature=0, max_tokens=24),
                           on_notice=notices.append)
        for i in range(12):
            _say(chat, f"Note {i}: the {['red', 'green', 'blue'][i % 3]} box holds {i * 7} marbles and a small brass key.")
            if chat.turns[-1].stats.context_shifts:
                break
        assert chat.turns[-1].stats.context_shifts  # the last turn slid the window
        assert chat.rewind() is not None
        _say(chat, "How many marbles are in the red box?")
        assert chat.context_used < 256 and chat.turns[-1].reply
        assert notices and "oldest" in notices[-1] and "left out" in notices[-1]
        chat.sliding_window = False
        assert chat.rewind() is not None
        with pytest.raises(InvalidSetting):  # no window: too long, refused as before
            _say(chat, "How many marbles are in the red box?")
