"""Read a file the user attaches: what the path is, checked before it is opened,
then its text, bounded.

Everything about the file is untrusted: its kind (a FIFO would block ``open``
for ever, a device could stream without end), its size (a 10 GB log), its bytes
(binary, or not UTF-8) and, for a PDF, its structure (encrypted, 100,000 pages,
malformed). Each refusal is one ``InputError`` line naming the file and the
cause; each bound that cut something is a note that says what was kept, shown to
the user and written in the block's label so the model knows it read a part.
"""

from __future__ import annotations

import codecs
import os
import re
import stat
from dataclasses import replace
from pathlib import Path

from localllm.attach.model import Attachment, Limits, refuse
from localllm.util import fmt

# Signatures of common binary files, to name the cause (``file(1)``'s magic, the first bytes).
_MAGIC = (
    (b"\x89PNG\r\n\x1a\n", "a PNG image"), (b"\xff\xd8\xff", "a JPEG image"), (b"GIF8", "a GIF image"),
    (b"RIFF", "a RIFF file (WebP image, WAV audio, AVI video)"), (b"PK\x03\x04", "a ZIP archive (.zip, .docx, .xlsx, .odt, .jar)"),
    (b"\x1f\x8b", "a gzip archive"), (b"\x7fELF", "an executable (ELF)"), (b"GGUF", "a GGUF model file"),
    (b"%!PS", "a PostScript file"), (b"\xd0\xcf\x11\xe0", "an old Office document (.doc, .xls)"),
)
_IMAGE_HINT = "attach it with --image / /image, to a vision model"
# C0 controls that no text file holds (tab, newlines, form feed, escape and the like excepted)
_CONTROL = re.compile(r"[\x01-\x08\x0e-\x1a\x1c-\x1f\x7f]")
_REPLACED_SHARE = 0.01  # at most this share of bytes not UTF-8: replaced (a stray Latin-1 byte in a log), else another reading


def read(path: str | Path, limits: Limits | None = None) -> Attachment:
    """The file at ``path`` as an ``Attachment``, or an ``InputError`` naming it and the cause.
    What the path is comes from ``stat`` first: only a regular file is opened
    (non-blocking, and checked again on the open descriptor, so a file swapped
    for a FIFO in between is refused, not waited on)."""
    lim = limits or Limits()
    p = Path(os.path.expanduser(str(path)))
    st = _stat(p, path)
    what = _not_a_file(st.st_mode)
    if what:
        raise refuse(path, f"is {what}, not a file: only a regular file can be attached")
    try:
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except PermissionError:
        raise refuse(path, "cannot be read (permission denied)") from None
    except OSError as exc:
        raise refuse(path, f"cannot be read ({exc.strerror or exc})") from None
    try:
        now, data, is_pdf = _read_open(fd, st, p, path, lim)
    except OSError as exc:  # EIO, EAGAIN from a special file behind a regular-looking path (/proc, /sys)
        raise refuse(path, f"cannot be read ({exc.strerror or exc})") from None
    base = Attachment(path=str(p.resolve()), name=p.name, kind="text", size=now.st_size, text="")
    if is_pdf:
        from localllm.attach import pdf  # lazy: pypdf (~0.2 s), only for a PDF

        return pdf.extract(base, data, lim, shown=str(path))
    return _text(base, data, lim, shown=str(path))


def _read_open(fd: int, st: os.stat_result, p: Path, path: str | Path, lim: Limits) -> tuple[os.stat_result, bytes, bool]:
    """The open file's bytes, bounded (a PDF whole up to its bound, a text file
    up to its own), checked again on the descriptor."""
    with os.fdopen(fd, "rb") as f:
        now = os.fstat(f.fileno())
        if not stat.S_ISREG(now.st_mode) or (now.st_dev, now.st_ino) != (st.st_dev, st.st_ino):
            raise refuse(path, "changed while it was opened (no longer the regular file it was): not read")
        head = f.read(1024)
        is_pdf = b"%PDF-" in head
        if p.suffix.lower() == ".pdf" and not is_pdf:
            raise refuse(path, "is named .pdf but is not a PDF (no %PDF- header)")
        if is_pdf:
            if now.st_size > lim.pdf_bytes:
                raise refuse(path, f"is a {fmt.size(now.st_size)} PDF: a PDF attachment may be at most {fmt.size(lim.pdf_bytes)}")
            data = head + f.read(lim.pdf_bytes + 1 - len(head))
            if len(data) > lim.pdf_bytes:
                raise refuse(path, f"grew past {fmt.size(lim.pdf_bytes)} while it was read: a PDF attachment may be at most that")
        else:
            data = head + f.read(max(lim.text_bytes + 1 - len(head), 0))
    return now, data, is_pdf


def _stat(p: Path, shown: str | Path) -> os.stat_result:
    try:
        return os.stat(p)
    except FileNotFoundError:
        raise refuse(shown, "no such file") from None
    except PermissionError:
        raise refuse(shown, "cannot be read (permission denied on the path)") from None
    except OSError as exc:
        raise refuse(shown, f"cannot be read ({exc.strerror or exc})") from None


def _not_a_file(mode: int) -> str | None:
    """What a path that is not a regular file is (``stat``'s file type), or None."""
    if stat.S_ISREG(mode):
        return None
    for test, what in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _text(base: Attachment, data: bytes, lim: Limits, shown: str) -> Attachment:
    notes: list[str] = []
    kept = None
    if len(data) > lim.text_bytes:
        data = data[: lim.text_bytes]
        kept = f"the first {fmt.size(lim.text_bytes)} of {fmt.size(base.size)}"
        notes.append(f"kept {kept} (a text attachment is read up to {fmt.size(lim.text_bytes)})")
    text, how = decode(data, cut=kept is not None, shown=shown)
    if how:
        notes.append(how)
    text = text.replace("\r\n", "\n")
    if not text.strip():
        raise refuse(shown, "is empty (nothing but white space)" if text else "is empty")
    if len(text) > lim.chars:
        notes.append(f"kept the first {lim.chars:,} of {len(text):,} characters (the bound for one attachment)")
        kept = f"the first {lim.chars:,} of {len(text):,} characters"
        text = text[: lim.chars]
    return replace(base, text=text, notes=tuple(notes), kept=kept)


def decode(data: bytes, *, cut: bool = False, shown: str = "the file") -> tuple[str, str | None]:
    """``data`` as text, and a note when it was not plain UTF-8; an ``InputError``
    for a binary file. ``cut``: the bytes end where a bound cut them, perhaps
    inside a character, which is dropped rather than counted as invalid."""
    for bom, codec in ((codecs.BOM_UTF32_LE, "utf-32"), (codecs.BOM_UTF32_BE, "utf-32"), (codecs.BOM_UTF8, "utf-8-sig"),
                       (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16")):
        if data.startswith(bom):
            text = codecs.getincrementaldecoder(codec)(errors="replace").decode(data, final=not cut)
            if _CONTROL.search(text[:65536]) and len(_CONTROL.findall(text)) > len(text) * 0.01:
                raise refuse(shown, f"is not text (a {codec.upper()} byte-order mark, then binary data)")
            return text, None if codec == "utf-8-sig" else f"read as {codec.upper()} (its byte-order mark)"
    for magic, what in _MAGIC:
        if data.startswith(magic):
            hint = f": {_IMAGE_HINT}" if "image" in what else ""
            raise refuse(shown, f"is {what}, a binary file{hint}")
    if b"\x00" in data:
        raise refuse(shown, "is a binary file (it holds NUL bytes)")
    note = None
    try:
        text = codecs.getincrementaldecoder("utf-8")(errors="strict").decode(data, final=not cut)
    except UnicodeDecodeError:
        text = codecs.getincrementaldecoder("utf-8")(errors="replace").decode(data, final=not cut)
        bad = text.count("\ufffd") - data.count("\ufffd".encode())
        if bad <= max(len(data) * _REPLACED_SHARE, 1):
            note = f"{bad:,} byte(s) that are not UTF-8 shown as U+FFFD"
        else:
            try:
                text = data.decode("cp1252")
                note = "not UTF-8: read as Windows-1252 (Latin-1)"
            except UnicodeDecodeError:
                text = data.decode("latin-1")
                note = "not UTF-8: read as Latin-1"
    if len(_CONTROL.findall(text)) > max(len(text) * 0.01, 8):
        raise refuse(shown, "is not text (binary control bytes)" + (f" ({note.split(':')[0]})" if note else ""))
    return text, note
