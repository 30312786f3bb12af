"""An attachment as the model reads it: a label with the file name, then its
text in a Markdown code fence that the text itself cannot close.

The delimiter: Open WebUI and LM Studio put a document's text in the user's
turn under a label naming its source; a Markdown fence is what models read
best as "verbatim data", and CommonMark's rule (a fence closes only on a run of
backticks at least as long as the one that opened it) makes it unforgeable: the
fence is one backtick longer than the longest run in the text. The file's text
cannot forge a turn either: the caller tokenizes the message as data (the
engine's ``chat_tokens`` and the chat session's untrusted spans), so
``<|im_end|>`` in a file stays text. Files come first and the typed question
last, as long-context prompting advises (the question is read with the
document already in view).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import PurePath

from localllm.attach.model import Attachment
from localllm.util import fmt

# the fence's info string by extension (a hint for the model; unknown: none)
_LANG = {
    ".py": "python", ".md": "markdown", ".markdown": "markdown", ".json": "json", ".csv": "csv", ".tsv": "tsv",
    ".js": "javascript", ".ts": "typescript", ".sh": "bash", ".yaml": "yaml", ".yml": "yaml", ".toml": "toml",
    ".html": "html", ".xml": "xml", ".c": "c", ".h": "c", ".cpp": "cpp", ".hpp": "cpp", ".rs": "rust", ".go": "go",
    ".java": "java", ".rb": "ruby", ".sql": "sql", ".ini": "ini", ".css": "css", ".tex": "latex",
}
_TICKS = re.compile(r"`+")


def fence_for(text: str) -> str:
    """Backticks one longer than the longest run in ``text`` (at least three)."""
    longest = max((len(m) for m in _TICKS.findall(text)), default=0)
    return "`" * max(3, longest + 1)


def label(a: Attachment) -> str:
    """``File: notes.md`` with what kind it is and what a bound kept."""
    extra = []
    if a.kind == "pdf":
        extra.append(f"PDF, {a.pages:,} page(s)" if a.pages is not None else "PDF")
    if a.kept:
        extra.append(f"only {a.kept}")
    return f"File: {fmt.safe(a.name)}" + (f" ({'; '.join(extra)})" if extra else "")


def block(a: Attachment) -> str:
    """The attachment's labelled block."""
    fence = fence_for(a.text)
    lang = "text" if a.kind == "pdf" else _LANG.get(PurePath(a.name).suffix.lower(), "")
    return f"{label(a)}\n{fence}{lang}\n{a.text}\n{fence}"


def message(typed: str, attachments: Sequence[Attachment]) -> str:
    """The user's message: each file's block, then what was typed."""
    blocks = "\n\n".join(block(a) for a in attachments)
    if not blocks:
        return typed
    return f"{blocks}\n\n{typed}" if typed.strip() else blocks
