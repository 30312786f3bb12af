"""The settings screen (F3) under Pilot: its tabs fit 80×24, the sampling tab
reaches the engine without a reload and is saved with the session, a bad value
is one line naming the field, the system prompt takes several lines."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.containers import Vertical
from textual.widgets import Input, Label, TabbedContent, TextArea

from localllm.chat import sessions
from localllm.engine_api import SamplingConfig
from localllm.tui.settings_screen import SettingsScreen
from tests.helpers.tui import chat_text, laid_out, scripted_app, send, sessions_screen, settings_screen, until, wait_idle

ASKED = {"temperature": "0.3", "top_k": "7", "top_p": "0.5", "min_p": "0.2", "repeat_penalty": "1.3", "max_tokens": "4", "seed": "42"}
WANT = SamplingConfig(temperature=0.3, top_k=7, top_p=0.5, min_p=0.2, repeat_penalty=1.3, max_tokens=4, seed=42)


async def _ask(app, pilot, text: str) -> None:
    await send(app, pilot, text)
    await wait_idle(app, pilot)


async def _show(pilot, screen: SettingsScreen, tab: str) -> None:
    """Show ``tab`` and wait until it is laid out."""
    screen.query_one(TabbedContent).active = tab
    await until(pilot, lambda: laid_out(screen, f"#{tab}"), f"showed the {tab}", timeout=30)


async def _open(app, pilot, tab: str | None = None) -> SettingsScreen:
    screen = await settings_screen(app, pilot)
    assert isinstance(screen, SettingsScreen)
    if tab is not None:
        await _show(pilot, screen, tab)
    return screen


@pytest.mark.slow
async def test_sampling_reaches_the_engine_and_the_saved_session(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=6)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await _open(app, pilot, "sampling-tab")
        for field, value in ASKED.items():
            screen.query_one(f"#{field}", Input).value = value
        await pilot.click("#apply")
        await wait_idle(app, pilot)
        await _ask(app, pilot, "hello")
        assert backend.sampling == WANT and backend.loads == 1  # sampling needs no reload
        assert [t for r, t in chat_text(app) if r == "assistant"][-1].split() == ["tok0", "tok1", "tok2", "tok3"]  # max tokens 4
        app.wait_for_saves()
    saved = sessions.list_sessions()[0].settings
    assert {k: saved[k] for k in ASKED} == {"temperature": 0.3, "top_k": 7, "top_p": 0.5, "min_p": 0.2, "repeat_penalty": 1.3,
                                            "max_tokens": 4, "seed": 42}
    app2, backend2 = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=6)
    async with app2.run_test(size=(80, 24)) as pilot:
        await wait_idle(app2, pilot)
        await sessions_screen(app2, pilot)
        await pilot.press("enter")
        await wait_idle(app2, pilot)
        await _ask(app2, pilot, "again")
        assert backend2.sampling == WANT


@pytest.mark.slow
@pytest.mark.parametrize("field, value, said, tab", [
    ("top_p", "1.5", "top-p must be from 0.0 to 1.0, got 1.5", "sampling-tab"),
    ("repeat_penalty", "0", "repeat penalty must be above 0 (1.0 is off), got 0", "sampling-tab"),
    ("max_tokens", "0", "max tokens must be -1 (until the model stops) or at least 1, got 0", "sampling-tab"),
    ("seed", "99999999999", "seed must be from 0 to 4294967295, got 99999999999", "sampling-tab"),
    ("n_ctx", "0", "context tokens must be at least 1, got 0", "model-tab"),
])
async def test_a_bad_value_is_one_line_and_shows_its_tab(synth_model: Path, field: str, value: str, said: str, tab: str) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        before = app.settings
        other = "system-tab" if tab == "model-tab" else "model-tab"
        screen = await _open(app, pilot, other)
        screen.query_one(f"#{field}", Input).value = value
        await pilot.click("#apply")
        await until(pilot, lambda: app.focused is screen.query_one(f"#{field}"), f"focused the field with the bad value ({field})", timeout=30,
                    detail=lambda: (str(screen.query_one("#error").render()), app.focused))
        assert app.screen is screen and app.settings == before  # nothing applied, the screen stays
        assert str(screen.query_one("#error").render()) == f"not applied: {said}"
        assert screen.query_one(TabbedContent).active == tab and app.focused is screen.query_one(f"#{field}")


@pytest.mark.slow
async def test_the_system_prompt_takes_several_lines(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await _open(app, pilot, "system-tab")
        box = screen.query_one("#system_prompt", TextArea)
        box.focus()
        await pilot.press(*"Be brief.", "enter", *"Answer in French.")
        await pilot.click("#apply")
        await wait_idle(app, pilot)
        assert app.settings.system_prompt == "Be brief.\nAnswer in French."
        await _ask(app, pilot, "hi")
        assert app.chat.messages[0] == {"role": "system", "content": "Be brief.\nAnswer in French."}


@pytest.mark.slow
async def test_every_tab_fits_80x24(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await _open(app, pilot)
        frame = screen.query_one(Vertical)
        for tab in ("model-tab", "sampling-tab", "system-tab"):
            await _show(pilot, screen, tab)
            assert frame.max_scroll_y == 0, tab  # nothing to scroll to
            shown = [w for w in screen.query_one(f"#{tab}").query("*") if w.display] + list(screen.query("Button"))
            assert len(shown) > 3
            for w in shown:
                r = w.region
                assert r.width > 0 and r.height > 0 and r.right <= 80 and r.bottom <= 24, (tab, w, r)
            for label in screen.query_one(f"#{tab}").query(Label):
                text = str(label.render())
                assert label.region.width >= len(text) and label.region.right < frame.region.right, (tab, text)  # not cut


def test_an_older_session_opens_with_the_defaults_and_bad_values_fall_back() -> None:
    from localllm.tui.settings import Settings

    older = Settings.from_dict({"n_ctx": 2048, "temperature": 0.7, "max_tokens": 512})  # saved before top-k & co.
    assert older.n_ctx == 2048 and older.sampling() == SamplingConfig(temperature=0.7, max_tokens=512)
    hand_edited = Settings.from_dict({"top_k": 2.5, "top_p": 2, "min_p": "0.1", "repeat_penalty": 0, "seed": 2**40,
                                      "max_tokens": 0, "temperature": float("nan")})
    assert hand_edited.sampling() == SamplingConfig()
    kept = Settings.from_dict({"top_k": 0, "top_p": 1, "min_p": 0, "repeat_penalty": 1.1, "seed": 0, "max_tokens": -1})
    assert kept.sampling() == SamplingConfig(top_k=0, top_p=1.0, min_p=0.0, repeat_penalty=1.1, seed=0, max_tokens=-1)
    assert type(kept.top_p) is float


@pytest.mark.slow
async def test_a_blank_context_is_the_plans_and_shown_as_what_it_chose(synth_model: Path) -> None:
    """No context set: the plan decides it (``fitting.default_ctx``); the box stays
    blank with the context the plan chose in it, and Apply with it blank reloads nothing."""
    from localllm.testing import ScriptedEngine
    from localllm.tui.app import create_app
    from localllm.tui.settings import Settings

    backend = ScriptedEngine(ttft_ms=5, itl_ms=5, tokens=2)
    app = create_app(str(synth_model), vram=4 * 1024**3, settings=Settings(system_prompt=""), backend_factory=lambda: backend)
    async with app.run_test(size=(120, 40)) as pilot:
        await wait_idle(app, pilot)
        planned = app.load_config.n_ctx
        assert app.settings.n_ctx is None and any(f"context {planned} ·" in t for r, t in chat_text(app) if r == "note")
        screen = await _open(app, pilot, "model-tab")
        box = screen.query_one("#n_ctx", Input)
        assert box.value == "" and box.placeholder == f"the plan's: {planned:,}"
        await pilot.click("#apply")
        await until(pilot, lambda: not isinstance(app.screen, SettingsScreen), "closed the settings screen on Apply")
        assert backend.loads == 1 and app.settings.n_ctx is None
