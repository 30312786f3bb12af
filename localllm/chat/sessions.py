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
from typing import TYPE_CHECKING, Any

from localllm import paths
from localllm.chat import kept, resume
from localllm.errors import InputError
from localllm.util import atomic
from localllm.vision.marker import MARKER

if TYPE_CHECKING:
    from localllm.chat.session import ChatSession


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
    # the conversation's images (a vision model), in the order of their markers in the messages: where each was
    # read from and the sha256 of its pixels (``image_refs``), never the pixels; reopened, each is read again and checked.
    # A sound file the chat heard is one too (``"kind": "audio"``: the sha256 of its file, its length in seconds)
    images: list[dict[str, Any]] = field(default_factory=list)
    # the KV cache kept beside the file (``<id>.state``, ``chat.resume``): the sha256 of the text it stands for, its cells
    kv: dict[str, Any] | None = None

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
        first = next((m["content"] for m in self.messages if m["role"] == "user"), "")
        text = (self.name or "").strip() or first.replace(MARKER + "\n", "").replace(MARKER, "").strip()
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
        clean.append({"role": m["role"], "content": m["content"], **data_mark(m)})
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
        images=image_refs(data.get("images")),
        kv=resume.mark_of(data.get("kv")),
    )


def data_mark(message: dict[str, Any]) -> dict[str, str]:
    """A user's message that holds attached files keeps its ``"data"`` mark (the
    chat session reads its text as data, ``localllm.attach``): ``{}`` otherwise."""
    mark = message.get("data")
    return {"data": mark} if message.get("role") == "user" and isinstance(mark, str) and mark else {}


_IMAGE_TEXT = ("name", "path", "sha256")
_IMAGE_INTS = ("width", "height", "bytes")


def image_refs(value: Any) -> list[dict[str, Any]]:
    """A saved session's ``images``, each entry checked (outside data): text
    name, path and a 64-digit hex sha256, whole-number sizes (a sound file's,
    ``"kind": "audio"``: its bytes and a length in seconds). A malformed entry
    is kept as a name only (and its kind), so the markers still pair with their
    media in order; reopening it says that one cannot be read back."""
    if not isinstance(value, list):
        return []
    out: list[dict[str, Any]] = []
    for entry in value:
        e = entry if isinstance(entry, dict) else {}
        ok = all(isinstance(e.get(k), str) for k in _IMAGE_TEXT) and all(type(e.get(k)) is int and e[k] >= 0 for k in _IMAGE_INTS)
        sha = e.get("sha256")
        ok = ok and isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)
        if e.get("kind") == "audio":
            secs = e.get("seconds")
            ok = (all(isinstance(e.get(k), str) for k in _IMAGE_TEXT) and type(e.get("bytes")) is int and e["bytes"] >= 0
                  and isinstance(secs, (int, float)) and not isinstance(secs, bool) and 0 <= secs < 1e6 and _hex64(e.get("sha256")))
            name = e.get("name") if isinstance(e.get("name"), str) else "audio"
            out.append({"kind": "audio", **{k: e[k] for k in (*_IMAGE_TEXT, "seconds", "bytes")}} if ok else {"kind": "audio", "name": name})
            continue
        name = e.get("name") if isinstance(e.get("name"), str) else "image"
        out.append({k: e[k] for k in (*_IMAGE_TEXT, *_IMAGE_INTS)} if ok else {"name": name})
    return out


def _hex64(sha: Any) -> bool:
    return isinstance(sha, str) and len(sha) == 64 and all(c in "0123456789abcdef" for c in sha)


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
    """Remove a saved session's file and its kept KV cache (the user confirmed); gone already is fine."""
    _path(session_id).unlink(missing_ok=True)
    state_path(session_id).unlink(missing_ok=True)


def state_path(session_id: str) -> Path:
    """Where a session's KV cache is kept (``chat.resume``): beside its file."""
    return _path(session_id).with_suffix(".state")


def keep_kv(chat: ChatSession, saved: SavedSession) -> bool:
    """Keep ``chat``'s KV cache beside ``saved`` (engine thread; ``chat.resume``)
    within the disk budget (``chat.kept``: the oldest state files go first);
    True when kept, ``saved.kv`` then marking it (the caller saves the session).
    False when there is nothing worth keeping, a budget of 0, or a state larger
    than the whole budget (deleted again: a reopen reads the conversation)."""
    limit = kept.budget()
    if limit <= 0:
        return False
    path = paths.ensure_dir(sessions_dir()) / state_path(saved.id).name
    mark = resume.keep(chat, path)
    if mark is None or path in kept.evict(sessions_dir(), limit, newest=path):
        return False
    saved.kv = mark
    return True


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
    kinds = ["audio" if ref.get("kind") == "audio" else "image" for ref in session.images]
    names = iter(f"{k}: {ref.get('name') or k}" for k, ref in zip(kinds, session.images, strict=True))
    for m in session.messages:
        text = m["content"]
        if MARKER in text:  # a picture the chat saw (a clip it heard): named, at its place
            text = "".join(part if i == 0 else f"[{next(names, 'image: image')}]" + part for i, part in enumerate(text.split(MARKER)))
        out += [f"## {ROLE_HEADINGS.get(m['role'], m['role'])}", "", text.rstrip(), ""]
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
