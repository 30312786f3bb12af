"""Text conversations' KV caches are kept and reopened (``chat.resume``), within a
disk budget that drops the oldest state files first (``chat.kept``)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localllm.chat import kept, resume, sessions
from localllm.chat.session import ChatSession
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import UsageError
from localllm.testing import ScriptedEngine
from localllm.util.units import GiB, MiB


def _engine() -> ScriptedEngine:
    e = ScriptedEngine(tokens=3)
    e.load(Path("m.gguf"), LoadConfig(n_ctx=512))
    return e


def _talked(engine: ScriptedEngine) -> ChatSession:
    chat = ChatSession(engine, system_prompt="be brief", sampling=SamplingConfig(max_tokens=3))
    for text in ("hello", "and then?"):
        with chat.send(text) as g:
            list(g)
    return chat


def _state(folder: Path, name: str, size: int, age: float) -> Path:
    p = folder / f"{name}.state"
    p.write_bytes(b"\0" * size)
    t = 1_700_000_000 - age
    os.utime(p, (t, t))
    return p


def test_a_text_conversation_is_kept_and_reopened_without_reading_it_again(tmp_path: Path) -> None:
    engine = _engine()
    chat = _talked(engine)
    state = tmp_path / "chat.state"
    mark = resume.keep(chat, state)
    assert mark is not None and mark["images"] == [] and mark["cells"] == chat.context_used and state.is_file()
    assert resume.mark_of(mark) == mark  # a text conversation's mark survives its session file's check
    messages = list(chat.messages)

    engine.reset()
    other = ChatSession(engine, system_prompt="be brief", sampling=SamplingConfig(max_tokens=3), messages=list(messages))
    assert resume.resume(other, state, mark) is None and engine.context_used == mark["cells"]
    with other.send("more?") as g:
        list(g)
    assert other.turns[-1].stats.prompt_tokens < mark["cells"]  # only the new message was read

    engine.reset()
    edited = [*messages[:-1], {**messages[-1], "content": messages[-1]["content"] + "!"}]
    again = ChatSession(engine, system_prompt="be brief", messages=edited)
    assert resume.resume(again, state, mark) == "it was saved for another text of the conversation"
    state.unlink()
    gone = ChatSession(engine, system_prompt="be brief", messages=list(messages))
    assert resume.resume(gone, state, mark) == "its state file is gone" and engine.context_used == 0


def test_nothing_is_kept_of_a_conversation_that_does_not_end_with_a_reply(tmp_path: Path) -> None:
    engine = _engine()
    chat = ChatSession(engine)
    assert resume.keep(chat, tmp_path / "a.state") is None  # nothing said yet
    chat = _talked(engine)
    chat.messages.append({"role": "user", "content": "unanswered"})
    assert resume.keep(chat, tmp_path / "b.state") is None and not list(tmp_path.iterdir())


def test_a_mark_without_images_is_a_text_conversations() -> None:
    good = {"text_sha256": "ab" * 32, "cells": 12, "images": []}
    assert resume.mark_of(good) == good
    for change in ({"images": None}, {"images": ["cd" * 31]}, {"cells": 0}, {"text_sha256": "x"}):
        assert resume.mark_of({**good, **change}) is None, change


def test_the_oldest_state_files_go_first_and_the_new_one_last(tmp_path: Path) -> None:
    old, mid, new = (_state(tmp_path, n, 40, age) for n, age in (("old", 300), ("mid", 200), ("new", 100)))
    just = _state(tmp_path, "just", 40, 1000)  # the one just written, whatever its time says (a clock set back)
    (tmp_path / ".x.state.tmp-1").write_bytes(b"\0" * 1000)  # another writer's temporary file: not a state file
    (tmp_path / "old.json").write_text("{}")
    assert kept.total(tmp_path) == 160
    assert kept.evict(tmp_path, 100, newest=just) == [old, mid]
    assert sorted(p.name for p in tmp_path.iterdir()) == [".x.state.tmp-1", "just.state", "new.state", "old.json"]  # sessions stay
    assert kept.evict(tmp_path, 100, newest=just) == []  # within the budget: nothing more
    assert kept.evict(tmp_path, 10, newest=just) == [new, just]  # larger than the budget on its own: it goes too
    assert kept.total(tmp_path) == 0 and kept.evict(tmp_path / "none", 0) == []


def test_sessions_keep_kv_drops_the_oldest_state_and_its_session_reopens_reading_again(_isolated_home: Path) -> None:
    engine = _engine()
    first = sessions.SavedSession.new("m.gguf", "be brief", {})
    chat = _talked(engine)
    first.messages = list(chat.messages)
    assert sessions.keep_kv(chat, first) and first.kv is not None
    sessions.save(first)
    size = sessions.state_path(first.id).stat().st_size
    os.utime(sessions.state_path(first.id), (1_700_000_000, 1_700_000_000))
    config = _isolated_home / "config.toml"
    config.parent.mkdir(parents=True, exist_ok=True)
    config.write_text(f'[sessions]\nkv-budget = "{size * 1.5:.0f}B"\n')

    second = sessions.SavedSession.new("m.gguf", "be brief", {})
    second.id = first.id + "-2"
    second.messages = list(chat.messages)
    assert sessions.keep_kv(chat, second)
    assert not sessions.state_path(first.id).exists() and sessions.state_path(second.id).exists()
    reopened = sessions.load(first.id)  # the session stays, still marked: its state is gone
    engine.reset()
    again = ChatSession(engine, system_prompt="be brief", messages=list(reopened.messages))
    assert reopened.kv is not None and resume.resume(again, sessions.state_path(first.id), reopened.kv) == "its state file is gone"

    config.write_text("[sessions]\nkv-budget = 0\n")  # keeps none
    third = sessions.SavedSession.new("m.gguf", "be brief", {})
    assert not sessions.keep_kv(chat, third) and third.kv is None and not sessions.state_path(third.id).exists()


def test_the_budget_is_read_from_the_config_file_and_checked(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    assert kept.budget(config) == 2 * GiB  # no file
    for text, want in (("[sessions]\n", 2 * GiB), ('[sessions]\nkv-budget = "512MiB"\n', 512 * MiB), ("[sessions]\nkv-budget = 3\n", 3 * GiB),
                       ("[sessions]\nkv-budget = 0\n", 0), ("ctx = 10\n", 2 * GiB)):
        config.write_text(text)
        assert kept.budget(config) == want, text
    for text, match in (("[sessions]\nkv-budget = true\n", "give a size"), ('[sessions]\nkv-budget = "lots"\n', "is not a size"),
                        ("[sessions]\nbudget = 1\n", "has no key 'budget'"), ("sessions = 1\n", "must be a table")):
        config.write_text(text)
        with pytest.raises(UsageError, match=match) as err:
            kept.budget(config)
        assert str(config) in str(err.value)
