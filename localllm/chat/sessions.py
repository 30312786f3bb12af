"""Saved chat sessions: one JSON file each under ``<data dir>/sessions``.

Writes are atomic (``atomic.write_json``: a temporary file, then ``os.replace``),
so a crash or a kill leaves either the old file or the new one, never half of
one. The TUI saves after the user's message and after each finished reply, so
at most the reply in flight is lost.
"""

from __future__ import annotations

import json
import math
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
    name: str | None = None  # the user's name for it; None: titled by its first message

    @classmethod
    def new(cls, model: str, system_prompt: str | None, settings: dict[str, Any]) -> SavedSession:
        now = time.time()
        return cls(time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6], model, now, now, system_prompt, [], settings)

    @property
    def turns(self) -> int:
        """Exchanges: the user's messages (a system prompt is no turn)."""
        return sum(1 for m in self.messages if m["role"] == "user")

    def matches(self, text: str) -> bool:
        """Whether ``text`` occurs (any case) in the name, the model's file name or any message."""
        needle = text.casefold()
        hay = [self.name or "", Path(self.model).name, self.system_prompt or "", *(m["content"] for m in self.messages)]
        return any(needle in h.casefold() for h in hay)

    @property
    def title(self) -> str:
        """The name given, else the first message's first line; past 80 characters, elided with "…"."""
        text = (self.name or "").strip() or next((m["content"] for m in self.messages if m["role"] == "user"), "").strip()
        line = text.splitlines()[0] if text else "(empty)"
        return line if len(line) <= 80 else line[:79] + "…"


def sessions_dir() -> Path:
    return paths.data_dir() / "sessions"


def save(session: SavedSession, *, touch: bool = True) -> Path:
    """Write the session; ``touch`` stamps it as updated now (a rename does not:
    the list stays in the order the chats were had)."""
    d = paths.ensure_dir(sessions_dir())
    if touch:
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
    name = data.get("name")
    return SavedSession(
        id=data["id"],
        model=data["model"],
        created=stamp(created) or mtime,
        updated=stamp(updated) or mtime,
        system_prompt=system if isinstance(system, str) else None,
        messages=clean,
        settings=settings if isinstance(settings, dict) else {},
        name=name if isinstance(name, str) else None,
    )


def stamp(value: Any) -> float:
    """A saved time as seconds since 1970, or 0.0 for anything a clock cannot show
    (a session file is outside data): not a number, NaN, infinite, a 400-digit
    integer (float() overflows), before 1970 or after the year 5000."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return 0.0
    try:
        t = float(value)
    except OverflowError:
        return 0.0
    return t if math.isfinite(t) and 0 <= t < 95_617_584_000 else 0.0


def _read(path: Path) -> SavedSession:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except RecursionError:
        raise InputError(f"{path}: cannot read the saved session (nested too deep)") from None
    except (OSError, ValueError) as exc:  # ValueError covers bad JSON and bad UTF-8
        raise InputError(f"{path}: cannot read the saved session ({exc})") from None
    return from_dict(data, path)


def load(session_id: str) -> SavedSession:
    path = _path(session_id)
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


def delete(session_id: str) -> None:
    """Remove a saved session's file (the user confirmed); gone already is fine."""
    _path(session_id).unlink(missing_ok=True)


def _path(session_id: str) -> Path:
    if not session_id or "/" in session_id or "\\" in session_id or session_id.startswith("."):
        raise InputError(f"no saved session named {session_id!r}")
    return sessions_dir() / f"{session_id}.json"


def exports_dir() -> Path:
    """Where a session is exported unless the user names another place."""
    return paths.data_dir() / "exports"


def export_path(session: SavedSession) -> Path:
    """The default file for ``export``: the title made a file name, and the id (unique)."""
    stem = "".join(ch if ch.isalnum() else "-" for ch in session.title.casefold()).strip("-")
    stem = "-".join(part for part in stem.split("-") if part)[:40] or "chat"
    return exports_dir() / f"{stem}-{session.id}.md"


ROLE_HEADINGS = {"system": "System", "user": "You", "assistant": "Assistant", "tool": "Tool result"}


def to_markdown(session: SavedSession) -> str:
    """The chat as Markdown: a heading per message, its text as it was (Markdown already)."""
    when = time.strftime("%Y-%m-%d %H:%M", time.localtime(session.updated or session.created))
    out = [f"# {session.title}", "", f"- model: {Path(session.model).name}", f"- saved: {when}", f"- turns: {session.turns}", ""]
    for m in session.messages:
        out += [f"## {ROLE_HEADINGS.get(m['role'], m['role'])}", "", m["content"].rstrip(), ""]
    return "\n".join(out)


def export(session: SavedSession, target: Path) -> Path:
    """Write the chat as Markdown to ``target``, a new file: an existing one is
    never replaced (``FileExistsError``). The default folder is made; a folder
    the user named must exist."""
    target = Path(target).expanduser()
    if target.parent == exports_dir():
        paths.ensure_dir(target.parent)
    with open(target, "x", encoding="utf-8") as fh:  # "x": fails if the file exists
        fh.write(to_markdown(session))
    return target
