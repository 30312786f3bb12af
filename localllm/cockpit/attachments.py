"""Images and files in the cockpit: attached by a key or a path pasted (dropped)
into the prompt box, shown as chips above it, counted and sent with the next
message; and the forecast line above them (the chips, the line and the
screens are the cockpit's Textual half: ``localllm.tui.attachments``).

A terminal pastes a file dropped on it as its path: quoted, backslash-escaped
(``My\\ File.png``) or as a ``file://`` URL, several separated by spaces or
lines. A paste that is nothing but such paths to existing files
(``dropped_paths``) becomes attachments instead of text; anything else is text.

A picture (PNG, JPEG, WebP, GIF: by its first bytes or its name) is read by
``localllm.vision.image`` (bounded before it is decoded) and needs the
model's projector; a sound file (WAV, MP3, FLAC: likewise) is read by
``localllm.audio.read`` (bounded the same way) and needs a projector with an
audio encoder, its chip giving the clip's length and its tokens; any other file is read by ``localllm.attach`` into a
labelled block (text, or a PDF's text). Both read off the UI thread; a file's
tokens are counted with the model's tokenizer on the engine thread. Each
refusal is one line in the chat log.

The message sent: the files' blocks, then the typed text, marked ``"data"``
(the chat session reads a file's text as data, never as turns); the images go
with it (``ChatSession.send_messages(..., images=...)``) and stay in the KV
cache. A saved session keeps each image's path and the sha256 of its pixels,
never the pixels (a clip's path and the sha256 of its file, ``"kind": "audio"``):
reopened, each is read again and checked (``restore_images``).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import stat
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from localllm import attach
from localllm.attach import Attachment
from localllm.audio.projector import AudioInfo
from localllm.audio.read import is_audio_path, load_audio, sniff
from localllm.audio.sound import AudioClip, clock
from localllm.chat import untrusted
from localllm.cockpit.wording import printable
from localllm.errors import InputError
from localllm.forecast import Room, check, new_tokens, suggestion
from localllm.util import fmt
from localllm.vision.image import RGBImage, load_image
from localllm.vision.marker import MARKER

IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".gif", ".svg")  # .svg: load_image refuses it with its own line
_IMAGE_MAGIC = (b"\x89PNG\r\n\x1a\n", b"\xff\xd8\xff", b"GIF87a", b"GIF89a")
MAX_PASTE = 16 * 1024  # a paste longer than this is text, never a list of paths
_ids = itertools.count(1)


# -- a paste that names files ----------------------------------------------------------
def _as_path(token: str) -> Path | None:
    """A token of a paste as a path: ``file://`` URLs decoded, ``~`` expanded; None
    when it does not look like one (no slash: a word pasted is text, even if a
    file of that name sits in the current folder)."""
    if token.startswith("file://"):
        url = urlparse(token)
        if url.netloc not in ("", "localhost"):
            return None
        token = unquote(url.path)
    if "/" not in token:
        return None
    return Path(os.path.expanduser(token))


def dropped_paths(text: str) -> list[Path] | None:
    """The files a paste names, when it is only paths of existing files (not
    folders): a dropped file, or several; None for anything else (text)."""
    s = text.strip()
    if not s or len(s) > MAX_PASTE:
        return None
    out: list[Path] = []
    for line in s.splitlines():
        try:
            tokens = shlex.split(line, posix=True)
        except ValueError:  # an unclosed quote: text
            return None
        for token in tokens:
            p = _as_path(token)
            if p is None:
                return None
            try:
                st = os.stat(p)
            except OSError:
                return None
            if stat.S_ISDIR(st.st_mode):
                return None
            out.append(p)
    return out or None


def is_image(path: Path) -> bool:
    """A picture, by its first bytes (a regular file only: a FIFO is never
    opened) or, failing that, by its name."""
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            with open(path, "rb") as f:
                head = f.read(16)
            if head.startswith(_IMAGE_MAGIC) or (head[:4] == b"RIFF" and head[8:12] == b"WEBP"):
                return True
    except OSError:
        pass
    return path.suffix.lower() in IMAGE_SUFFIXES


def is_audio(path: Path) -> bool:
    """A sound file, by its first bytes (a regular file only) or, failing that, by its name."""
    try:
        if stat.S_ISREG(os.stat(path).st_mode):
            with open(path, "rb") as f:
                if sniff(f.read(16)) is not None:
                    return True
    except OSError:
        pass
    return is_audio_path(path)


# -- what is attached ------------------------------------------------------------------
@dataclass
class Pending:
    """One attachment waiting for the next message: a picture, a sound file, or a file's text."""

    path: str  # as given (for the saved session: where to read an image again)
    name: str
    size: int  # bytes on disk
    image: RGBImage | None = None
    file: Attachment | None = None
    audio: AudioClip | None = None
    tokens: int | None = None  # a picture's or a clip's tokens (the projector's), a file's block's (the tokenizer's); None: not known
    special: bool = False  # a file's text holds the model's control-token text (refused with --tools)
    id: int = field(default_factory=lambda: next(_ids))

    @property
    def kind(self) -> str:
        if self.audio is not None:
            return "audio"
        return "image" if self.image is not None else (self.file.kind if self.file is not None else "file")

    @property
    def media(self) -> RGBImage | AudioClip | None:
        """What goes to the projector with the message (a picture or a clip); None for a file's text."""
        return self.image if self.image is not None else self.audio

    def chip(self) -> str:
        """name · size · what · tokens, as the chip shows it."""
        parts = [printable(self.name), fmt.size(self.size)]
        if self.image is not None:
            parts.append(f"{self.image.width}x{self.image.height}")
        elif self.audio is not None:
            parts.append(clock(self.audio.seconds))
        elif self.file is not None and self.file.pages is not None:
            f = self.file
            parts.append(f"{f.pages:,} page(s)" if f.pages_read == f.pages else f"{f.pages_read:,} of {f.pages:,} pages")
        what = "image tokens" if self.image is not None else "audio tokens" if self.audio is not None else "tokens"
        parts.append(f"{self.tokens:,} {what}" if self.tokens is not None else f"{what} n/a" if self.media is not None else "counting…")
        return " · ".join(parts)

    def ref(self) -> dict[str, Any]:
        """A picture or a clip as the saved session keeps it (``sessions.image_refs``)."""
        if self.audio is not None:
            a = self.audio
            return {"kind": "audio", "name": a.name, "path": str(Path(self.path).expanduser().resolve()), "sha256": a.sha256,
                    "seconds": round(a.seconds, 3), "bytes": a.file_bytes}
        im = self.image
        assert im is not None
        return {"name": im.name, "path": str(Path(self.path).expanduser().resolve()), "sha256": im.sha256,
                "width": im.width, "height": im.height, "bytes": im.file_bytes}


def read(path: str | Path, *, tokens_per_image: int | None, audio: AudioInfo | None = None) -> Pending:
    """The file at ``path`` read as an attachment (off the UI thread: Pillow, pypdf,
    a sound file's frames), or an ``InputError`` naming it and the cause (one line).
    ``audio``: the projector's audio encoder, which gives a clip's tokens."""
    p = Path(os.path.expanduser(str(path)))
    if is_image(p):
        im = load_image(p)
        return Pending(str(p), im.name, im.file_bytes, image=im, tokens=tokens_per_image)
    if is_audio(p):
        clip = load_audio(p)
        return Pending(str(p), clip.name, clip.file_bytes, audio=clip, tokens=audio.tokens(clip.seconds) if audio is not None else None)
    a = attach.read(p)
    return Pending(str(p), a.name, a.size, file=a)


def count_file(engine: Any, pending: Pending) -> Pending:
    """A file's block counted with the model's tokenizer, and whether it holds
    control-token text (on the engine thread)."""
    assert pending.file is not None
    block = attach.block(pending.file)
    pending.tokens = len(engine.tokenize(block, add_special=False, parse_special=False))
    pending.special = untrusted.holds_special(engine, pending.file.text)
    return pending


def message(typed: str, chips: Sequence[Pending]) -> dict[str, str]:
    """The user's message: each file's labelled block, then the typed text; marked
    ``"data"`` when it holds files (``localllm.attach``, the session's untrusted spans)."""
    files = [c.file for c in chips if c.file is not None]
    if not files:
        return {"role": "user", "content": typed}
    return {"role": "user", "content": attach.message(typed, files), "data": "file"}


def shown(typed: str, chips: Sequence[Pending]) -> str:
    """The user's message as the chat log shows it: the typed text, a line a file or image."""
    lines = [f"↳ {c.kind} {c.chip()}" for c in chips]
    return "\n".join([typed, *lines]) if typed.strip() else "\n".join(lines)


_FENCE = re.compile(r"(`{3,})[^\n`]*\n")


def split_message(content: str, data: bool) -> tuple[int, list[str], str]:
    """A user's message as the session holds it: (images, the files' labels, the
    typed text). The markers come first (``vision.marker.with_images``), then,
    in a message marked data, the files' blocks (``attach.block``), each closed
    by its own fence, which its text cannot hold."""
    n, rest = 0, content
    while rest.startswith(MARKER + "\n"):
        n, rest = n + 1, rest[len(MARKER) + 1:]
    labels: list[str] = []
    while data and rest.startswith("File: "):
        head, _, after = rest.partition("\n")
        m = _FENCE.match(after)
        if m is None:
            break
        close = after.find("\n" + m.group(1), m.end() - 1)
        if close < 0:
            break
        labels.append(head[len("File: "):])
        rest = after[close + 1 + len(m.group(1)):]
        if not rest.startswith("\n\n"):
            rest = rest.lstrip("\n")
            break
        rest = rest[2:]
    return n, labels, rest


def shown_saved(content: str, data: bool, names: Sequence[str], kinds: Sequence[str] = ()) -> str:
    """A saved user's message as the log shows it (``shown``'s look): ``names``:
    its images' and clips' names, in order; ``kinds``: "image" or "audio" for each (image by default)."""
    n, labels, typed = split_message(content, data)
    if not n and not labels:
        return content
    lines = [f"↳ {kinds[i] if i < len(kinds) else 'image'} {printable(names[i]) if i < len(names) else 'image'}" for i in range(n)]
    lines += [f"↳ file {printable(label)}" for label in labels]
    return "\n".join([typed, *lines]) if typed.strip() else "\n".join(lines)


def typed_part(content: str, data: bool) -> str:
    """What the user typed in a message that holds files or images (Ctrl+G puts it back in the box)."""
    return split_message(content, data)[2]


def without_markers(content: str) -> str:
    """A message's text with its images' markers taken out (sent again with its images, they go back in front)."""
    return content.replace(MARKER + "\n", "").replace(MARKER, "")


# -- saved sessions: images read again -------------------------------------------------
def restore_images(messages: list[dict[str, str]], refs: Sequence[Mapping[str, Any]], *, can_see: bool,
                   have: Mapping[str, RGBImage | AudioClip] | None = None,
                   read_image: Callable[[str], RGBImage] = load_image, can_hear: bool = False,
                   read_audio: Callable[[str], AudioClip] = load_audio) -> tuple[list[dict[str, str]], list[RGBImage | AudioClip], list[str]]:
    """A conversation's images and clips (a ref of ``"kind": "audio"``), in the
    order of their markers: those at hand (``have``, by sha256: a reload with
    other settings), else read again from their paths and checked against that
    sha256 (a saved session): (the messages, the media, the lines to say). One
    that cannot be had (gone, changed, no projector loaded: ``can_see`` False;
    no audio encoder: ``can_hear`` False) leaves the text ``[image NAME: not
    available]`` (``[audio …]``) where its marker was, so the model is not told
    it sees or hears it."""
    n_markers = sum(m["content"].count(MARKER) for m in messages)
    if not n_markers:
        return messages, [], []
    images: list[RGBImage | AudioClip | None] = []
    notes: list[str] = []
    for i in range(n_markers):
        ref = refs[i] if i < len(refs) else {}
        sound = ref.get("kind") == "audio"
        name = str(ref.get("name") or ("audio" if sound else "image"))
        why = None
        if not can_see:
            why = "no projector is loaded"
        elif sound and not can_hear:
            why = "the projector loaded has no audio encoder"
        elif have and ref.get("sha256") in have:
            images.append(have[ref["sha256"]])
            continue
        elif not ref.get("path") or not ref.get("sha256"):
            why = "the saved session does not say where it was read from"
        else:
            try:
                im = read_audio(str(ref["path"])) if sound else read_image(str(ref["path"]))
            except InputError as exc:
                why = str(exc)
            else:
                if im.sha256 != ref["sha256"]:
                    why = f"{ref['path']} has changed since"
                else:
                    images.append(im)
                    continue
        images.append(None)
        notes.append(f"{'audio' if sound else 'image'} {printable(name)} is not in the chat again: {printable(why)}")
    out: list[dict[str, str]] = []
    k = 0
    for m in messages:
        content = m["content"]
        if MARKER in content:
            parts = content.split(MARKER)
            rebuilt = parts[0]
            for part in parts[1:]:
                had = images[k] if k < len(images) else None
                ref = refs[k] if k < len(refs) else {}
                kind = "audio" if ref.get("kind") == "audio" else "image"
                rebuilt += (MARKER if had is not None else f"[{kind} {ref.get('name') or kind}: not available]") + part
                k += 1
            m = {**m, "content": rebuilt}
        out.append(m)
    return out, [im for im in images if im is not None], notes


# -- the prompt's count and forecast ---------------------------------------------------
@dataclass(frozen=True)
class Count:
    """The next message's tokens before it is sent (typed text, files, images,
    clips, and the history the cache does not hold), and whether it fits."""

    key: tuple  # what it was counted for (the box's text, the chips, the chat's state)
    new_tokens: int
    images: int  # images not yet encoded: this message's, and the history's when the cache lacks them
    image_tokens_known: bool
    room: Room | None  # with attachments: the context's room for it
    line: str | None  # it does not fit: the one line to refuse it with
    fix: tuple[int, str] | None  # the context and KV cache type that would hold it on this device
    text_tokens: int = -1  # a typed message's own tokens, where its template's wrapping was estimated (learnt from the reply); -1: exact
    audio_chunks: int = 0  # 30 s chunks of sound not yet encoded (the clips' own encode in the forecast, apart from images)


def count(chat: Any, key: tuple, msg: dict[str, str], chips: Sequence[Pending], *, tokens_per_image: int | None, reply: int,
          max_ctx_by_kv_type: Mapping[str, int] | None, trained_ctx: int | None, images: int | None = None,
          wrap: int = 0, audio: AudioInfo | None = None) -> Count:
    """``msg`` (with ``chips``' images and clips, or ``images`` pictures) counted against
    ``chat``, on the engine thread; each image counts the projector's tokens, each
    clip its chunks' (``audio``: the projector's audio encoder).
    With files or images, exact as the session tokenizes it (the template
    rendered, its wrapping included: ``forecast.new_tokens``), and checked
    against the context. Typed text alone is what a keystroke costs: its own
    tokens and ``wrap``, what the template added to the last turns (measured),
    with nothing rendered."""
    engine = chat.backend
    n_img = images if images is not None else sum(1 for c in chips if c.image is not None)
    cached = chat.context_used
    history = [] if cached else list(chat.images)
    clips = [c.audio for c in chips if c.audio is not None] + [m for m in history if isinstance(m, AudioClip)]
    history_images = len(history) - sum(1 for m in history if isinstance(m, AudioClip))
    text_tokens = -1
    if chat.completion:
        text = msg["content"] if cached else "".join(m["content"] for m in chat.messages) + msg["content"]
        n = len(engine.tokenize(text, add_special=not cached, parse_special=False))
    elif chips and cached:
        n = new_tokens(engine, chat.messages, msg)
    elif chips:  # nothing in the cache: the whole conversation is read again
        n = len(engine.tokenize(engine.render_chat([*chat.messages, msg], add_generation_prompt=True), add_special=False, parse_special=True))
    else:
        text_tokens = len(engine.tokenize(msg["content"], add_special=False, parse_special=False))
        n = text_tokens + wrap
        if not cached:  # the history is read again, each message with the template's wrapping
            n += sum(len(engine.tokenize(m["content"], add_special=False, parse_special=False)) + wrap for m in chat.messages)
    per = tokens_per_image or 0
    n += (n_img + history_images) * per
    clip_tokens = [audio.tokens(c.seconds) if audio is not None else None for c in clips]
    n += sum(t or 0 for t in clip_tokens)
    room = line = fix = None
    if chips:
        room = Room(n, cached, reply, chat.n_ctx)
        table = max_ctx_by_kv_type or {}
        names = ", ".join(printable(c.name) for c in chips[:3]) + (f" and {len(chips) - 3} more" if len(chips) > 3 else "")
        line = check(room, table, trained_ctx=trained_ctx, what=f"the message with {names}")
        fix = suggestion(room.needed, table, trained_ctx=trained_ctx) if line else None
    known = (tokens_per_image is not None or not (n_img + history_images)) and None not in clip_tokens
    chunks = sum(audio.chunks(c.seconds) for c in clips) if audio is not None else len(clips)
    return Count(key, n, n_img + history_images, known, room, line, fix, text_tokens if cached else -1, chunks)
