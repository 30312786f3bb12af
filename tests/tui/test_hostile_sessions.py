"""The cockpit never dies on saved data or on what the user typed (issue 45 item 3):
a title is shown as text, never read as Rich markup, and a session file with an
impossible date or nested beyond reason is skipped and counted, under Pilot."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
from textual.widgets import OptionList

from localllm.chat import sessions
from localllm.tui.sessions_screen import SessionsScreen
from tests.helpers.tui import scripted_app, sessions_screen, until, wait_idle

TITLES = ["In BBCode, what does [/b] close?", "[link=https://example.invalid]click me[/link]", "\x1b[31mred\x1b[0m pasted", "[bold]not bold"]


def _save(model: Path, title: str, updated: float) -> sessions.SavedSession:
    s = sessions.SavedSession.new(str(model), None, {})
    s.messages = [{"role": "user", "content": title}, {"role": "assistant", "content": "ok"}]
    s.updated = updated
    sessions.save(s, touch=False)
    return s


def _raw(text: str, name: str) -> None:
    d = sessions.sessions_dir()
    d.mkdir(parents=True, exist_ok=True)
    (d / f"{name}.json").write_text(text, encoding="utf-8")


def _rows(app) -> list[str]:
    listed = app.screen.query_one("#sessions", OptionList)
    return [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)]


@pytest.mark.slow
async def test_markup_in_titles_is_text_and_bad_files_are_skipped(synth_model: Path) -> None:
    now = time.time()
    for i, title in enumerate(TITLES):
        _save(synth_model, title, now - i)
    good = {"model": str(synth_model), "messages": [{"role": "user", "content": "dated oddly"}]}
    _raw(json.dumps({**good, "updated": float("nan")}), "nan-date")  # Python writes NaN; json.loads reads it
    _raw(json.dumps({**good, "updated": 1e300}), "far-date")
    _raw(json.dumps({**good, "updated": 10**400}), "huge-int")
    _raw('{"model": "x", "messages": [], "settings": ' + "[" * 100_000 + "]" * 100_000 + "}", "deep")
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_idle(app, pilot)
        for _ in range(2):  # F4 again: the title that raised once raised every time after
            await sessions_screen(app, pilot)
            assert isinstance(app.screen, SessionsScreen)
            rows = _rows(app)
            titles = [r.split("\n")[0] for r in rows]
            assert titles[:4] == ["In BBCode, what does [/b] close?", "[link=https://example.invalid]click me[/link]",
                                  "\\x1b[31mred\\x1b[0m pasted", "[bold]not bold"], titles
            odd = [r for r in rows if r.startswith("dated oddly")]
            assert len(odd) == 3 and all("date unknown" in r for r in odd), odd  # NaN, 1e300, a 400-digit integer
            skipped = str(app.screen.query_one("#skipped").render())
            assert "skipped 1 damaged session file" in skipped and "deep.json" in skipped, skipped
            await pilot.press("escape")
            await until(pilot, lambda: not isinstance(app.screen, SessionsScreen), "closed the sessions screen on Esc", timeout=30)
        assert app.is_running
