"""Saved chat sessions: one JSON file each under ``<data dir>/sessions``.

Writes are atomic (``atomic.write_json``: a temporary file, then ``os.replace``),
so a crash or a kill leaves either the old file or the new one, never half of
one. The TUI saves after the user's message and after each finished reply, so
at most the reply in flight is lost.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localllm import atomic, paths


@dataclass
class SavedSession:
    id: str
    model: str
    created: float
    updated: float
    system_prompt: str | None
    messages: list[dict[str, str]] = field(default_factory=list)
    settings: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def new(cls, model: str, system_prompt: str | None, settings: dict[str, Any]) -> "SavedSession":
        now = time.time()
        return cls(time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6], model, now, now, system_prompt, [], settings)

    @property
    def title(self) -> str:
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "(empty)")
        return first.strip().splitlines()[0][:60] if first.strip() else "(empty)"


def sessions_dir() -> Path:
    return paths.data_dir() / "sessions"


def save(session: SavedSession) -> Path:
    d = paths.ensure_dir(sessions_dir())
    session.updated = time.time()
    target = d / f"{session.id}.json"
    atomic.write_json(target, asdict(session))
    return target


def load(session_id: str) -> SavedSession:
    data = json.loads((sessions_dir() / f"{session_id}.json").read_text(encoding="utf-8"))
    return SavedSession(**data)


def list_sessions() -> list[SavedSession]:
    d = sessions_dir()
    if not d.is_dir():
        return []
    out = []
    for p in d.glob("*.json"):
        try:
            out.append(SavedSession(**json.loads(p.read_text(encoding="utf-8"))))
        except (OSError, ValueError, TypeError):
            continue  # a file we cannot read is not offered, and never deleted
    return sorted(out, key=lambda s: -s.updated)
