"""The cockpit under Textual's Pilot: reading its panels, waiting for it, typing into it, the scripted app."""

from __future__ import annotations

from pathlib import Path

from localllm.testing import ScriptedEngine
from localllm.tui.app import LocalLLMApp, create_app
from localllm.tui.chatview import ChatView
from localllm.tui.settings import Settings
from localllm.tui.widgets import Lines


def panel_text(app: LocalLLMApp) -> str:
    return "\n".join(str(line) for w in app.query(Lines) for line in w.lines)


def chat_text(app: LocalLLMApp) -> list[tuple[str, str]]:
    return [(m.role, m.text) for m in app.query_one(ChatView).messages]


async def wait_idle(app: LocalLLMApp, pilot, timeout: float = 120.0) -> None:
    import asyncio

    waited = 0.0
    await pilot.pause(0.05)
    while app.busy or app.chat is None:
        await asyncio.sleep(0.05)
        waited += 0.05
        if waited > timeout:
            raise TimeoutError("the app stayed busy")
    await pilot.pause(0.05)


async def models_screen(app: LocalLLMApp, pilot, timeout: float = 30.0):
    """Open the models screen and wait for its worker's rows (the headers are
    read off the UI thread)."""
    import asyncio

    await pilot.press("f2")
    waited = 0.0
    while not getattr(app.screen, "models", None):
        await asyncio.sleep(0.05)
        waited += 0.05
        if waited > timeout:
            raise TimeoutError("the models screen listed nothing")
    await pilot.pause(0.1)
    return app.screen


async def send(app: LocalLLMApp, pilot, text: str) -> None:
    app.query_one("#prompt").value = text
    await pilot.press("enter")
    await pilot.pause(0.05)


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
    """F4, then wait until the worker has read the saved sessions."""
    import asyncio

    await pilot.press("f4")
    waited = 0.0
    while not app.screen.query("#title") or "reading" in str(app.screen.query_one("#title").render()):
        await asyncio.sleep(0.05)
        waited += 0.05
        if waited > timeout:
            raise TimeoutError("the sessions screen did not fill")
    await pilot.pause(0.05)


def scripted_app(synth_model: Path, **kw) -> tuple[LocalLLMApp, ScriptedEngine]:
    backend = ScriptedEngine(**kw)
    app = create_app(str(synth_model), vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt=""), backend_factory=lambda: backend)
    return app, backend


async def ask(app: LocalLLMApp, pilot, text: str) -> None:
    """Send ``text`` and wait for the whole reply."""
    await send(app, pilot, text)
    await wait_idle(app, pilot)
