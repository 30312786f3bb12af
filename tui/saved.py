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
from localllm.engine_api.errors import SettingError
from localllm.errors import LocalLLMError

ROLES = ("system", "user", "assistant", "tool")  # tool: a tool's result (the cockpit with --tools)
TOOL_KEYS = ("tool_call_id", "name")  # a tool result's, kept when they are text


def printable(text: str) -> str:
    """Control characters escaped, so a file name cannot draw on the screen."""
    return "".join(ch if ch.isprintable() else ascii(ch)[1:-1] for ch in text)


# The engine's settings, named as the settings screen labels them (the CLI names
# its flags instead: localllm.commands.advice).
SETTING_LABELS = {
    "n_ctx": "context size", "n_threads": "threads", "kv_type": "the K/V cache type", "n_batch": "the batch size",
    "n_ubatch": "the micro-batch size", "flash_attn": "flash attention", "template": "the template",
    "template_choice": "a chat template", "raw": "a base model's completion mode", "n_cpu_moe": "experts in RAM",
}


def reason(exc: BaseException) -> str:
    """An exception as one line for the chat log: our own errors are worded for
    the user (a setting by its label on the settings screen); anything else is
    named by its type (a bug, not the user's fault)."""
    said = exc.worded(SETTING_LABELS) if isinstance(exc, SettingError) else str(exc)
    text = printable(" ".join(said.split())) or "no message"
    return text if isinstance(exc, LocalLLMError) else f"{type(exc).__name__}: {text}"


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
