"""The sessions screen (F4) under Pilot: rows with date, model and turns at
80×24, search over every message, rename, delete with confirmation, export to
a Markdown file that never replaces one."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from textual.containers import Vertical
from textual.widgets import Input, Label, OptionList

from localllm.chat import sessions
from localllm.tui.sessions_screen import AskScreen, ConfirmScreen, SessionsScreen
from tests.helpers.tui import scripted_app, send, sessions_screen, until, wait_idle

DAY = 86400.0
CHATS = [  # title (first message), reply, days ago
    ("Plan a trip to Lisbon", "Day one: Alfama.", 1),
    ("Fruit list", "apples, pears and plums", 2),
    ("Explain KV caches", "Keys and values per token.", 3),
]


def _stored(model: Path) -> list[sessions.SavedSession]:
    """Three saved chats, newest first, each with a fixed date."""
    out = []
    for title, reply, ago in CHATS:
        s = sessions.SavedSession.new(str(model), None, {})
        s.messages = [{"role": "user", "content": title}, {"role": "assistant", "content": reply},
                      {"role": "user", "content": "thanks"}, {"role": "assistant", "content": "welcome"}]
        s.updated = time.time() - ago * DAY
        sessions.save(s, touch=False)
        out.append(s)
    return out


def _rows(app) -> list[str]:
    listed = app.screen.query_one("#sessions", OptionList)
    return [str(listed.get_option_at_index(i).prompt) for i in range(listed.option_count)]


async def _status(app, pilot, needle: str) -> str:
    def text() -> str:
        status = app.screen.query("#status")
        return str(status.first().render()) if status else ""

    await until(pilot, lambda: needle in text(), f"said {needle!r} on the status line", timeout=30, detail=text)
    return text()


async def _asked(app, pilot) -> AskScreen:
    """The AskScreen the key just pressed opens, once its answer box has the focus (Enter gives it)."""
    await until(pilot, lambda: isinstance(app.screen, AskScreen) and getattr(app.focused, "id", None) == "answer",
                "asked (an AskScreen with its answer box focused)", timeout=30, detail=lambda: (app.screen, app.focused))
    return app.screen


async def _answer(app, pilot, text: str) -> None:
    """Type ``text`` into the open AskScreen, replacing its value, and press Enter."""
    assert isinstance(app.screen, AskScreen)
    app.screen.query_one("#answer", Input).value = text
    await pilot.press("enter")
    await until(pilot, lambda: not isinstance(app.screen, AskScreen), "closed the question once answered", timeout=30)


@pytest.mark.slow
async def test_rows_show_date_model_and_turns_at_80x24(synth_model: Path) -> None:
    stored = _stored(synth_model)
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        day = time.strftime("%Y-%m-%d", time.localtime(stored[0].updated))
        rows = _rows(app)
        assert len(rows) == 3 and rows[0].startswith("Plan a trip to Lisbon\n")
        assert f"  {day} " in rows[0] and "· synth-llama.gguf · 2 turns" in rows[0]
        screen = app.screen
        frame = screen.query_one(Vertical).region
        assert frame.right <= 80 and frame.bottom <= 24
        for label in screen.query(Label):
            text = str(label.render())
            assert label.region.width >= len(text) and label.region.right < frame.right, text  # not cut
        assert screen.query_one("#sessions", OptionList).region.height >= 6  # room for the rows


@pytest.mark.slow
async def test_search_finds_text_in_any_message(synth_model: Path) -> None:
    _stored(synth_model)
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("slash", *"PEARS")  # a word of a reply, another case
        await until(pilot, lambda: "1 of 3 match" in str(app.screen.query_one("#title").render()), "counted 1 of 3 matching PEARS", timeout=30,
                    detail=lambda: str(app.screen.query_one("#title").render()))
        assert [r.split("\n")[0] for r in _rows(app)] == ["Fruit list"]
        assert "1 of 3 match" in str(app.screen.query_one("#title").render())
        await pilot.press("enter", "enter")  # to the list, then open the match
        await wait_idle(app, pilot)
        assert app.chat.messages[0]["content"] == "Fruit list"


@pytest.mark.slow
async def test_rename_keeps_the_order_and_the_open_chat_keeps_the_name(synth_model: Path) -> None:
    stored = _stored(synth_model)
    app, _ = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=2)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("down", "r")
        await _asked(app, pilot)
        await _answer(app, pilot, "Groceries")
        await _status(app, pilot, "renamed: Groceries")
        assert [r.split("\n")[0] for r in _rows(app)] == ["Plan a trip to Lisbon", "Groceries", "Explain KV caches"]
        assert sessions.load(stored[1].id).name == "Groceries" and sessions.load(stored[1].id).updated == stored[1].updated
        await pilot.press("enter")  # open it, rename it again while open, then chat on
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("down", "r")  # opening it saved nothing: it is still second
        await _asked(app, pilot)
        await _answer(app, pilot, "Weekly groceries")
        await _status(app, pilot, "renamed")
        await pilot.press("escape")
        await send(app, pilot, "and bread")
        await wait_idle(app, pilot)
        app.wait_for_saves()
    again = sessions.load(stored[1].id)
    assert again.name == "Weekly groceries" and again.messages[-2]["content"] == "and bread"


@pytest.mark.slow
async def test_delete_asks_first(synth_model: Path, _isolated_home: Path) -> None:
    stored = _stored(synth_model)
    app, _ = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=2)
    files = _isolated_home / "sessions"
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("d")
        await until(pilot, lambda: isinstance(app.screen, ConfirmScreen) and getattr(app.focused, "id", None) == "no",
                    "asked to confirm (Keep focused)", timeout=30, detail=lambda: (app.screen, app.focused))
        assert isinstance(app.screen, ConfirmScreen) and "Plan a trip to Lisbon" in str(app.screen.query_one(Label).render())
        await pilot.press("enter")  # the default is No
        await until(pilot, lambda: not isinstance(app.screen, ConfirmScreen), "closed the confirmation", timeout=30)
        assert isinstance(app.screen, SessionsScreen) and len(list(files.glob("*.json"))) == 3
        await pilot.press("d", "y")
        await _status(app, pilot, "deleted: Plan a trip to Lisbon")
        assert not (files / f"{stored[0].id}.json").exists() and len(_rows(app)) == 2
        await pilot.press("enter")  # open the next one, delete it while open: chatting on does not bring it back
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("d", "y")
        await _status(app, pilot, "deleted: Fruit list")
        await pilot.press("escape")
        await send(app, pilot, "still here")
        await wait_idle(app, pilot)
        app.wait_for_saves()
    left = {s.id: s for s in sessions.list_sessions()}
    assert stored[1].id not in left and stored[0].id not in left and len(left) == 2  # the KV chat, and the new one


@pytest.mark.slow
async def test_export_writes_markdown_and_never_replaces_a_file(synth_model: Path, tmp_path: Path, _isolated_home: Path) -> None:
    _stored(synth_model)
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("e")
        default = Path((await _asked(app, pilot)).query_one("#answer", Input).value)
        assert default.parent == _isolated_home / "exports" and default.name.startswith("plan-a-trip-to-lisbon-")
        await pilot.press("enter")
        await _status(app, pilot, f"exported to {default}")
        text = default.read_text(encoding="utf-8")
        assert text.startswith("# Plan a trip to Lisbon\n") and "- model: synth-llama.gguf" in text
        assert "## You\n\nPlan a trip to Lisbon\n\n## Assistant\n\nDay one: Alfama.\n" in text
        default.write_text("my notes", encoding="utf-8")
        await pilot.press("e", "enter")  # the same name again: refused, the file kept
        await _status(app, pilot, "not exported")
        assert f"{default} exists (nothing replaced)" in str(app.screen.query_one("#status").render())
        assert default.read_text(encoding="utf-8") == "my notes"
        await pilot.press("e")
        await _asked(app, pilot)
        await _answer(app, pilot, str(tmp_path / "no-such-folder" / "chat.md"))
        await _status(app, pilot, f"not exported: no folder {tmp_path / 'no-such-folder'}")
        await pilot.press("e")
        await _asked(app, pilot)
        await _answer(app, pilot, str(tmp_path / "lisbon.md"))
        await _status(app, pilot, "exported to")
        assert (tmp_path / "lisbon.md").read_text(encoding="utf-8") == text
