"""What an attachment is and what it may cost: the shapes ``reader`` and ``pdf`` share."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path

from localllm.errors import InputError
from localllm.util import fmt
from localllm.util.units import MiB


@dataclass(frozen=True)
class Limits:
    """What one attachment may cost. Chosen here (no anchor publishes its
    bounds): about a million characters is ~250k tokens, more than any
    context this tool plans by default; the plan refuses what does not fit."""

    text_bytes: int = 4 * MiB  # a text file is read up to this many bytes, the rest is left (and said)
    pdf_bytes: int = 64 * MiB  # a larger PDF is refused: pypdf holds it in memory whole
    pdf_pages: int = 2_000  # a PDF with more pages is refused before any is read
    chars: int = 1_000_000  # characters kept of the extracted text
    pdf_seconds: float = 30.0  # extraction stops after this long (pypdf on a hostile content stream), saying so


@dataclass(frozen=True)
class Attachment:
    """A file's text, ready for a prompt (``block.block``), with what was kept."""

    path: str  # as resolved
    name: str  # the file name, as the label shows it
    kind: str  # "text" or "pdf"
    size: int  # bytes on disk
    text: str
    notes: tuple[str, ...] = ()  # what a bound cut, what was replaced: for the user and the label
    kept: str | None = None  # the label's part when a bound cut the text ("the first 4 MiB of 9.5 MiB")
    pages: int | None = None  # a PDF's pages
    pages_read: int | None = None
    tokens: int | None = None  # the block's tokens with the model's tokenizer (``with_tokens``); None: not counted

    def with_tokens(self, n: int) -> Attachment:
        return replace(self, tokens=n)

    def chip(self) -> str:
        """One short line for the user: name, size, pages, tokens (when counted)."""
        parts = [fmt.safe(self.name), fmt.size(self.size)]
        if self.pages is not None:
            parts.append(f"{self.pages:,} page(s)" if self.pages_read == self.pages else f"{self.pages_read:,} of {self.pages:,} pages")
        if self.tokens is not None:
            parts.append(f"{self.tokens:,} tokens")
        return " · ".join(parts)


def refuse(path: str | Path, cause: str) -> InputError:
    return InputError(f"{fmt.safe(str(path))}: {cause}")
