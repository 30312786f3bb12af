"""Saved sessions as the cockpit reads them: each file checked before use.

A session file is outside data: an older version, a hand edit or a damaged disk
can leave a message without ``content`` or a list where an object belongs. Such
a file is skipped with a notice naming it and what is wrong; it is never
deleted (it may be the user's only copy) and never ends the app.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localllm.chat import sessions
from localllm.cockpit.wording import printable, reason

ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's result (the cockpit with --tools)
TOOL_KEYS = ("tool_call_id", "name")  # a tool result's, kept when they are text
__all__ = ["SessionError", "check", "printable", "read", "reason", "scan"]  # printable, reason: the core's, named here for the screens


class SessionError(Exception):
    """A saved session that cannot be used, and why (one line)."""


def check(data: Any, name: str) -> sessions.SavedSession:
    """A SavedSession from a file's JSON, or SessionError naming what is wrong.
    Fields the cockpit can do without get a default; messages must be whole."""
    if not isinstance(data, dict):
        raise SessionError(f"{name}: not a JSON object")
    model = data.get("model")
    if not isinstance(model, str) or not model:
        raise SessionError(f"{name}: no model path")
    messages = data.get("messages", [])
    if not isinstance(messages, list):
        raise SessionError(f"{name}: 'messages' is not a list")
    for i, m in enumerate(messages, 1):
        if not isinstance(m, dict) or m.get("role") not in ROLES:
            raise SessionError(f"{name}: message {i} has no valid role")
        if not isinstance(m.get("content"), str):
            raise SessionError(f"{name}: message {i} has no text content")
    settings = data.get("settings")
    system = data.get("system_prompt")
    created = data.get("created")
    updated = data.get("updated")
    called = data.get("name")
    return sessions.SavedSession(
        id=Path(name).stem,
        model=model,
        created=sessions.stamp(created),
        updated=sessions.stamp(updated),
        system_prompt=system if isinstance(system, str) else None,
        messages=[{"role": m["role"], "content": m["content"], **sessions.data_mark(m),
                   **{k: m[k] for k in TOOL_KEYS if m["role"] == "tool" and isinstance(m.get(k), str)}}
                  for m in messages],
        settings=settings if isinstance(settings, dict) else {},
        name=called if isinstance(called, str) else None,
        images=sessions.image_refs(data.get("images")),
    )


MAX_SESSION_BYTES = 256 * 1024 * 1024  # a chat of a million-token context is a few MB


def read(path: Path) -> sessions.SavedSession:
    try:
        if path.stat().st_size > MAX_SESSION_BYTES:
            raise SessionError(f"{path.name}: larger than {MAX_SESSION_BYTES // (1024 * 1024)} MiB: not a saved session")
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError) as exc:
        raise SessionError(f"{path.name}: unreadable ({exc.__class__.__name__})") from None
    except RecursionError:
        raise SessionError(f"{path.name}: nested too deep to be a saved session") from None
    except ValueError as exc:
        raise SessionError(f"{path.name}: not valid JSON ({exc})") from None
    return check(data, path.name)


def scan() -> tuple[list[sessions.SavedSession], list[str]]:
    """Every usable saved session, newest first, and one notice per skipped file."""
    d = sessions.sessions_dir()
    good: list[sessions.SavedSession] = []
    skipped: list[str] = []
    if d.is_dir():
        for p in sorted(d.glob("*.json")):
            try:
                good.append(read(p))
            except SessionError as exc:
                skipped.append(printable(str(exc)))
            except Exception as exc:  # noqa: BLE001 - one bad file must never hide the others (the worker would die)
                skipped.append(printable(f"{p.name}: cannot be read ({type(exc).__name__})"))
    return sorted(good, key=lambda s: -s.updated), skipped
