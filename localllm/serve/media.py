"""Images and sound in serve's requests, as llama-server takes them with ``--mmproj``.

A request's image parts (OpenAI's ``image_url``, Ollama's ``images``,
Anthropic's ``image`` blocks, the Responses API's ``input_image``, each
translated to OpenAI's part first) become an ``ImagePart``, and so do OpenAI's
``input_audio`` parts (chat completions, the Responses API, the transcription
route), marked ``audio``: its base64 payload,
where it was (named in a 400), and its place in the message text, a mark that
holds a nonce drawn for the request (llama-server writes its own random
``<__media_...__>`` marker at the part's place, server-common.cpp), so no typed
text can claim an image. Only data URIs are taken: this tool is offline, and a
remote URL is a 400 saying so.

In the prompt, an image's positions hold *filler ids* (``fillers``): negative
numbers derived from the picture's sha256 and the chunk's index, never given
to llama.cpp. The scheduler compares token lists to reuse a cached prefix, so
the same picture in the same place matches (nothing is encoded or decoded
again) and another picture does not. ``Media`` tells the scheduler where each
image lies; its engine pieces are opaque here. Pure Python.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
import secrets
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_B64 = 64 * 1024 * 1024 * 4 // 3 + 4  # vision.image's MAX_BYTES, as base64
MEDIA_BODY = 32 * 1024 * 1024  # a request's body on a server with a projector (1 MiB without): a ~24 MB photo as base64
FILE_SCHEME = "file://"
OFFLINE = "this server is offline and fetches no URLs: send the picture itself as a data URI (data:image/png;base64,...)"
_DATA = re.compile(r"data:image/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)


class ImageError(ValueError):
    """A bad image part: ``where`` (``messages[0].content[1]``) and why."""

    def __init__(self, where: str, why: str) -> None:
        super().__init__(f"'{where}' {why}")
        self.where, self.why = where, why


@dataclass(frozen=True)
class ImagePart:
    where: str  # messages[0].content[1], messages[0].images[0]: named in a 400
    data: str  # base64, as sent
    mark: str  # its place in the message's text
    audio: str = ""  # an input_audio part: its stated format ("wav", "mp3", "flac"); its data a sound file (audio.read)


AUDIO_FORMATS = ("wav", "mp3", "flac")  # what libmtmd's miniaudio decodes (OpenAI's input_audio says wav or mp3)
_AUDIO_DATA = re.compile(r"data:audio/[A-Za-z0-9.+-]+;base64,", re.IGNORECASE)


def audio_data(value: object, where: str) -> tuple[str, str]:
    """(base64 payload, format) of an ``input_audio`` part's object (``{"data": ..., "format": ...}``):
    base64 text, a ``data:audio/...;base64,`` URI, or a ``file://`` name under --media-path."""
    if not isinstance(value, dict):
        raise ImageError(where, "must hold 'input_audio': {\"data\": BASE64, \"format\": \"wav\"}")
    fmt = value.get("format")
    if fmt is not None and (not isinstance(fmt, str) or fmt.lower() not in AUDIO_FORMATS):
        raise ImageError(where, f"has format {str(fmt)[:20]!r}: this server reads {', '.join(AUDIO_FORMATS)}")
    data = value.get("data", value.get("url"))
    if not isinstance(data, str) or not data:
        raise ImageError(where, "must hold the sound file as base64 in 'input_audio.data'")
    head = data[:16].lower()
    if head.startswith(("http://", "https://")):
        raise ImageError(where, "is a remote URL: this server is offline and fetches no URLs: send the sound file itself as base64")
    if head.startswith(FILE_SCHEME):
        return data, (fmt or "").lower()
    m = _AUDIO_DATA.match(data)
    return (data[m.end():] if m else data), (fmt or "").lower()


def new_nonce() -> str:
    return secrets.token_hex(8)


def mark(nonce: str, k: int) -> str:
    """The place of a request's ``k``-th image in its text (``nonce``: the request's)."""
    return f"<__media_{nonce}_{k}__>"


def data_uri(url: object, where: str) -> str:
    """The base64 payload of an image's URL: a ``data:image/...;base64,`` URI only."""
    if not isinstance(url, str) or not url:
        raise ImageError(where, "must hold the picture as a data URI (data:image/png;base64,...)")
    head = url[:16].lower()
    if head.startswith(("http://", "https://")):
        raise ImageError(where, f"is a remote URL: {OFFLINE}")
    if head.startswith(FILE_SCHEME):
        return url  # read by picture_bytes, under --media-path only
    m = _DATA.match(url)
    if m is None:
        if head.startswith("data:"):
            raise ImageError(where, "must be a base64 data URI of a picture (data:image/png;base64,...)")
        raise ImageError(where, f"is not a data URI: {OFFLINE}")
    return url[m.end():]


def base64_payload(value: object, where: str) -> str:
    """Ollama's ``images`` entry (base64 text; a data URI is taken too)."""
    if not isinstance(value, str) or not value:
        raise ImageError(where, "must be a picture as base64 text")
    if value[:5].lower() == "data:":
        return data_uri(value, where)
    if value[:8].lower().startswith(("http://", "https:/")):
        raise ImageError(where, f"is a remote URL: {OFFLINE}")
    return value


def local_file(url: str, where: str, media_path: Path | None) -> bytes:
    """A ``file://`` picture, as llama-server's --media-path reads one
    (tools/server/server-common.cpp): only under that folder, named relative to
    it; a name with ``..`` or ``.`` parts, a backslash or a NUL is refused,
    whatever the file system holds; bounded as a data URI's picture."""
    if media_path is None:
        raise ImageError(where, "is a file:// URL: this server reads local files only under a folder named at start "
                                "(serve --media-path DIR); send the picture as a data URI otherwise")
    name = url[len(FILE_SCHEME):]
    parts = [p for p in name.split("/") if p]
    if not parts or any(p in (".", "..") or "\\" in p or "\0" in p or ":" in p for p in parts) or len(name) > 1024:
        raise ImageError(where, f"names a file path that is not allowed: {name[:200]!r} (a path under --media-path, with no '..')")
    path = media_path.joinpath(*parts)
    try:
        if not path.is_file():  # a folder, a FIFO (whose open would wait), a device
            raise OSError
        if path.stat().st_size > MAX_B64 * 3 // 4:
            raise ImageError(where, f"is over {MAX_B64 * 3 // 4 // 2**20} MiB")
        with path.open("rb") as fh:
            raw = fh.read(MAX_B64 * 3 // 4 + 1)
    except OSError:
        raise ImageError(where, f"names a file that does not exist or cannot be read: {name[:200]!r}") from None
    if not raw:
        raise ImageError(where, "is empty")
    return raw


def picture_bytes(part: ImagePart, media_path: Path | None = None) -> bytes:
    """The part's payload as bytes, bounded before decoding; ``ImageError`` naming it.
    ``media_path``: serve's --media-path, where ``file://`` pictures are read."""
    if part.data[:7].lower() == FILE_SCHEME:
        return local_file(part.data, part.where, media_path)
    data = part.data.strip()
    if len(data) > MAX_B64:
        raise ImageError(part.where, f"is over {MAX_B64 * 3 // 4 // 2**20} MiB")
    try:
        raw = base64.b64decode("".join(data.split()), validate=True)
    except (binascii.Error, ValueError):
        raise ImageError(part.where, "is not valid base64") from None
    if not raw:
        raise ImageError(part.where, "is empty")
    return raw


def fillers(key: str, n: int) -> list[int]:
    """``n`` filler ids for an image chunk whose key is ``key`` (the picture's sha256
    and the chunk's index): negative, so never a token of any vocabulary, and the
    first already differs between two pictures."""
    h = int.from_bytes(hashlib.sha256(key.encode()).digest()[:6], "big")
    return [-1 - ((h + j) % (1 << 48)) for j in range(n)]


@dataclass(frozen=True)
class ImageSpan:
    """One image chunk of a prompt: cells ``start`` to ``start + n_tokens``."""

    start: int
    n_tokens: int
    piece: Any  # the engine's (engine.mtmd.Piece): decoded by BatchModel.decode_image
    image: int = 0  # which of the request's image parts it comes from
    n_pos: int = 0  # the positions it takes (0: one a cell; M-RoPE: max(nx, ny) of nx x ny cells)

    @property
    def end(self) -> int:
        return self.start + self.n_tokens


@dataclass(eq=False)
class Media:
    """Where a prompt's images lie, and what owns their chunks (freed with this)."""

    spans: tuple[ImageSpan, ...]
    images: int  # pictures in the prompt
    owners: list[Any] = field(default_factory=list)  # the engine's MediaPrompts: their chunks live as long as they do

    def pos(self, n: int) -> int:
        """The position of cell ``n``: ``n`` itself unless an image before it takes fewer
        positions than cells (M-RoPE; llama-server's ``server_tokens::pos_next``)."""
        return n + sum(s.n_pos - s.n_tokens for s in self.spans if s.n_pos and s.end <= n)

    def at(self, pos: int) -> ImageSpan | None:
        """The image starting at ``pos``, if one does."""
        return next((s for s in self.spans if s.start == pos), None)

    def text_end(self, pos: int, end: int) -> int:
        """Where the text from ``pos`` stops: the next image's start, or ``end``."""
        return min((s.start for s in self.spans if s.start >= pos), default=end)

    def snap(self, n: int) -> int:
        """``n`` cached positions moved back to the start of an image they would cut
        (a prefix never ends inside an image: llama-server keeps them whole too)."""
        for s in self.spans:
            if s.start < n < s.end:
                return s.start
        return n

    def close(self) -> None:
        for o in self.owners:
            o.close()
        self.owners = []


class MediaTokens(list):
    """A prompt's ids (filler ids where its images are) and its ``media``: what serve's
    tokenizer gives for a request with images (a plain list for one without)."""

    def __init__(self, ids: Sequence[int], media: Media) -> None:
        super().__init__(ids)
        self.media = media


def media_of(tokens: Sequence[int]) -> Media | None:
    return tokens.media if isinstance(tokens, MediaTokens) else None


def assemble(runs: Sequence[Sequence[int]], order: Sequence[int], pictures: Mapping[int, Any],
             pieces_of: Callable[[Any], Any]) -> MediaTokens:
    """The prompt: text ``runs`` with, between run i and run i+1, picture ``order[i]``
    as the engine tokenizes it (``pieces_of(picture)``: a MediaPrompt whose pieces are
    text, e.g. Gemma 3's ``<start_of_image>``, and image chunks)."""
    ids: list[int] = list(runs[0])
    spans: list[ImageSpan] = []
    owners: list[Any] = []
    try:
        for k, run in zip(order, runs[1:]):
            mp = pieces_of(pictures[k])
            owners.append(mp)
            for piece in mp.pieces:
                if piece.is_image:
                    spans.append(ImageSpan(len(ids), piece.n_tokens, piece, k, piece.n_pos))
                    ids += fillers(piece.key or f"{id(piece)}", piece.n_tokens)
                else:
                    ids += piece.tokens
            ids += run
    except BaseException:
        for o in owners:
            o.close()
        raise
    return MediaTokens(ids, Media(tuple(spans), len(order), owners))
