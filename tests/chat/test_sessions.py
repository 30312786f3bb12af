"""Saved sessions are checked before use."""

from __future__ import annotations

import json
from pathlib import Path

import pytest


def test_saved_sessions_are_checked(_isolated_home: Path) -> None:
    from localllm.chat import sessions
    from localllm.errors import InputError

    d = _isolated_home / "sessions"
    d.mkdir(parents=True)
    (d / "good.json").write_text(json.dumps({"id": "good", "model": "smollm2", "messages": [{"role": "user", "content": "hello"}]}))
    (d / "no-content.json").write_text(json.dumps({"id": "nc", "model": "smollm2", "messages": [{"role": "user"}]}))
    (d / "list.json").write_text("[]")
    (d / "binary.json").write_bytes(b"\xff\xfe{")
    (d / "bad-messages.json").write_text(json.dumps({"id": "bm", "model": "m", "messages": "hi"}))
    skipped: list[str] = []
    got = sessions.list_sessions(on_skip=lambda p, why: skipped.append(p.name))
    assert [s.id for s in got] == ["good"] and got[0].title == "hello" and got[0].settings == {} and got[0].system_prompt is None
    assert sorted(skipped) == ["bad-messages.json", "binary.json", "list.json", "no-content.json"]
    with pytest.raises(InputError, match="message 1 has no role or no content"):
        sessions.load("no-content")
    with pytest.raises(InputError):
        sessions.load("../registry")
    assert (d / "no-content.json").exists()  # skipped, never deleted


def test_a_kept_kv_cache_is_checked_saved_and_deleted_with_its_session(_isolated_home: Path) -> None:
    from localllm.chat import sessions

    mark = {"text_sha256": "0f" * 32, "cells": 40, "images": ["e1" * 32]}
    s = sessions.SavedSession.new("smollm2", None, {})
    s.kv = mark
    sessions.save(s)
    state = sessions.state_path(s.id)
    assert state == sessions.sessions_dir() / f"{s.id}.state"
    state.write_bytes(b"kept")
    assert sessions.load(s.id).kv == mark
    raw = json.loads((sessions.sessions_dir() / f"{s.id}.json").read_text())
    raw["kv"] = {"text_sha256": "../../x", "cells": 40, "images": []}  # a hand edit: not a mark, so no kept cache
    (sessions.sessions_dir() / f"{s.id}.json").write_text(json.dumps(raw))
    assert sessions.load(s.id).kv is None
    sessions.delete(s.id)
    assert not state.exists() and not (sessions.sessions_dir() / f"{s.id}.json").exists()
