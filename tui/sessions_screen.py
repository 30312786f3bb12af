"""The saved sessions screen (F4): list, search, open, rename, delete, export.

Each row shows what people pick a chat by, as oterm's and LM Studio's lists do:
its title (the name given, or its first message), the date it was last saved,
the model and the number of turns. The files are read in a worker and arrive
in a message; renames, deletions and exports also run off the UI thread. A
deletion is confirmed first; an export never replaces a file. The app hears of
a rename or deletion of the chat it has open (``Renamed``, ``Deleted``) so its
next save neither loses the name nor brings the file back.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path

from rich.text import Text
from textual import on, work
from textual.app import ComposeResult
from textual.containers import Horizontal, Vertical
from textual.message import Message
from textual.screen import ModalScreen
from textual.widgets import Button, Input, Label, OptionList, Static
from textual.widgets.option_list import Option

from localllm.chat import sessions
from localllm.errors import InputError
from localllm.tui.saved import printable, reason, scan


def row(s: sessions.SavedSession) -> Text:
    """Two lines: the title, then date · model · turns (wrapped by the list, never cut).
    Plain text, never Rich markup: a title is what the user typed ("what does [/b]
    close?"), and as markup it raised MarkupError or became a link."""
    return plain(printable(s.title) + "\n" + printable(f"  {when(s.updated)} · {Path(s.model).name} · {_turns(s)}"))


def plain(text: str) -> Text:
    """``text`` as it is: a Label, a Static or an option given a str reads it as markup."""
    return Text(text)


def when(t: float) -> str:
    """A saved time for the list; "date unknown" where the clock cannot show it."""
    t = sessions.stamp(t)  # 0.0 for anything a clock cannot show, so localtime cannot fail
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "date unknown"


def _turns(s: sessions.SavedSession) -> str:
    return f"{s.turns} turn{'' if s.turns == 1 else 's'}"


class AskScreen(ModalScreen[str | None]):
    """One line of text (a name, a file path): Enter gives it, Esc gives None."""

    DEFAULT_CSS = """
    AskScreen { align: center middle; }
    AskScreen > Vertical { width: 76; max-width: 100%; height: auto; border: thick $primary; background: $surface; padding: 0 1; }
    AskScreen Label { width: 100%; }
    """
    BINDINGS = [("escape", "cancel", "Cancel")]

    def __init__(self, question: str, value: str) -> None:
        super().__init__()
        self.question, self.value = question, value

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(plain(self.question))  # a title inside it is text, not markup
            yield Input(self.value, id="answer")
            yield Label("Enter: done · Esc: cancel")

    @on(Input.Submitted)
    def _done(self, event: Input.Submitted) -> None:
        self.dismiss(event.value)

    def action_cancel(self) -> None:
        self.dismiss(None)


class ConfirmScreen(ModalScreen[bool]):
    """A yes/no question for what cannot be undone; No is the default."""

    DEFAULT_CSS = """
    ConfirmScreen { align: center middle; }
    ConfirmScreen > Vertical { width: 60; max-width: 100%; height: auto; border: thick $error; background: $surface; padding: 0 1; }
    ConfirmScreen Label { width: 100%; margin-bottom: 1; }
    ConfirmScreen Horizontal { height: auto; }
    ConfirmScreen Button { margin-right: 2; }
    """
    BINDINGS = [("escape,n", "answer(False)", "No"), ("y", "answer(True)", "Yes")]

    def __init__(self, question: str) -> None:
        super().__init__()
        self.question = question

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label(plain(self.question))  # a title inside it is text, not markup
            with Horizontal():
                yield Button("Delete (y)", variant="error", id="yes", compact=True)
                yield Button("Keep (n)", id="no", compact=True)

    def on_mount(self) -> None:
        self.query_one("#no", Button).focus()

    @on(Button.Pressed)
    def _pressed(self, event: Button.Pressed) -> None:
        self.dismiss(event.button.id == "yes")

    def action_answer(self, yes: bool) -> None:
        self.dismiss(yes)


class SessionsScreen(ModalScreen[sessions.SavedSession | None]):
    """Saved chats, newest first; Enter reopens one. Damaged files are listed
    below as skipped, each with what is wrong; the chosen session is returned
    as read, not read again."""

    DEFAULT_CSS = """
    SessionsScreen { align: center middle; }
    SessionsScreen > Vertical { width: 100; max-width: 100%; height: 100%; border: thick $primary; background: $surface; padding: 0 1; }
    SessionsScreen #search { margin: 1 0; }
    SessionsScreen OptionList { height: 1fr; }
    SessionsScreen #status { height: auto; }
    SessionsScreen #skipped { color: $warning; height: auto; max-height: 5; }
    """
    BINDINGS = [("escape", "cancel", "Cancel"), ("slash", "search", "Search"), ("r", "rename", "Rename"),
                ("d,delete", "delete", "Delete"), ("e", "export", "Export")]

    class Scanned(Message):
        """The worker's sessions (newest first) and one notice per skipped file."""

        def __init__(self, saved: list[sessions.SavedSession], skipped: list[str]) -> None:
            super().__init__()
            self.saved, self.skipped = saved, skipped

    class Renamed(Message):
        """A session was renamed (the app updates the chat it has open)."""

        def __init__(self, session: sessions.SavedSession) -> None:
            super().__init__()
            self.session = session

    class Deleted(Message):
        """A session's file was deleted (the app stops saving the chat it has open there)."""

        def __init__(self, session_id: str) -> None:
            super().__init__()
            self.session_id = session_id

    class Said(Message):
        """A disk task's outcome, one line for the status line."""

        def __init__(self, text: str) -> None:
            super().__init__()
            self.text = text

    def __init__(self, before_reading: Callable[[], None] | None = None) -> None:
        """``before_reading`` runs in the worker first: the cockpit's saves still
        queued on its disk thread land before the files are read."""
        super().__init__()
        self._before_reading = before_reading
        self._saved: dict[str, sessions.SavedSession] = {}  # newest first

    def compose(self) -> ComposeResult:
        with Vertical():
            yield Label("Saved sessions · reading …", id="title")
            yield Label("Enter open · / search · r rename · d delete · e export (Markdown) · Esc back", id="keys")
            yield Input(placeholder="search the text of every chat", id="search", compact=True)
            yield OptionList(id="sessions")
            yield Static("", id="status")
            yield Static("", id="skipped")

    def on_mount(self) -> None:
        self.query_one("#skipped", Static).display = False
        self._scan()

    @work(thread=True, exclusive=True, group="sessions", exit_on_error=False)
    def _scan(self) -> None:

        if self._before_reading is not None:
            self._before_reading()
        self.post_message(self.Scanned(*scan()))

    @on(Scanned)
    def _show(self, msg: Scanned) -> None:

        self._saved = {s.id: s for s in msg.saved}
        self._fill()
        self.query_one("#sessions", OptionList).focus()
        if msg.skipped:
            n = len(msg.skipped)
            skipped = self.query_one("#skipped", Static)
            skipped.update(plain(f"skipped {n} damaged session file{'s' if n > 1 else ''}: " + "; ".join(msg.skipped)))
            skipped.display = True

    def _fill(self, keep: str | None = None) -> None:
        """List the sessions the search matches (newest first), the highlight on
        ``keep`` if it is still listed, else on the newest."""
        text = self.query_one("#search", Input).value.strip()
        shown = [s for s in self._saved.values() if not text or s.matches(text)]
        what = f"{len(shown)} of {len(self._saved)} match" if text else f"{len(shown)}"
        self.query_one("#title", Label).update(f"Saved sessions ({what})")
        listed = self.query_one("#sessions", OptionList)
        listed.clear_options()
        listed.add_options([Option(row(s), id=s.id) for s in shown])
        ids = [s.id for s in shown]
        if ids:
            listed.highlighted = ids.index(keep) if keep in ids else 0  # Enter opens the newest

    @on(Input.Changed, "#search")
    def _search(self) -> None:
        self._fill()

    @on(Input.Submitted, "#search")
    def _to_list(self) -> None:
        self.query_one("#sessions", OptionList).focus()

    def _chosen(self) -> sessions.SavedSession | None:
        listed = self.query_one("#sessions", OptionList)
        if listed.highlighted is None or not listed.option_count:
            return None
        return self._saved.get(listed.get_option_at_index(listed.highlighted).id or "")

    @on(OptionList.OptionSelected)
    def _pick(self, event: OptionList.OptionSelected) -> None:
        self.dismiss(self._saved.get(event.option.id or ""))

    def action_search(self) -> None:
        self.query_one("#search", Input).focus()

    def action_rename(self) -> None:
        s = self._chosen()
        if s is None:
            return

        def named(name: str | None) -> None:
            if name is not None and name.strip() != s.title:
                self._rename(replace(s, name=" ".join(name.split()) or None))

        self.app.push_screen(AskScreen(f"New name for “{printable(s.title)}” (blank: its first message)", s.title), named)

    @work(thread=True, group="sessions-disk", exit_on_error=False)
    def _rename(self, s: sessions.SavedSession) -> None:
        try:
            sessions.save(s, touch=False)
        except (OSError, InputError) as exc:
            self.post_message(self.Said(f"not renamed: {reason(exc)}"))
            return
        self.post_message(self.Renamed(s))

    @on(Renamed)
    def _renamed(self, msg: Renamed) -> None:
        self._saved[msg.session.id] = msg.session
        self._fill(keep=msg.session.id)
        self.query_one("#status", Static).update(plain(printable(f"renamed: {msg.session.title}")))

    def action_delete(self) -> None:
        s = self._chosen()
        if s is None:
            return

        def answered(yes: bool | None) -> None:
            if yes:
                self._delete(s)

        self.app.push_screen(ConfirmScreen(printable(f"Delete “{s.title}” ({_turns(s)})? This cannot be undone.")), answered)

    @work(thread=True, group="sessions-disk", exit_on_error=False)
    def _delete(self, s: sessions.SavedSession) -> None:
        try:
            sessions.delete(s.id)
        except (OSError, InputError) as exc:
            self.post_message(self.Said(f"not deleted: {reason(exc)}"))
            return
        self.post_message(self.Deleted(s.id))

    @on(Deleted)
    def _deleted(self, msg: Deleted) -> None:
        gone = self._saved.pop(msg.session_id, None)
        self._fill()
        self.query_one("#status", Static).update(plain(printable(f"deleted: {gone.title if gone else msg.session_id}")))

    def action_export(self) -> None:
        s = self._chosen()
        if s is None:
            return

        def where(path: str | None) -> None:
            if path is not None and path.strip():
                self._export(s, Path(path.strip()))

        self.app.push_screen(AskScreen("Export to this Markdown file (a new file):", str(sessions.export_path(s))), where)

    @work(thread=True, group="sessions-disk", exit_on_error=False)
    def _export(self, s: sessions.SavedSession, target: Path) -> None:
        try:
            done = sessions.export(s, target)
        except FileExistsError:
            self.post_message(self.Said(f"not exported: {target} exists (nothing replaced): give another name"))
        except FileNotFoundError:
            self.post_message(self.Said(f"not exported: no folder {target.expanduser().parent}"))
        except OSError as exc:
            self.post_message(self.Said(f"not exported: {reason(exc)}"))
        else:
            self.post_message(self.Said(f"exported to {done}"))

    @on(Said)
    def _said(self, msg: Said) -> None:
        self.query_one("#status", Static).update(plain(printable(msg.text)))

    def action_cancel(self) -> None:
        self.dismiss(None)
