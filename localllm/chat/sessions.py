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
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localllm import paths
from localllm.errors import InputError
from localllm.util import atomic


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
    def new(cls, model: str, system_prompt: str | None, settings: dict[str, Any]) -> SavedSession:
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


def from_dict(data: Any, source: Path) -> SavedSession:
    """A session from its JSON, checked field by field: a missing optional field
    gets its default; a missing id, model or message content, or a value of the
    wrong type, is an ``InputError`` naming the file and the field."""
    if not isinstance(data, dict):
        raise InputError(f"{source}: not a saved session (a JSON {type(data).__name__}, not an object)")
    for key in ("id", "model"):
        if not isinstance(data.get(key), str) or not data.get(key):
            raise InputError(f"{source}: not a saved session (no '{key}')")
    messages = data.get("messages", [])
    if not isinstance(messages, list):
        raise InputError(f"{source}: 'messages' is not a list")
    clean: list[dict[str, str]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str) or not isinstance(m.get("content"), str):
            raise InputError(f"{source}: message {i + 1} has no role or no content")
        clean.append({"role": m["role"], "content": m["content"]})
    try:
        mtime = source.stat().st_mtime
    except OSError:
        mtime = 0.0
    created = data.get("created")
    updated = data.get("updated")
    system = data.get("system_prompt")
    settings = data.get("settings")
    return SavedSession(
        id=data["id"],
        model=data["model"],
        created=float(created) if isinstance(created, (int, float)) and not isinstance(created, bool) else mtime,
        updated=float(updated) if isinstance(updated, (int, float)) and not isinstance(updated, bool) else mtime,
        system_prompt=system if isinstance(system, str) else None,
        messages=clean,
        settings=settings if isinstance(settings, dict) else {},
    )


def _read(path: Path) -> SavedSession:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:  # ValueError covers bad JSON and bad UTF-8
        raise InputError(f"{path}: cannot read the saved session ({exc})") from None
    return from_dict(data, path)


def load(session_id: str) -> SavedSession:
    if not session_id or "/" in session_id or "\\" in session_id or session_id.startswith("."):
        raise InputError(f"no saved session named {session_id!r}")
    path = sessions_dir() / f"{session_id}.json"
    if not path.is_file():
        raise InputError(f"no saved session named {session_id!r} (see {sessions_dir()})")
    return _read(path)


def list_sessions(on_skip: Callable[[Path, str], None] | None = None) -> list[SavedSession]:
    """Every readable saved session, newest first. A file that fails its checks
    is left out (and never deleted); ``on_skip(path, reason)`` hears of it."""
    d = sessions_dir()
    if not d.is_dir():
        return []
    out = []
    for p in d.glob("*.json"):
        try:
            out.append(_read(p))
        except InputError as exc:
            if on_skip is not None:
                on_skip(p, str(exc))
    return sorted(out, key=lambda s: -s.updated)
