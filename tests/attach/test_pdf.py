"""PDFs: their text through pypdf; encrypted, huge and malformed ones refused
with one line naming the file and the cause, quickly and in bounded memory."""

from __future__ import annotations

import io
import time
import zlib
from pathlib import Path

import pytest
from pypdf import PdfWriter

from localllm import attach
from localllm.attach import Limits
from localllm.errors import InputError


def raw_pdf(pages: list[str], *, kids: int | None = None, count: int | None = None, inflating: int = 0) -> bytes:
    """A PDF written by hand: one page per text (Helvetica), or ``kids``
    references to one page (a page tree that claims ``count`` pages); with
    ``inflating``, each page's content is that many spaces, deflated (a bomb)."""
    objs: list[bytes] = []
    n_pages = len(pages)
    page_ids = list(range(4, 4 + 2 * n_pages, 2))
    kid_refs = " ".join(f"{i} 0 R" for i in page_ids) if kids is None else " ".join(["4 0 R"] * kids)
    objs.append(b"<< /Type /Catalog /Pages 2 0 R >>")
    objs.append(f"<< /Type /Pages /Kids [{kid_refs}] /Count {count if count is not None else (kids or n_pages)} >>".encode())
    objs.append(b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>")
    for i, text in enumerate(pages):
        content = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode() if not inflating else zlib.compress(b" " * inflating, 9)
        objs.append(f"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Resources << /Font << /F1 3 0 R >> >> "
                    f"/Contents {page_ids[i] + 1} 0 R >>".encode())
        flate = b" /Filter /FlateDecode" if inflating else b""
        objs.append(b"<< /Length " + str(len(content)).encode() + flate + b" >>\nstream\n" + content + b"\nendstream")
    out = io.BytesIO()
    out.write(b"%PDF-1.4\n")
    offsets = []
    for i, body in enumerate(objs, start=1):
        offsets.append(out.tell())
        out.write(f"{i} 0 obj\n".encode() + body + b"\nendobj\n")
    xref = out.tell()
    out.write(f"xref\n0 {len(objs) + 1}\n0000000000 65535 f \n".encode())
    for off in offsets:
        out.write(f"{off:010d} 00000 n \n".encode())
    out.write(f"trailer\n<< /Size {len(objs) + 1} /Root 1 0 R >>\nstartxref\n{xref}\n%%EOF\n".encode())
    return out.getvalue()


def refused(path: Path, limits: Limits | None = None) -> str:
    with pytest.raises(InputError) as exc:
        attach.read(path, limits)
    msg = str(exc.value)
    assert "\n" not in msg and msg.startswith(str(path)), msg
    return msg


def test_a_pdf_gives_its_text_page_by_page(tmp_path: Path) -> None:
    p = tmp_path / "report.pdf"
    p.write_bytes(raw_pdf(["Revenue grew 12 percent", "Costs fell"]))
    a = attach.read(p)
    assert (a.kind, a.pages, a.pages_read, a.notes) == ("pdf", 2, 2, ())
    assert a.text == "Revenue grew 12 percent\n\nCosts fell"
    assert attach.block(a).startswith("File: report.pdf (PDF, 2 page(s))\n```text\nRevenue grew")


def test_an_encrypted_pdf_says_so(tmp_path: Path) -> None:
    w = PdfWriter(clone_from=io.BytesIO(raw_pdf(["top secret"])))
    w.encrypt(user_password="hunter2", owner_password="owner", algorithm="AES-128")
    p = tmp_path / "locked.pdf"
    with p.open("wb") as f:
        w.write(f)
    assert refused(p).endswith(": is encrypted (it needs a password): save an unencrypted copy, e.g. qpdf --decrypt")
    # restrictions only (an empty user password): every reader opens it, and so does this one
    w = PdfWriter(clone_from=io.BytesIO(raw_pdf(["open text"])))
    w.encrypt(user_password="", owner_password="owner", algorithm="AES-128")
    q = tmp_path / "restricted.pdf"
    with q.open("wb") as f:
        w.write(f)
    a = attach.read(q)
    assert a.text == "open text" and a.notes == ("encrypted with an empty password (restrictions only): read",)


def test_a_pdf_of_100000_pages_is_refused_quickly(tmp_path: Path) -> None:
    p = tmp_path / "huge.pdf"
    p.write_bytes(raw_pdf(["x"], kids=100_000))
    t0 = time.monotonic()
    assert refused(p).endswith(": has 100,000 pages: a PDF attachment may have at most 2,000")
    # a page tree whose /Count lies (1) is walked by pypdf, which stops at its own bound
    q = tmp_path / "liar.pdf"
    q.write_bytes(raw_pdf(["x"], kids=100_001, count=1))
    assert "a PDF attachment may have at most 2,000 pages" in refused(q)
    assert time.monotonic() - t0 < 20


def test_pages_and_characters_are_bounded_and_said(tmp_path: Path) -> None:
    p = tmp_path / "book.pdf"
    p.write_bytes(raw_pdf([f"page {i} " + "word " * 20 for i in range(30)]))
    a = attach.read(p, Limits(chars=1000))
    assert len(a.text) <= 1000 and a.pages == 30 and a.pages_read is not None and a.pages_read < 30
    assert a.notes == (f"kept pages 1-{a.pages_read} of 30, cut at 1,000 characters (the bound for one attachment)",)
    assert f"(PDF, 30 page(s); only pages 1-{a.pages_read} of 30" in attach.block(a).splitlines()[0]
    assert "at most 10" in refused(p, Limits(pdf_pages=10))
    assert "a PDF attachment may be at most" in refused(p, Limits(pdf_bytes=1000))


def test_malformed_and_textless_pdfs_are_one_line(tmp_path: Path) -> None:
    bad = tmp_path / "broken.pdf"
    bad.write_bytes(b"%PDF-1.4\n" + b"garbage " * 100)
    assert ": is not a readable PDF (" in refused(bad)
    fake = tmp_path / "fake.pdf"
    fake.write_text("just text")
    assert refused(fake).endswith(": is named .pdf but is not a PDF (no %PDF- header)")
    blank = tmp_path / "scan.pdf"
    blank.write_bytes(raw_pdf([""]))
    assert "has no text to extract (1 page(s)): a scanned PDF" in refused(blank)


def test_a_pdf_bomb_is_named_as_one_not_as_a_scan(tmp_path: Path) -> None:
    """A page whose 300 KB stream inflates to 300 MB stops at pypdf's bound: said so,
    quickly and in bounded memory, not "needs OCR"."""
    bomb = tmp_path / "bomb.pdf"
    bomb.write_bytes(raw_pdf([""], inflating=300_000_000))
    assert bomb.stat().st_size < 400_000
    t0 = time.monotonic()
    msg = refused(bomb)
    assert time.monotonic() - t0 < 10
    assert msg.endswith(": has no page that could be read (1 of 1 tried): 1 of them decompress past pypdf's bound of 75 MB "
                        "(a compression bomb)"), msg
    assert "OCR" not in msg
