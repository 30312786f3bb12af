"""A chat compacted on the scripted engine: the summary asked for with the
model's template and bounded, put where the template takes it, the result
read into the cache, the figures measured, and a failure leaving the
conversation as it was."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.compaction.conversation import NotCompacted, compact
from localllm.compaction.request import ASK, SYSTEM
from localllm.compaction.split import SUMMARY_LABEL
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import UsageError
from localllm.testing import ScriptedEngine


class Strict(ScriptedEngine):
    """A template that refuses some places for a summary, as Gemma's and Mistral's do."""

    def __init__(self, refuse: tuple[str, ...], **kw) -> None:
        super().__init__(**kw)
        self.refuse = refuse

    def render_chat(self, messages, *, add_generation_prompt=True, tools=None, extra=None):
        for i, m in enumerate(messages):
            if "system" in self.refuse and m["role"] == "system" and i > 0:
                raise ValueError("System role only first")
            if "user" in self.refuse and i and m["role"] == "user" and messages[i - 1]["role"] == "user":
                raise ValueError("Conversation roles must alternate user/assistant/user/assistant/...")
        return super().render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools, extra=extra)


def _chat(engine: ScriptedEngine | None = None, system: str | None = "be brief", turns: int = 4) -> tuple[ChatSession, ScriptedEngine]:
    engine = engine or ScriptedEngine(ttft_ms=0, itl_ms=0, tokens=3)
    engine.ttft_ms = engine.itl_ms = 0
    engine.load(Path("scripted.gguf"), LoadConfig(n_ctx=1024))
    chat = ChatSession(engine, system_prompt=system, sampling=SamplingConfig(max_tokens=8))
    for i in range(turns):
        chat.send(f"my locker code is {4810 + i} ok").drain()
    return chat, engine


def _asked(engine: ScriptedEngine) -> list[dict[str, str]]:
    """The summary's request, as the template was given it."""
    return next(c for c in reversed(engine.chats) if len(c) == 2 and c[0]["content"] == SYSTEM and c[1].get("data"))


def test_older_turns_become_one_summary_the_model_writes() -> None:
    chat, engine = _chat()
    engine.replies = [[" they", " swapped", " codes"]]
    kept = chat.messages[-4:]
    result = compact(chat, max_tokens=40)
    assert result is not None
    assert chat.messages == [{"role": "system", "content": "be brief"}, {"role": "system", "content": SUMMARY_LABEL + "they swapped codes"},
                             *kept]
    assert (result.summary, result.summarized, result.kept_turns, result.role) == ("they swapped codes", 4, 2, "system")
    assert result.tokens_after < result.tokens_before and result.seconds >= result.summary_seconds >= 0
    assert "compacted: " in result.line() and "4 messages summarized, the last 2 turns kept" in result.line()
    asked = _asked(engine)
    assert asked[0] == {"role": "system", "content": SYSTEM}
    assert asked[1]["data"] == "transcript" and asked[1]["content"].endswith(ASK)
    assert "User: my locker code is 4810 ok" in asked[1]["content"] and "4813" not in asked[1]["content"]  # only the older turns
    assert engine.sampling is not None and engine.sampling.max_tokens == 40 and engine.sampling.temperature == 0.0  # bounded, greedy


def test_the_compacted_conversation_is_in_the_cache_and_the_next_turn_extends_it() -> None:
    chat, engine = _chat()
    result = compact(chat)
    assert result is not None and engine.context_used == result.tokens_after
    held = engine.cache_tokens
    chat.send("and now?").drain()
    assert engine.cache_tokens[:len(held)] == held  # read once, at the compaction: not again
    assert chat.rewind() == "and now?" and engine.cache_tokens == held


def test_rewind_after_a_compaction_reads_the_conversation_again() -> None:
    chat, engine = _chat()
    compact(chat)
    assert chat.rewind() is not None  # a kept turn: its old place in the cache is gone
    chat.send("again").drain()
    assert chat.messages[-2] == {"role": "user", "content": "again"}


@pytest.mark.parametrize("refuse, role", [(("system",), "user"), (("system", "user"), "system prompt")])
def test_the_summary_goes_where_the_template_takes_it(refuse: tuple[str, ...], role: str) -> None:
    chat, _ = _chat(Strict(refuse, tokens=3))
    result = compact(chat)
    assert result is not None and result.role == role
    if role == "system prompt":
        assert chat.messages[0]["content"].startswith("be brief\n\n" + SUMMARY_LABEL) and chat.prompt_cache is None
        chat.send("more").drain()
        chat.send("more again").drain()
        again = compact(chat)  # the earlier summary is taken out of the system prompt and folded into the new one
        assert again is not None and chat.messages[0]["content"].count(SUMMARY_LABEL) == 1


def test_no_system_prompt_puts_the_summary_first() -> None:
    chat, _ = _chat(system=None)
    assert compact(chat) is not None and chat.messages[0]["role"] == "system" and chat.messages[1]["role"] == "user"


def test_nothing_older_than_the_kept_turns_is_no_compaction() -> None:
    chat, engine = _chat(turns=2)
    used = engine.context_used
    assert compact(chat) is None and engine.context_used == used


def test_an_empty_summary_leaves_the_conversation_as_it_was() -> None:
    chat, engine = _chat()
    before = list(chat.messages)
    engine.replies = [[]]
    with pytest.raises(NotCompacted, match="empty summary: nothing compacted"):
        compact(chat)
    assert chat.messages == before and engine.context_used == 0  # read again at the next turn
    chat.send("still here?").drain()
    assert chat.messages[:-2] == before


def test_a_summary_no_shorter_than_the_turns_is_refused() -> None:
    chat, engine = _chat()
    before = list(chat.messages)
    engine.replies = [[" word"] * 200]
    with pytest.raises(NotCompacted, match=r"with the summary the conversation would take \d+ tokens, not fewer than its \d+: nothing compacted"):
        compact(chat, max_tokens=200)
    assert chat.messages == before


def test_completion_mode_has_no_template_to_ask_with() -> None:
    engine = ScriptedEngine(chat_template=False)
    engine.load(Path("scripted.gguf"), LoadConfig(n_ctx=256))
    with pytest.raises(UsageError, match="needs a chat template"):
        compact(ChatSession(engine, completion=True))


def test_a_transcript_longer_than_the_context_loses_its_oldest_messages() -> None:
    chat, engine = _chat(turns=6)
    engine.n_ctx_override = 90  # the older turns' request takes 71 tokens; 90 - 16 - 12 - 8 leaves 54
    compact(chat, max_tokens=16)
    asked = _asked(engine)[1]["content"]
    assert "4813" in asked and "4810" not in asked  # the newest of the older turns stay
