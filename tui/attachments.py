"""Images and files in the cockpit, the Textual half: the chips above the prompt
box, the forecast line, the screen that asks for a path and the one that offers
a reload. What is attached, read, counted and sent is the core's
(``localllm.cockpit.attachments``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rich.text import Text
from textual import on
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical, VerticalScroll
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, Static

from localllm.cockpit.attachments import Pending, dropped_paths
from localllm.tui.widgets import Lines


# -- widgets ----------------------------------------------------------------------------
class ChipClose(Static):
    """The ✕ of a chip: a click removes the attachment."""

    DEFAULT_CSS = """
    ChipClose { width: 3; height: 1; color: $text-error; }
    ChipClose:hover { text-style: bold reverse; }
    """

    def __init__(self, chip_id: int) -> None:
        super().__init__(" ✕")
        self.chip_id = chip_id

    def on_click(self) -> None:
        self.post_message(AttachBar.Remove(self.chip_id))


class Chip(Horizontal):
    """One attachment: what it is, its name, size and tokens, and its ✕."""

    DEFAULT_CSS = """
    Chip { height: 1; width: auto; }
    Chip .chip-text { width: auto; height: 1; color: $text-accent; }
    """

    def __init__(self, pending: Pending) -> None:
        super().__init__()
        self.pending = pending

    @staticmethod
    def label(pending: Pending) -> Text:
        icon = "▣" if pending.image is not None else "♪" if pending.audio is not None else "▤"
        return Text(f"{icon} {pending.kind} {pending.chip()}")

    def compose(self) -> ComposeResult:
        yield Static(self.label(self.pending), classes="chip-text")
        yield ChipClose(self.pending.id)

    def show(self, pending: Pending) -> None:
        self.pending = pending
        for w in self.query(".chip-text").results(Static):
            w.update(self.label(pending))


class AttachBar(VerticalScroll):
    """The chips above the prompt box, one a row (hidden when there is none)."""

    DEFAULT_CSS = """
    AttachBar { height: auto; max-height: 4; padding: 0 1; display: none; }
    AttachBar.-some { display: block; }
    """

    class Remove(Message):
        def __init__(self, chip_id: int) -> None:
            super().__init__()
            self.chip_id = chip_id

    def __init__(self, **kw: Any) -> None:
        super().__init__(**kw)
        self.shown: list[Pending] = []

    def show(self, chips: Sequence[Pending]) -> None:
        """The chips of ``chips``: those gone removed, those changed redrawn, new ones added at the end."""
        want = {c.id: c for c in chips}
        have = {w.pending.id: w for w in self.query(Chip) if w.pending.id in {c.id for c in self.shown}}
        for cid, w in have.items():
            if cid in want:
                w.show(want[cid])
            else:
                w.remove()
        new = [Chip(c) for c in chips if c.id not in have]
        if new:
            self.mount_all(new)
        self.shown = list(chips)
        self.set_class(bool(chips), "-some")

    @property
    def texts(self) -> list[str]:
        """The chips' text, as shown (for tests)."""
        return [Chip.label(c).plain for c in self.shown]


class ForecastLine(Lines):
    """Before Enter: the prompt's new tokens and the TTFT forecast; while a long
    prompt is read: its progress; after the reply: forecast against measured."""

    DEFAULT_CSS = """
    ForecastLine { height: auto; padding: 0 1; color: $text-muted; display: none; }
    ForecastLine.-some { display: block; }
    """

    def __init__(self, **kw: object) -> None:
        super().__init__(1, max_rows=2, **kw)
        self.text = ""

    def say(self, text: str, *, warn: bool = False) -> None:
        if text == self.text and self.has_class("-some") == bool(text):
            return
        self.text = text
        self.lines = (Text(text, style="bold yellow") if warn else text,)
        self.set_class(bool(text), "-some")


# -- screens ----------------------------------------------------------------------------
class AttachScreen(ModalScreen[list[str] | None]):
    """The attach key's prompt: a file's path (Enter attaches, Esc cancels)."""

    DEFAULT_CSS = """
    AttachScreen { align: center middle; }
    AttachScreen > Vertical { width: 80; max-width: 100%; height: auto; border: round $primary; padding: 0 1; background: $surface; }
    AttachScreen Label { width: 100%; color: $text-muted; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, vision: bool, audio: bool = False) -> None:
        super().__init__()
        self.vision = vision
        self.audio = audio  # the projector has an audio encoder: sound files are offered

    def compose(self) -> ComposeResult:
        with Vertical() as box:
            box.border_title = "Attach a file"
            what = "a picture (PNG, JPEG, WebP, GIF), " if self.vision else ""
            what += "a sound file (WAV, MP3, FLAC), " if self.audio else ""
            yield Label(f"Its path: {what}a text file or a PDF. Enter attaches it, Esc cancels. "
                        "A path pasted or dropped into the message box attaches too.")
            yield Input(placeholder="~/notes.md", id="attach-path")

    def on_mount(self) -> None:
        self.query_one(Input).focus()

    @on(Input.Submitted, "#attach-path")
    def _submitted(self, event: Input.Submitted) -> None:
        value = event.value.strip()
        if not value:
            self.dismiss(None)
            return
        paths = dropped_paths(value)  # quoted, escaped, a file:// URL, or several: as a paste is read
        if paths is None and len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]
        self.dismiss([str(p) for p in paths] if paths else [value])

    def action_cancel(self) -> None:
        self.dismiss(None)


class ReloadConfirm(ModalScreen[bool]):
    """The message does not fit the context: reload with a context and a KV cache type that would hold it?"""

    DEFAULT_CSS = """
    ReloadConfirm { align: center middle; }
    ReloadConfirm > Vertical { width: 80; max-width: 100%; height: auto; border: round $primary; padding: 1 2; background: $surface; }
    ReloadConfirm Label { width: 100%; }
    ReloadConfirm Horizontal { height: auto; margin-top: 1; }
    ReloadConfirm Button { margin-right: 2; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, line: str, n_ctx: int, kv: str) -> None:
        super().__init__()
        self.line, self.n_ctx, self.kv = line, n_ctx, kv

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(self.line, id="reload-why")
            yield Label(f"Reload the model with a context of {self.n_ctx:,} and the KV cache in {self.kv}? "
                        "The chat and the attachments are kept.", id="reload-what")
            with Horizontal():
                yield Button("Reload", variant="primary", id="reload-go")
                yield Button("Cancel", id="reload-cancel")

    @on(Button.Pressed, "#reload-go")
    def _go(self) -> None:
        self.dismiss(True)

    @on(Button.Pressed, "#reload-cancel")
    def action_cancel(self) -> None:
        self.dismiss(False)
