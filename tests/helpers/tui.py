"""The cockpit under Textual's Pilot: reading its panels, waiting for it, typing into it, the scripted app."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from localllm.testing import ScriptedEngine
from localllm.tui.app import LocalLLMApp, create_app
from localllm.tui.chatview import ChatView
from localllm.tui.screens import ModelsScreen
from localllm.tui.sessions_screen import SessionsScreen
from localllm.tui.settings import Settings
from localllm.tui.settings_screen import SettingsScreen
from localllm.tui.widgets import Lines

T = TypeVar("T")


def panel_text(app: LocalLLMApp) -> str:
    return "\n".join(str(line) for w in app.query(Lines) for line in w.lines)


def chat_text(app: LocalLLMApp) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in app.query_one(ChatView).messages]


async def until(pilot, predicate: Callable[[], T], what: str, timeout: float = 30.0, detail: Callable[[], object] | None = None) -> T:
    """Wait until ``predicate()`` is true and return what it gave: Textual first
    handles what is pending (``pilot.pause()``: the keys pressed, the messages
    they posted), then the predicate is polled, the event loop free in
    between (the workers' messages are handled meanwhile). Past ``timeout``
    seconds, a TimeoutError saying what never happened (``what``: "opened the
    settings screen"), with ``detail()`` (what was there instead) if given.
    A deadline costs time only when something is broken: make it generous."""
    deadline = time.monotonic() + timeout
    await pilot.pause()
    while not (value := predicate()):
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:g} s: the cockpit never {what}" + (f" ({detail()!r})" if detail is not None else ""))
        await asyncio.sleep(0.005)
    return value


def laid_out(screen, selector: str) -> bool:
    """``selector`` is on ``screen`` and has a place on it (a click there lands)."""
    found = screen.query(selector)
    return bool(found) and found.first().region.area > 0


async def wait_idle(app: LocalLLMApp, pilot, timeout: float = 120.0) -> None:
    """Wait until no model loads and no reply streams, with a chat open; then
    let Textual draw what that changed."""
    await until(pilot, lambda: not app.busy and app.chat is not None and all(v.drawn_whole for v in app.screen_stack[0].query(ChatView)),
                "went idle with a model loaded and the reply drawn", timeout,
                detail=lambda: f"busy={app.busy}, chat open={app.chat is not None}, last line={chat_text(app)[-1:]}")
    await pilot.pause()


async def models_screen(app: LocalLLMApp, pilot, timeout: float = 30.0):
    """Open the models screen and wait for its worker's rows (the headers are
    read off the UI thread)."""
    await pilot.press("f2")
    await until(pilot, lambda: isinstance(app.screen, ModelsScreen) and app.screen.models, "listed the models on the models screen", timeout)
    await pilot.pause()
    return app.screen


async def settings_screen(app: LocalLLMApp, pilot, timeout: float = 30.0) -> SettingsScreen:
    """F3, then wait until the (new) settings screen is laid out: its Apply button placed."""
    before = app.screen

    def shown() -> SettingsScreen | None:
        screen = app.screen
        return screen if screen is not before and isinstance(screen, SettingsScreen) and laid_out(screen, "#apply") else None

    await pilot.press("f3")
    screen = await until(pilot, shown, "opened the settings screen", timeout, detail=lambda: app.screen)
    assert screen is not None
    return screen


async def send(app: LocalLLMApp, pilot, text: str) -> None:
    """Type ``text`` into the prompt and press Enter; return once the app has
    answered it: the text taken from the box (sent), or a line or a toast
    saying why not."""
    box = app.query_one("#prompt")
    view = app.query_one(ChatView)
    box.value = text
    lines = len(view.messages)
    toasts = {n.identity for n in app._notifications}  # Textual's, shown or not (run_test(notifications=False))

    def answered() -> bool:
        return box.value != text or len(view.messages) != lines or any(n.identity not in toasts for n in app._notifications)

    await pilot.press("enter")
    await until(pilot, answered, f"answered the Enter that sends {text!r}")


def spy_on_ui_thread(monkeypatch, module, name: str) -> list[bool]:
    """Replace ``module.name`` with a pass-through that records, per call,
    whether it ran on the UI (main) thread."""
    import threading

    calls: list[bool] = []
    real = getattr(module, name)

    def spy(*args, **kw):
        calls.append(threading.current_thread() is threading.main_thread())
        return real(*args, **kw)

    monkeypatch.setattr(module, name, spy)
    return calls


async def sessions_screen(app: LocalLLMApp, pilot, timeout: float = 30.0) -> None:
    """F4, then wait until the (new) sessions screen's worker has read the saved sessions."""
    before = app.screen

    def filled() -> bool:
        screen = app.screen
        if screen is before or not isinstance(screen, SessionsScreen) or not screen.query("#title"):
            return False
        return "reading" not in str(screen.query_one("#title").render())

    await pilot.press("f4")
    await until(pilot, filled, "listed the saved sessions on the sessions screen", timeout)
    await pilot.pause()


def scripted_app(synth_model: Path, **kw) -> tuple[LocalLLMApp, ScriptedEngine]:
    backend = ScriptedEngine(**kw)
    app = create_app(str(synth_model), vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt=""), backend_factory=lambda: backend)
    return app, backend


async def ask(app: LocalLLMApp, pilot, text: str) -> None:
    """Send ``text`` and wait for the whole reply."""
    await send(app, pilot, text)
    await wait_idle(app, pilot)
