"""A PDF's text through pypdf, bounded: pages, characters and time.

pypdf parses the whole cross-reference table and page tree, so the file is
bounded in bytes before (``reader.Limits.pdf_bytes``), and its page count is read
from the page tree's ``/Count`` before any page is flattened: a PDF declaring
100,000 pages is refused without walking them (pypdf's own walk stops at
``Configuration.page_tree_maximum_entries``, 100,000, and is refused the same
way). An encrypted PDF is tried with the empty password (owner-restricted
files open so in every reader); one that needs a password says so.
"""

from __future__ import annotations

import io
import logging
import time
from dataclasses import replace
from typing import Any

import pypdf
from pypdf.errors import DependencyError, LimitReachedError

from localllm.attach.model import Attachment, Limits, refuse
from localllm.errors import InputError


def extract(base: Attachment, data: bytes, lim: Limits, *, shown: str) -> Attachment:
    log = logging.getLogger("pypdf")
    level = log.level
    log.setLevel(logging.ERROR)  # pypdf warns about every repaired object: one line per attachment is ours to say
    try:
        return _extract(base, data, lim, shown)
    finally:
        log.setLevel(level)


def _extract(base: Attachment, data: bytes, lim: Limits, shown: str) -> Attachment:
    notes: list[str] = []
    try:
        reader = pypdf.PdfReader(io.BytesIO(data), strict=False)
        if reader.is_encrypted:
            try:
                opened = reader.decrypt("")
            except (DependencyError, NotImplementedError) as exc:
                raise refuse(shown, f"is encrypted, with a cipher this install cannot open ({_first_line(exc)})") from None
            if not opened:
                raise refuse(shown, "is encrypted (it needs a password): save an unencrypted copy, e.g. qpdf --decrypt")
            notes.append("encrypted with an empty password (restrictions only): read")
        declared = _declared_pages(reader)
        if declared is not None and declared > lim.pdf_pages:
            raise refuse(shown, f"has {declared:,} pages: a PDF attachment may have at most {lim.pdf_pages:,}")
        try:
            n = len(reader.pages)
        except LimitReachedError:
            raise refuse(shown, f"has a page tree past pypdf's bounds (over 100,000 entries): "
                                f"a PDF attachment may have at most {lim.pdf_pages:,} pages") from None
        if n > lim.pdf_pages:
            raise refuse(shown, f"has {n:,} pages: a PDF attachment may have at most {lim.pdf_pages:,}")
    except InputError:
        raise
    except Exception as exc:  # pypdf raises many kinds on a malformed file (PdfReadError, KeyError, ValueError, ...)
        raise refuse(shown, f"is not a readable PDF ({_first_line(exc)})") from None
    parts: list[str] = []
    chars = 0
    read = 0
    kept = None
    unreadable: list[int] = []
    bombs = 0  # pages whose content decompresses past pypdf's bound
    t0 = time.monotonic()
    for i in range(n):
        if time.monotonic() - t0 > lim.pdf_seconds:
            kept = f"pages 1-{read} of {n:,}"
            notes.append(f"kept {kept}: extraction stopped after {lim.pdf_seconds:g} s")
            break
        try:
            text = reader.pages[i].extract_text() or ""
        except LimitReachedError:  # its stream inflates past pypdf's bound (filters.ZLIB_MAX_OUTPUT_LENGTH): a compression bomb
            unreadable.append(i + 1)
            bombs += 1
            text = ""
        except Exception:  # one broken page does not lose the others
            unreadable.append(i + 1)
            text = ""
        read += 1
        if chars + len(text) > lim.chars:
            parts.append(text[: lim.chars - chars])
            chars = lim.chars
            kept = f"pages 1-{read} of {n:,}, cut at {lim.chars:,} characters"
            notes.append(f"kept {kept} (the bound for one attachment)")
            break
        parts.append(text)
        chars += len(text) + 2
    if unreadable:
        shown_pages = ", ".join(str(p) for p in unreadable[:5]) + (", ..." if len(unreadable) > 5 else "")
        notes.append(f"{len(unreadable)} page(s) could not be read ({shown_pages})")
    body = "\n\n".join(p.strip("\n") for p in parts)
    if not body.strip() and unreadable:
        why = (f"{bombs} of them decompress past pypdf's bound of {_inflate_bound()} (a compression bomb)" if bombs
               else "they are malformed")
        raise refuse(shown, f"has no page that could be read ({len(unreadable):,} of {n:,} tried): {why}")
    if not body.strip():
        raise refuse(shown, f"has no text to extract ({n:,} page(s)): a scanned PDF holds images of pages, which need OCR first")
    return replace(base, kind="pdf", text=body, notes=tuple(notes), kept=kept, pages=n, pages_read=read)


def _inflate_bound() -> str:
    """pypdf's bound on one stream's decompressed size, for people."""
    from pypdf import filters

    return f"{getattr(filters, 'ZLIB_MAX_OUTPUT_LENGTH', 75_000_000) / 1e6:g} MB"


def _declared_pages(reader: pypdf.PdfReader) -> int | None:
    """The page tree's ``/Count`` (what the file claims, read without walking it); None if absent or odd."""
    try:
        root: Any = reader.trailer["/Root"]
        return int(root["/Pages"]["/Count"])
    except Exception:  # a malformed tree: pypdf's walk decides
        return None


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return (text[0][:160] if text else type(exc).__name__) or type(exc).__name__
