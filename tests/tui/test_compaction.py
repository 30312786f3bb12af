"""Compaction in the cockpit under Pilot, on the scripted engine: /compact typed
in the box (never sent to the model), the automatic one after a reply at the
settings' fraction with a line saying so, the memory panel's figures, and the
setting on the settings screen (F3)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from textual.widgets import Button, Input

from localllm.compaction.split import SUMMARY_LABEL
from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings
from tests.helpers.tui import ask, chat_text, panel_text, scripted_app, send, settings_screen, until, wait_idle

LINE = r"compacted: [\d,]+ → [\d,]+ tokens in [\d.]+ s \(\d+ messages summarized, the last 2 turns kept\)"


def _notes(app) -> list[str]:
    return [text for role, text in chat_text(app) if role == "note"]


@pytest.mark.slow
async def test_typed_compact_summarizes_and_is_never_sent(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=5, itl_ms=1, tokens=12)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "/compact")
        await wait_idle(app, pilot)
        assert _notes(app)[-1] == "nothing to compact: the conversation is no longer than the 2 turns kept whole"
        for text in ("my locker code is 4817", "what a day", "tell me more", "and then?"):
            await ask(app, pilot, text)
        await send(app, pilot, "/compact")
        await until(pilot, lambda: re.fullmatch(LINE, _notes(app)[-1]), "said the compaction", detail=lambda: _notes(app)[-2:])
        await wait_idle(app, pilot)
        assert app.query_one("#prompt").value == ""  # taken from the box
        assert all(m["content"] != "/compact" for chat in backend.chats for m in chat)  # never the model's to read
        assert app.chat is not None and app.chat.messages[0]["content"].startswith(SUMMARY_LABEL)
        assert [m["content"] for m in app.chat.messages if m["role"] == "user"] == ["tell me more", "and then?"]
        assert re.search(r"compacted [\d,]+ → [\d,]+ tokens in [\d.]+ s", panel_text(app))
        await ask(app, pilot, "still there?")  # the chat goes on from the compacted conversation
        assert chat_text(app)[-1][0] == "assistant"
        await pilot.press("ctrl+l")
        await until(pilot, lambda: "compacted" not in panel_text(app), "dropped the old chat's compaction figures")


@pytest.mark.slow
async def test_the_context_at_the_fraction_compacts_after_the_reply_with_a_line(synth_model: Path) -> None:
    backend = ScriptedEngine(ttft_ms=5, itl_ms=1, tokens=12, n_ctx=200)
    app = create_app(str(synth_model), vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt="", compact_at=0.5),
                     backend_factory=lambda: backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(app, pilot)
        turns = 0
        while not any("compacting" in n for n in _notes(app)):
            await ask(app, pilot, f"message number {turns}")
            turns += 1
            assert turns < 12, _notes(app)
        await until(pilot, lambda: any(re.fullmatch(LINE, n) for n in _notes(app)), "compacted", detail=lambda: _notes(app)[-2:])
        await wait_idle(app, pilot)
        said = next(n for n in _notes(app) if "compacting" in n)
        assert re.fullmatch(r"the context is \d+% full: compacting the older turns into a summary the model writes \(auto at 50%; "
                            r"F3 sets it, or leaves it to the sliding window\)", said), said
        assert app.chat is not None and app.chat.context_used < 100 and not app.chat.shifts  # no window slid
        await ask(app, pilot, "and on")
        assert chat_text(app)[-1][0] == "assistant"


@pytest.mark.slow
async def test_the_setting_is_on_the_settings_screen(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await settings_screen(app, pilot)
        box = screen.query_one("#compact_at", Input)
        assert box.value == "0.85"
        box.value = "2"
        await pilot.click("#apply")
        await until(pilot, lambda: "compact at must be" in str(screen.query_one("#error").render()), "refused 2")
        assert "compact at must be a fraction of the context above 0 and at most 1 (e.g. 0.85), or blank for off, got 2" in str(
            screen.query_one("#error").render())
        box.value = ""
        screen.query_one("#apply", Button).press()  # a second click can land while the error line is laid out
        await until(pilot, lambda: app.settings.compact_at is None, "applied off", detail=lambda: (app.screen, app.settings.compact_at))
        assert backend.loads == 1  # no reload for it
