"""A finished reply as the chat view draws it: Markdown rendered by rich into
rows, code blocks highlighted under a line naming their language, a reasoning
model's thinking (``<think>…</think>``, or its template's markers) folded into one dim line.

Why rich's ``Markdown`` rendered into the line view, and only once the reply is
finished: Textual's ``Markdown`` widget is a widget tree, and each block it adds
lays out the screen, the cost the hand-written line view (``chatview``) exists
to avoid while llama.cpp decodes. Tokens stream as plain text (their cost is
unchanged); the finished reply is rendered once, block by block, the blocks
that fill the view first and the ones above it after that frame. Measured
here (2 cores shared with other work): a 2,000-token reply with five code
blocks renders whole in 28-38 ms unloaded, 70-115 ms under load; its last
token to the final frame, 28 ms, the whole reply 64 ms
(``tests/tui/test_markdown.py`` holds the final frame to 100 ms).
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

from markdown_it import MarkdownIt
from rich.console import Console, ConsoleOptions, RenderResult
from rich.markdown import CodeBlock, Markdown
from rich.padding import Padding
from rich.segment import Segment
from rich.style import Style
from rich.syntax import Syntax
from rich.text import Text

from localllm.reasoning.split import MARKERS, Markers

_PARSER = MarkdownIt("commonmark").enable("strikethrough").enable("table")  # as rich's Markdown reads it
THINK = MARKERS[0]  # <think>...</think>: the markers assumed where the template names none (as llama.cpp's deepseek format)
Row = tuple[str, list[Segment]]


@dataclass(frozen=True)
class Thought:
    """A reasoning model's thinking, split from its answer."""

    text: str
    closed: bool  # the model wrote </think> (a stopped reply may not have)
    answer: str


@lru_cache(maxsize=8)
def _block(marks: Markers) -> re.Pattern[str]:
    return re.compile(r"\s*" + re.escape(marks.open) + r"(.*?)(" + re.escape(marks.close) + r"|$)", re.DOTALL)


def split_think(text: str, marks: Markers = THINK) -> Thought | None:
    """The thinking block a reply starts with (between ``marks``, the template's:
    ``<think>``, Command R7B's ``<|START_THINKING|>``, Magistral's ``[THINK]``...),
    and the answer after it; None when the reply does not start with one."""
    m = _block(marks).match(text)
    if m is None:
        return None
    return Thought(m.group(1), bool(m.group(2)), text[m.end():])


def answer_of(text: str, marks: Markers = THINK) -> str:
    """The reply without its thinking: what the user copies."""
    thought = split_think(text, marks)
    return (thought.answer if thought is not None else text).strip()


def code_blocks(text: str, marks: Markers = THINK) -> list[tuple[str, str]]:
    """Each fenced or indented code block of a reply's answer: (language, code),
    as a Markdown reader sees them (a fence inside a list item counts; a
    backtick run in a sentence does not)."""
    tokens = MarkdownIt("commonmark").parse(answer_of(text, marks))
    return [(t.info.partition(" ")[0], t.content) for t in tokens if t.type in ("fence", "code_block")]


class _LabelledCode(CodeBlock):
    """A code block under a dim line naming its language (rich shows none)."""

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        """The highlighted code as one ``Text`` on the theme's background: half
        the time of rich's ``Syntax`` renderable, which lays out each line."""
        label = self.lexer_name if self.lexer_name != "text" else "code"
        yield Text(f" {label} ", style="dim reverse")
        syntax = Syntax("", self.lexer_name, theme=self.theme)
        background = Syntax.get_theme(self.theme).get_background_style()
        code = syntax.highlight(str(self.text).rstrip())
        code.rstrip()  # highlight ends it with a newline: a blank row
        yield Padding(code, (0, 1), style=background, expand=True)


class _Reply(Markdown):
    elements = {**Markdown.elements, "fence": _LabelledCode, "code_block": _LabelledCode}


def markdown_blocks(text: str) -> list[str]:
    """The source of each top-level block (a paragraph, a list, a code block,
    a table, ...): each is rendered on its own and kept, so a reply's last
    blocks can be drawn first (``ChatView``)."""
    lines = text.split("\n")
    tokens = _PARSER.parse(text)
    return ["\n".join(lines[t.map[0]:t.map[1]]) for t in tokens if t.level == 0 and t.map and t.nesting in (0, 1)]


def render_markdown(text: str, width: int, console: Console, *, dark: bool = True) -> list[Row]:
    """``text`` as rows of at most ``width`` cells: each row's plain text (for
    selection and tests) and its segments."""
    if not text.strip():
        return []
    md = _Reply(text, code_theme="monokai" if dark else "default", hyperlinks=False)
    lines = console.render_lines(md, console.options.update(width=max(width, 1), height=None), pad=False, new_lines=False)
    while lines and not "".join(s.text for s in lines[-1]).strip():
        lines.pop()
    return [("".join(s.text for s in line).rstrip(), line) for line in lines]  # the padding is not text (selection, copy)


def thought_line(thought: Thought, tokens: int | None, ms: float | None) -> str:
    """The folded thinking's one line: its token count and time where they were
    measured (a reopened session has neither)."""
    measured = f"{tokens} tokens in {ms / 1000:.1f} s" if tokens is not None and ms is not None else "tokens and time n/a"
    state = "" if thought.closed else " (unfinished)"
    return f"▸ thought{state} · {measured} · Ctrl+T shows it"


def plain_rows(paragraphs: list[str], style: Style, wrap_row: Callable[[str], list[str]]) -> list[Row]:
    """Paragraphs wrapped by ``wrap_row``, each row in ``style``."""
    return [(row, [Segment(row, style)]) for para in paragraphs for row in wrap_row(para)]
