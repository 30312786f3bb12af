"""The help screen (F1; ? when the prompt box does not have focus; Ctrl+P →
Keys): the cockpit's keys and what each figure means. And the footer, which
must show every key whole at 80×24."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.command import CommandInput, CommandList
from textual.widgets import Footer, Static

from localllm.tui.help import FIGURES, HelpScreen
from tests.helpers.tui import laid_out, scripted_app, until, wait_idle

TOPICS = ("TTFT and prefill", "ITL and decode", "roofline", "KV cache", "VRAM budget", "PPL, KL and top-1")


def help_text(app) -> str:
    return "\n".join(str(w.render()) for w in app.screen.query(Static))


def highlighted(app) -> str:
    """The command the palette's list highlights (Enter runs it), or ""."""
    found = app.screen.query(CommandList)
    if not found or found.first().highlighted is None:
        return ""
    listed = found.first()
    return str(listed.get_option_at_index(listed.highlighted).prompt)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)])
async def test_footer_shows_every_key_whole(synth_model: Path, size: tuple[int, int]) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=size) as pilot:
        await wait_idle(app, pilot)
        keys = sorted(app.query_one(Footer).query("FooterKey"), key=lambda k: k.region.x)  # by type name: the class is private
        # these at least (bindings added later must fit too: the loop below)
        assert {"Quit", "Stop", "Help", "Models", "Settings", "Sessions", "New chat"} <= {k.description for k in keys}
        end = 0
        for k in keys:
            text = f"{k.key_display} {k.description}"
            assert k.region.x >= end and k.region.width >= len(text), (text, k.region)  # not overlapped, not cut
            end = k.region.right
        assert end <= size[0]


@pytest.mark.slow
@pytest.mark.parametrize("keys", [("f1",), ("ctrl+p", *"Keys", "enter")], ids=["f1", "palette-keys"])
async def test_help_explains_every_figure_and_lists_the_keys(synth_model: Path, keys: tuple[str, ...]) -> None:
    """F1, or Ctrl+P → Keys (Textual's own keys panel listed the text box's editing keys first)."""
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        for key in keys:  # each key once the app is ready for it
            if key == "enter":  # the palette searches as it is typed: Enter runs what its search found
                await until(pilot, lambda: highlighted(app).startswith("Keys"), "highlighted the Keys command in the palette",
                            timeout=30, detail=lambda: highlighted(app))
            await pilot.press(key)
            if key == "ctrl+p":  # the search box has the keys typed next
                await until(pilot, lambda: isinstance(app.focused, CommandInput), "focused the command palette's search box",
                            timeout=30, detail=lambda: app.focused)
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "opened the help screen", timeout=30, detail=lambda: app.screen)
        text = help_text(app)
        for topic in TOPICS:
            assert topic in text, topic
        for key, what in (("f2", "Models"), ("f3", "Settings"), ("f4", "Sessions"), ("^l", "New chat"), ("^q", "Quit"),
                          ("f1 ?", "what each figure means"), ("^p", "command palette"), ("esc", "Stop the reply")):
            assert any(line.lstrip().startswith(key) and what in line for line in text.splitlines()), (key, text)
        await pilot.press("escape")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "closed the help screen on Esc", timeout=30)
        assert not isinstance(app.screen, HelpScreen) and app.busy is False  # Esc closed the help, it stopped nothing


def test_each_figure_is_one_or_two_sentences() -> None:
    """The issue's rule: one or two sentences a figure (what it is, what to do)."""
    for title, body in FIGURES:
        assert 1 <= len([s for s in body.split(". ") if s]) <= 2, title


@pytest.mark.slow
async def test_question_mark_types_into_the_focused_prompt_and_opens_help_elsewhere(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        prompt = app.query_one("#prompt")
        await pilot.press(*"why", "question_mark")
        assert prompt.value == "why?" and not isinstance(app.screen, HelpScreen)
        prompt.value = ""
        await pilot.press("question_mark")
        assert prompt.value == "?" and not isinstance(app.screen, HelpScreen)  # focused: a message may start with ?
        app.set_focus(None)
        await pilot.press("question_mark")
        await until(pilot, lambda: isinstance(app.screen, HelpScreen), "opened the help screen on ?", timeout=30)
        assert isinstance(app.screen, HelpScreen)
        await pilot.press("question_mark")
        await until(pilot, lambda: not isinstance(app.screen, HelpScreen), "closed the help screen on ?", timeout=30)
        assert not isinstance(app.screen, HelpScreen) and prompt.value == "?"


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_help_screen_snapshot(snap_compare, synth_model: Path, size: tuple[int, int]) -> None:
    """Before any reply: nothing on screen depends on this machine (the roofline) or on the model's path."""

    async def run_before(pilot) -> None:
        await wait_idle(pilot.app, pilot)
        pilot.app.query_one("#prompt").cursor_blink = False
        await pilot.press("f1")
        await until(pilot, lambda: isinstance(pilot.app.screen, HelpScreen) and laid_out(pilot.app.screen, "#help-close"), "drew the help screen",
                    timeout=30)
        await pilot.pause()

    assert snap_compare(scripted_app(synth_model)[0], terminal_size=size, run_before=run_before)
