"""The cockpit's screens opened from its keys: help (F1), models (F2), settings
(F3) and saved sessions (F4), and what their answers change.

A mixin of ``LocalLLMApp`` (as ``controls.py`` is): the screens are Textual's; a
model switched, settings that need a reload and a session reopened go through
``reload_model`` (the session's load on its engine thread).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from textual import on
from textual.app import App, SystemCommand
from textual.reactive import reactive
from textual.screen import Screen

from localllm.chat import sessions
from localllm.cockpit.settings import Settings
from localllm.tui.chatview import ChatView
from localllm.tui.help import HelpScreen, app_keys
from localllm.tui.screens import ModelsScreen
from localllm.tui.sessions_screen import SessionsScreen
from localllm.tui.settings_screen import SettingsScreen, Switch

if TYPE_CHECKING:
    from localllm.chat.session import ChatSession
    from localllm.cockpit.session import CockpitSession
    from localllm.engine_api import Engine
    from localllm.mcp.agent import ToolChat
    from localllm.plan.hardware import Hardware


class ScreenActions(App):
    """F1 to F4 (a mixin of ``LocalLLMApp``)."""

    if TYPE_CHECKING:  # what the mixin uses of the app
        core: CockpitSession
        busy: reactive[bool]
        chat: ChatSession | None
        backend: Engine | None
        saved: sessions.SavedSession | None
        settings: Settings
        model_path: Path
        hardware: Hardware
        tool_chat: ToolChat | None

        def reload_model(self, path: Path | None = None, settings: Settings | None = None, *,
                         messages: list[dict[str, str]] | None = None, saved: sessions.SavedSession | None = None,
                         redraw: bool = False, image_refs: list[dict[str, Any]] | None = None) -> None: ...

        def tool_switches(self) -> list[Switch] | None: ...

        def set_tools_off(self, off: frozenset[str]) -> None: ...

        def start_servers(self, names: frozenset[str]) -> None: ...

        def action_attach(self) -> None: ...

        def compact_now(self, auto: bool = False) -> None: ...

    def action_help(self) -> None:
        if isinstance(self.screen, HelpScreen):
            self.screen.dismiss(None)
        else:
            self.push_screen(HelpScreen(app_keys(self.screen.active_bindings.values(), self)))

    def get_system_commands(self, screen: Screen) -> Iterable[SystemCommand]:
        """Textual's commands, with "Keys" opening the help screen: Textual's
        own keys panel lists the focused text box's editing keys first, and
        the cockpit's below the fold."""
        for command in super().get_system_commands(screen):
            if command.title != "Keys":
                yield command
        yield SystemCommand("Keys", "The cockpit's keys, and what each figure means (F1)", self.action_help)
        yield SystemCommand("Attach a file", "A picture, a text file or a PDF for the next message (Ctrl+F)", self.action_attach)
        yield SystemCommand("Compact", "Summarize the older turns with the model, keeping the last ones whole (/compact)", self.compact_now)

    # -- sessions ----------------------------------------------------------------------
    def open_session(self, saved: sessions.SavedSession) -> None:
        """Load the session's model with its settings and show its messages (once
        the model is loaded: a session whose model is gone changes nothing)."""
        # An unanswered last message (the app died mid-reply) is dropped: the reply in flight is what is lost.
        msgs = list(saved.messages)
        if msgs and msgs[-1]["role"] == "user":
            msgs.pop()
        settings = Settings.from_dict(saved.settings) if saved.settings else self.settings
        self.core.leave()  # the conversation left behind, as at quit
        self.reload_model(Path(saved.model), settings, messages=msgs, saved=saved, redraw=True, image_refs=list(saved.images))

    def wait_for_saves(self) -> None:
        """Block until the saves queued so far are on disk (call it off the UI
        thread): a reader of the session files must not see an older chat."""
        self.core.wait_for_saves()

    def action_sessions(self) -> None:

        def chosen(saved: sessions.SavedSession | None) -> None:
            if saved is not None:
                self.open_session(saved)

        if not self.busy:
            self.push_screen(SessionsScreen(self.wait_for_saves), chosen)

    @on(SessionsScreen.Renamed)
    def _session_renamed(self, msg: SessionsScreen.Renamed) -> None:
        """The open chat keeps its new name in its next save."""
        if self.saved is not None and self.saved.id == msg.session.id:
            self.saved.name = msg.session.name

    @on(SessionsScreen.Deleted)
    def _session_deleted(self, msg: SessionsScreen.Deleted) -> None:
        """The open chat's file is gone: its next message starts a new saved session, not the deleted one again."""
        if self.saved is not None and self.saved.id == msg.session_id:
            self.saved = None

    # -- settings and models ---------------------------------------------------------------
    def action_settings(self) -> None:
        planned = self.core.load_config.n_ctx if self.core.load_config is not None and self.settings.n_ctx is None else None
        screen = SettingsScreen(self.settings, self.tool_switches(), planned)

        def apply(new: Settings | None) -> None:
            if new is not None and screen.tools_off is not None:
                self.set_tools_off(screen.tools_off)
                self.start_servers(screen.servers_on)
            if new is None or new == self.settings:
                return
            if new.needs_reload(self.settings):
                self.query_one(ChatView).add("note", "these settings need the model reloaded: reloading")
                self.reload_model(settings=new, messages=self.chat.messages if self.chat else None, saved=self.saved)
                return
            self.settings = new
            self.tool_chat = None  # made again at the next message: its grammar joins the new sampling
            if self.chat is not None:
                self.chat.sampling = new.sampling()
                self.chat.sliding_window = new.sliding_window
                self.chat.thinking = new.thinking
                self.chat.keep_override = new.n_keep
                if new.system_prompt != (self.chat.system_prompt or ""):
                    self.chat.system_prompt = new.system_prompt or None
                    self.chat.clear()
                    self.query_one(ChatView).add("note", "system prompt changed: new chat")
                self.query_one(ChatView).add("note", "settings applied")

        if not self.busy:
            self.push_screen(screen, apply)

    def action_models(self) -> None:

        def switch(path: Path | None) -> None:
            if path and (path != self.model_path or self.backend is None):
                self.reload_model(path, redraw=True)

        if not self.busy:
            self.push_screen(ModelsScreen(self.model_path, self.hardware, self.settings), switch)
