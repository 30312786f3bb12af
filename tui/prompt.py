"""The cockpit's prompt box: a multi-line text area where Enter sends.

Why a ``TextArea`` and not ``Input``: a pasted list or a code snippet keeps its
lines (a terminal's bracketed paste arrives as one ``Paste`` event, newlines
and all), and a newline can be typed: Ctrl+J always (every terminal sends it as
a line feed), Shift+Enter where the terminal reports it (kitty's keyboard
protocol, some others). Up in an empty box recalls the earlier prompts, as a
shell does; Down walks back.

A paste that is nothing but the paths of existing files (a file dropped on the
terminal, which pastes its path) is not typed: ``Dropped`` tells the app, which
attaches them (``attachments.py``). Backspace in an empty box removes the last
attachment (``RemoveLast``).
"""

from __future__ import annotations

from pathlib import Path

from textual import events
from textual.message import Message
from textual.widgets import TextArea

from localllm.cockpit.attachments import dropped_paths

NEWLINE_KEYS = ("ctrl+j", "shift+enter")
REISSUE_S = 0.002  # keys closer than this came in one read: a "^" among them was an Esc


class PromptBox(TextArea):
    """Enter posts ``Submitted`` with the text; the box keeps it until the app
    takes it (``take``), so a refused message is not lost."""

    DEFAULT_CSS = """
    PromptBox { height: auto; min-height: 3; max-height: 10; border: tall $border-blurred; padding: 0 1; }
    PromptBox:focus { border: tall $border; }
    PromptBox .text-area--cursor-line { background: transparent; }
    """

    class Submitted(Message):
        def __init__(self, box: PromptBox, text: str) -> None:
            super().__init__()
            self.box, self.text = box, text

        @property
        def control(self) -> PromptBox:
            return self.box

    class Dropped(Message):
        """A paste that names files: attach them."""

        def __init__(self, box: PromptBox, paths: list[Path]) -> None:
            super().__init__()
            self.box, self.paths = box, paths

        @property
        def control(self) -> PromptBox:
            return self.box

    class RemoveLast(Message):
        """Backspace in an empty box: the last attachment goes."""

    def __init__(self, *, placeholder: str = "", id: str | None = None) -> None:  # noqa: A002 - Textual's name
        super().__init__(id=id, soft_wrap=True, show_line_numbers=False, tab_behavior="focus", placeholder=placeholder,
                         compact=True, highlight_cursor_line=False)
        self.sent: list[str] = []  # the prompts sent, oldest first (for Up)
        self._recalled: int | None = None  # the history entry shown, while unchanged
        self._caret: tuple[float, tuple[int, int]] | None = None  # when and where the last "^" was typed

    @property
    def value(self) -> str:
        """The text (``Input``'s name for it, which the tests and scripts use)."""
        return self.text

    @value.setter
    def value(self, text: str) -> None:
        self.load_text(text)
        self.move_cursor(self.document.end)

    def take(self) -> str:
        """The text, now sent: kept in the history, the box emptied."""
        text = self.text
        if text.strip() and (not self.sent or self.sent[-1] != text):
            self.sent.append(text)
        self._recalled = None
        self.load_text("")
        return text

    async def _on_key(self, event: events.Key) -> None:
        if self._drop_reissued_escape(event):
            await self.app.run_action("stop")  # the Esc it was
        if event.key == "enter":
            event.stop()
            event.prevent_default()
            self.post_message(self.Submitted(self, self.text))
            return
        if event.key in NEWLINE_KEYS:
            event.stop()
            event.prevent_default()
            self.insert("\n")
            return
        if event.key == "backspace" and not self.text:
            self.post_message(self.RemoveLast())
        if event.key in ("up", "down") and self._recall(-1 if event.key == "up" else 1):
            event.stop()
            event.prevent_default()
            return
        self._recalled = None
        await super()._on_key(event)

    async def _on_paste(self, event: events.Paste) -> None:
        """A paste of file paths becomes attachments; any other is typed (TextArea's own handler, next in line)."""
        paths = dropped_paths(event.text)
        if paths:
            event.stop()
            event.prevent_default()
            self.post_message(self.Dropped(self, paths))

    def _drop_reissued_escape(self, event: events.Key) -> bool:
        """Take back a ``^`` that was an Esc. Textual's parser, given Esc and the
        next key in one read (the reading thread starved while a model loads,
        or a slow link), cannot tell them apart from an unknown sequence and
        types the Esc as ``^`` (``_xterm_parser.reissue_sequence_as_keys``);
        the keys of that read arrive microseconds apart, a typed ``^`` and
        the next key at typing speed."""
        caret, self._caret = self._caret, None
        if event.key == "circumflex_accent":
            self._caret = (event.time, self.cursor_location)
            return False
        if caret is None or event.time - caret[0] > REISSUE_S:
            return False
        row, column = caret[1]
        if self.cursor_location != (row, column + 1) or self.document.get_line(row)[column:column + 1] != "^":
            return False
        self.delete((row, column), (row, column + 1))
        return True

    def _recall(self, step: int) -> bool:
        """Up in an empty box (or one showing a recalled prompt, unchanged) shows
        the prompt before; Down the one after, then an empty box again."""
        showing = self._recalled is not None and self.sent[self._recalled] == self.text
        if not self.sent or not (showing or (step < 0 and not self.text)):
            return False
        index = (len(self.sent) if not showing else self._recalled) + step  # type: ignore[operator]
        if index >= len(self.sent):
            self._recalled = None
            self.load_text("")
            return True
        self._recalled = max(index, 0)
        self.load_text(self.sent[self._recalled])
        self.move_cursor(self.document.end)
        return True
