"""The chat log of the cockpit: messages wrapped to the view, drawn line by line.

Why not Textual's ``Log``: each line it adds sets its ``virtual_size``
reactive, which lays out the whole screen and then repaints all of it. Measured
with a scripted engine at 66 tokens/s on a 2-core machine (140x40), the UI
thread used 24% of a core while a reply streamed, CPU that comes out of
llama.cpp's decode threads (the cockpit decoded at 0.84x ``localllm run`` in
``scripts/bench_tui.py``); with this view, the steadier panels and no cursor
blink while busy, 6%. Here a
taller log is a new virtual size set without a layout pass (``set_reactive``),
handed to the scrollbar, and only the changed lines are repainted. The space for
the scrollbar is always kept (``scrollbar-gutter: stable``), so the text area
never changes width as the scrollbar comes and goes. Only public Textual API is
used: the line API (``render_line``), ``set_reactive``, the scrollbar widget's
reactives, ``refresh_lines`` and the selection hooks.
"""

from __future__ import annotations

import re

from rich.cells import get_character_cell_size
from rich.segment import Segment
from rich.style import Style
from rich.text import Text
from textual import events
from textual.binding import Binding
from textual.cache import LRUCache
from textual.geometry import Size
from textual.scroll_view import ScrollView
from textual.selection import Selection
from textual.strip import Strip

from localllm.reasoning.split import Markers
from localllm.tui.markdown import THINK, Row, markdown_blocks, plain_rows, render_markdown, split_think, thought_line

_CONTROL = re.compile("[\u0000-\u0008\u000b-\u001f\u007f]")  # drawn as nothing, as Log does


def _clean(text: str) -> str:
    """Text as the view draws it: tabs as four spaces, control characters dropped
    (a model's output cannot move the cursor)."""
    return _CONTROL.sub("", text.replace("\t", "    "))


def _fits(text: str, width: int) -> int:
    """How many characters of ``text`` fit in ``width`` terminal cells."""
    if text.isascii():
        return min(len(text), width)
    used = 0
    for i, ch in enumerate(text):
        used += get_character_cell_size(ch)
        if used > width:
            return i
    return len(text)


def wrap(paragraph: str, width: int) -> list[str]:
    """Rows of at most ``width`` cells, broken at the last space that fits (the
    space itself is dropped); a word longer than the row is broken where it ends."""
    width = max(width, 1)
    rows = []
    while True:
        n = _fits(paragraph, width)
        if n >= len(paragraph):
            rows.append(paragraph)
            return rows
        cut = paragraph.rfind(" ", 0, n + 1)
        if cut > 0:
            rows.append(paragraph[:cut])
            paragraph = paragraph[cut + 1:]
        else:
            n = max(n, 1)
            rows.append(paragraph[:n])
            paragraph = paragraph[n:]


class MessageView:
    """One message in the chat log; the assistant's grows as tokens arrive, as
    plain text, and is drawn as Markdown once ``ChatView.finish`` is called."""

    def __init__(self, role: str, text: str = "") -> None:
        self.role = role
        self.text = text
        self.log: ChatView | None = None
        self.first_para = 0  # the log's paragraph where it begins
        self.cut = 0  # the log's paragraph count before it was added: what ``truncate`` keeps
        self.think_tokens: int | None = None  # its <think> block's tokens and time, where measured
        self.think_ms: float | None = None
        self.pending = False  # just finished: its last blocks are drawn first
        self.summary: str | None = None  # a tool's block: its one line when folded (None: not foldable)
        self.folded = False
        self.rows = (0, 0)  # the log's rows it was drawn on (first, end): what a click lands on
        self._drawn: dict[tuple[int, bool, bool], list[Row]] = {}

    def append(self, piece: str) -> None:
        self.text += piece
        if self.log is not None and piece:
            self.log.write(piece)


class ChatView(ScrollView, can_focus=True):
    """The conversation as paragraphs wrapped to the view's width; the last one
    grows as tokens stream in. A finished message is one block drawn from its
    text (Markdown for a reply, ``markdown.render_markdown``), again at each
    width; ``raw`` shows every message as the plain text it is."""

    ALLOW_SELECT = True
    BINDINGS = [Binding("enter", "toggle_fold", "Fold / unfold the last tool result", show=False)]
    COMPONENT_CLASSES = {"chatview--user", "chatview--note", "chatview--think", "chatview--tool"}
    DEFAULT_CSS = """
    ChatView {
        height: 1fr; padding: 0 1; background: $surface; color: $text;
        overflow-x: hidden; overflow-y: auto; scrollbar-gutter: stable;
    }
    ChatView:focus { background-tint: $foreground 5%; }
    ChatView > .chatview--user { color: $text-accent; text-style: bold; }
    ChatView > .chatview--note { color: $text-muted; }
    ChatView > .chatview--think { color: $text-muted; text-style: italic; }
    ChatView > .chatview--tool { color: $text-secondary; }
    """
    PREFIX = {"user": "you › ", "assistant": "", "note": "· "}

    def __init__(self, **kw: object) -> None:
        super().__init__(**kw)  # type: ignore[arg-type]
        self.messages: list[MessageView] = []
        self._paras: list[str | MessageView] = []  # the text, split at newlines; a finished message is one block
        self._rows: list[str] = []  # the paragraphs wrapped to the width
        self._looks: list[list[Segment] | None] = []  # each row's segments (None: plain, in the view's style)
        self._width = 0  # the width they were wrapped to
        self._strips: LRUCache[int, Strip] = LRUCache(1024)
        self._md_cache: LRUCache[tuple[str, int, bool], list[Row]] = LRUCache(4096)  # Markdown blocks, rendered
        self._style: Style | None = None
        self._following = True  # the view shows the end: new text scrolls it (until the user scrolls up)
        self.raw = False  # show the messages' text as it is, not rendered
        self.think_marks: Markers = THINK  # where a reply's thinking starts and ends: the loaded template's (set_think_marks)
        self._partial = False  # a finished reply's upper blocks are still plain text, drawn after this frame

    def set_think_marks(self, marks: Markers) -> None:
        """The loaded model's thinking markers: the replies are folded by them, drawn again where they change."""
        if marks != self.think_marks:
            self.think_marks = marks
            for msg in self.messages:
                msg._drawn.clear()
            self._redraw()

    @property
    def line_count(self) -> int:
        return len(self._rows)

    @property
    def drawn_whole(self) -> bool:
        """Every finished reply is drawn as Markdown, none waits for the frame
        after its tail (what a picture of the screen must wait for)."""
        return not self._partial

    @property
    def lines(self) -> list[str]:
        """The rows, as shown (a copy)."""
        return list(self._rows)

    def add(self, role: str, text: str = "", *, folded: str | None = None) -> MessageView:
        """A message at the end of the log. An empty assistant message is a reply
        to stream into (``append``, then ``finish``); any other is drawn finished
        (``folded``: drawn as this one line until a click or Enter unfolds it)."""
        cut = len(self._paras)
        if self._paras:
            last = self._paras[-1]
            self.write("\n" if isinstance(last, MessageView) or not last else "\n\n")
        if role == "user":  # the user sent it: show it, and the reply under it, wherever the view was
            self._following = True
        msg = MessageView(role, "")
        msg.cut = cut
        self.messages.append(msg)
        self._open()
        msg.first_para = len(self._paras) - 1
        if role == "assistant" and not text:
            msg.log = self  # streams into the log until finished
            self.write(self.PREFIX.get(role, ""))
            return msg
        msg.text = text
        msg.summary, msg.folded = folded, folded is not None
        self._paras[-1] = msg
        self._redraw()
        return msg

    def finish(self, msg: MessageView) -> None:
        """Draw a streamed message as one block (Markdown): its paragraphs, up to
        the next message, become the message itself, which streams no more
        (``append`` then changes its text only). Again after its text or think
        figures changed."""
        if msg not in self.messages:
            return
        if not isinstance(self._paras[msg.first_para], MessageView):
            later = self.messages[self.messages.index(msg) + 1:]
            end = later[0].cut if later else len(self._paras)
            self._paras[msg.first_para:end] = [msg]
            for m in later:
                m.first_para -= end - msg.first_para - 1
                m.cut -= end - msg.first_para - 1
        msg.log = None  # text appended from now on is drawn at the next finish
        msg.pending = True
        msg._drawn.clear()
        self._redraw()

    def truncate(self, msg: MessageView) -> None:
        """Take ``msg`` and every message after it off the log."""
        if msg not in self.messages:
            return
        del self.messages[self.messages.index(msg):]
        del self._paras[msg.cut:]
        self._redraw()

    def toggle_fold(self, msg: MessageView) -> None:
        """A tool's block folded to its one line, or shown whole."""
        if msg.summary is None or msg not in self.messages:
            return
        msg.folded = not msg.folded
        msg._drawn.clear()
        self._redraw()

    def action_toggle_fold(self) -> None:
        """Enter on the log: the last foldable block (a tool's result) unfolds, or folds again."""
        msg = next((m for m in reversed(self.messages) if m.summary is not None), None)
        if msg is not None:
            self.toggle_fold(msg)

    def on_click(self, event: events.Click) -> None:
        """A click on a tool's block unfolds it (or folds it again)."""
        at = event.get_content_offset(self)
        if at is None:
            return
        y = at.y + round(self.scroll_y)
        msg = next((m for m in self.messages if m.summary is not None and m.rows[0] <= y < m.rows[1]), None)
        if msg is not None:
            self.toggle_fold(msg)

    def toggle_raw(self) -> None:
        """Show the messages as their plain text, or rendered again."""
        self.raw = not self.raw
        self._redraw()

    def _open(self) -> None:
        """A paragraph to write into at the end (a finished message is closed)."""
        if not self._paras or isinstance(self._paras[-1], MessageView):
            self._paras.append("")
            self._rows.append("")
            self._looks.append(None)

    def _redraw(self) -> None:
        """All rows again (a block changed), following the end if it did."""
        at_end = self._following or self.is_vertical_scroll_end
        self._wrap_width()
        self._rewrap()
        self._resize_virtual()
        self.refresh()
        if at_end:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)

    def clear_messages(self) -> None:
        self.messages.clear()
        self._paras.clear()
        self._rows.clear()
        self._looks.clear()
        self._strips.clear()
        self._resize_virtual()
        self.scroll_home(animate=False, immediate=True)
        self._following = True
        self.refresh()

    def write(self, data: str) -> None:
        """Append ``data`` (a newline starts a paragraph); follow the end if the
        view was there. Only the last row is wrapped again: the earlier rows of
        a paragraph each broke at a space (or a word's end) that was already
        there, which text added after them cannot move; so only that row and the
        new ones are repainted."""
        if not data:
            return
        at_end = self._following or self.is_vertical_scroll_end
        width = self._wrap_width()
        parts = _clean(data).split("\n")
        self._open()
        first = len(self._rows) - 1
        self._paras[-1] += parts[0]  # type: ignore[operator]  # _open: the last paragraph is text
        self._rows[first:] = wrap(self._rows[first] + parts[0], width)
        for para in parts[1:]:
            self._paras.append(para)
            self._rows.extend(wrap(para, width))
        self._looks[first:] = [None] * (len(self._rows) - first)
        for y in range(first, len(self._rows)):
            self._strips.discard(y)
        self._resize_virtual()
        self.refresh_lines(first, len(self._rows) - first)
        if at_end:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)  # force: the scrollbar may be due in the next layout

    def _wrap_width(self) -> int:
        """The text area's width; the rows are wrapped again if it changed."""
        width = self.scrollable_content_region.width or 80  # 80 until the view has a size
        if width != self._width:
            self._width = width
            self._rewrap()
        return width

    def _rewrap(self) -> None:
        """All paragraphs again, at a new width (the terminal was resized)."""
        rows: list[str] = []
        looks: list[list[Segment] | None] = []
        self._partial = False
        for para in self._paras:
            if isinstance(para, MessageView):
                first = len(rows)
                for row, segments in self._block(para):
                    rows.append(row)
                    looks.append(segments)
                para.rows = (first, len(rows))
            else:
                for row in wrap(para, self._width):
                    rows.append(row)
                    looks.append(None)
        self._rows, self._looks = rows, looks
        self._strips.clear()

    def _block(self, msg: MessageView) -> list[Row]:
        """A finished message's rows at the current width, kept per width: a
        reply as Markdown (its thinking folded into one line), the user's turn
        and notes in their own style; ``raw``: the text as it is."""
        dark = self.app.current_theme.dark if self.is_attached else True
        key = (self._width, self.raw, dark)
        rows = msg._drawn.get(key)
        if rows is not None:
            return rows
        width = self._width
        text = _clean(msg.text)
        role = msg.role if msg.role in ("user", "note", "tool") else None
        look = self.get_component_rich_style(f"chatview--{role}", partial=True) if role else Style()
        rows = []
        if msg.role == "tool":  # a tool's call or result: as it is, a result folded to its one line
            body = msg.summary if msg.folded and msg.summary is not None else text
            rows = plain_rows(_clean(body).split("\n"), look, lambda p: wrap(p, width))
        elif msg.role != "assistant" or self.raw:
            rows = plain_rows((self.PREFIX.get(msg.role, "") + text).split("\n"), look, lambda p: wrap(p, width))
        else:
            thought = split_think(text, self.think_marks)
            if thought is not None:
                think = self.get_component_rich_style("chatview--think", partial=True)
                rows = plain_rows([thought_line(thought, msg.think_tokens, msg.think_ms)], think, lambda p: wrap(p, width))
                text = thought.answer
            answer, whole = self._markdown(text, width, dark, msg.pending)
            rows += answer
            if not whole:  # the rest once this frame is out
                msg.pending = False
                self._partial = True
                self.call_after_refresh(self._redraw)
                return rows or [("", [])]
        msg.pending = False
        msg._drawn[key] = rows = rows or [("", [])]
        return rows

    def _markdown(self, text: str, width: int, dark: bool, tail_first: bool) -> tuple[list[Row], bool]:
        """A reply's rows, block by block (each kept by its source). With
        ``tail_first`` only the last blocks that fill the view are rendered
        now, the ones above as their plain text; and whether all were."""
        rows: list[Row] = []
        whole = True
        for block in reversed(markdown_blocks(text)):
            drawn = self._md_cache.get((block, width, dark))
            if drawn is None and tail_first and len(rows) > self.scrollable_content_region.height:
                drawn, whole = [(row, [Segment(row)]) for line in block.split("\n") for row in wrap(line, width)], False
            elif drawn is None:
                drawn = render_markdown(block, width, self.app.console, dark=dark)
                self._md_cache[(block, width, dark)] = drawn
            rows[:0] = [*drawn, ("", [])] if rows else drawn
        return rows, whole

    def on_resize(self, event: events.Resize) -> None:
        """Wrap again at a new width; a view that showed the end still does,
        whichever way the terminal changed."""
        if self.scrollable_content_region.width and self.scrollable_content_region.width != self._width:
            self._wrap_width()
            self._resize_virtual()
            self.refresh()
        if self._following:
            self.scroll_end(animate=False, immediate=True, x_axis=False, force=True)

    def watch_scroll_y(self, old_value: float, new_value: float) -> None:
        super().watch_scroll_y(old_value, new_value)
        self._following = round(new_value) >= self.max_scroll_y  # the user scrolled up, or back to the end

    def _resize_virtual(self) -> None:
        """A new virtual size, with a layout pass only when the scrollbar appears
        or goes; otherwise nothing else on the screen moves, so the size is set
        without one and handed to the scrollbar (when it is shown: an unchanged
        full-height bar is not repainted at every line)."""
        size = Size(self.scrollable_content_region.width, len(self._rows))
        if size == self.virtual_size:
            return
        if (size.height > self.scrollable_content_region.height) != self.show_vertical_scrollbar:
            self.virtual_size = size  # the scrollbar appears or goes: a layout pass places it
            return
        self.set_reactive(ChatView.virtual_size, size)
        if self.show_vertical_scrollbar:
            self.vertical_scrollbar.window_virtual_size = size.height

    def render_line(self, y: int) -> Strip:
        scroll_x, scroll_y = self.scroll_offset
        index = scroll_y + y
        style = self._line_style()
        width = self.scrollable_content_region.width
        if index >= len(self._rows):
            return Strip.blank(width, style)
        selection = self.text_selection
        span = selection.get_span(index) if selection is not None else None
        strip = self._strips.get(index) if span is None else None
        if strip is None:
            row = self._rows[index]
            looks = self._looks[index]
            if span is None:  # plain text in one style is one segment, no rich Text to lay out
                segments = [Segment(row, style)] if looks is None else list(Segment.apply_style(looks, style))
                # the segments' own length: a rendered row's segments run past its text (Rich pads a
                # list item to the width), and a strip told the text's length is never cropped to the
                # view, so it painted over the figures panel beside it (issue 45 item 3)
                strip = Strip(segments, Segment.get_line_length(segments))
                self._strips[index] = strip
            else:
                text = Text(row, no_wrap=True, style=style)
                if looks is not None:  # a rendered row: its own styles, the selection over them
                    text = Text(no_wrap=True, style=style)
                    for segment in looks:
                        text.append(segment.text, segment.style)
                begin, end = span
                text.stylize(self.screen.get_component_rich_style("screen--selection"), begin, len(text) if end == -1 else end)
                rendered = list(text.render(self.app.console))
                strip = Strip(rendered, Segment.get_line_length(rendered))
        return strip.crop_extend(scroll_x, scroll_x + width, style).apply_offsets(scroll_x, index)

    def _line_style(self) -> Style:
        """The view's text style, kept until its styles change: computing it walks
        the widget's ancestors (about a millisecond a line, measured while
        llama.cpp decoded)."""
        if self._style is None:
            self._style = self.rich_style
        return self._style

    def get_selection(self, selection: Selection) -> tuple[str, str] | None:
        return selection.extract("\n".join(self._rows)), "\n"

    def selection_updated(self, selection: Selection | None) -> None:
        self._strips.clear()
        self.refresh()

    def notify_style_update(self) -> None:
        super().notify_style_update()
        self._style = None
        self._strips.clear()
        for msg in self.messages:  # the blocks carry the component styles
            msg._drawn.clear()
        self._md_cache.clear()
        if self._width:
            self._rewrap()
