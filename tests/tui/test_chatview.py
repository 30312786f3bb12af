"""The cockpit's chat log: wrapped to the view (words kept whole, wide
characters counted by cell), wrapped again when the terminal is resized, and
streamed without laying out the screen again for every line (the CPU that
costs comes out of the decode threads: scripts/bench_tui.py)."""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from rich.cells import cell_len
from textual.app import App, ComposeResult

from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.chatview import ChatView, wrap
from localllm.tui.settings import Settings
from tests.helpers.tui import send, until, wait_idle

GiB = 1024**3


def test_wrap_breaks_at_the_last_space_that_fits() -> None:
    assert wrap("the quick brown fox", 10) == ["the quick", "brown fox"]
    assert wrap("exactly ten", 11) == ["exactly ten"]
    assert wrap("", 10) == [""]
    assert wrap("a " * 3, 2) == ["a", "a", "a "]  # a trailing space that fits stays


def test_wrap_breaks_a_word_longer_than_the_row() -> None:
    assert wrap("abcdefghijkl xy", 5) == ["abcde", "fghij", "kl xy"]


def test_wrap_counts_wide_characters_by_cell() -> None:
    rows = wrap("模型在本地运行 很快 " * 4, 12)
    assert all(cell_len(r) <= 12 for r in rows)
    assert "".join(rows).replace(" ", "") == ("模型在本地运行很快" * 4)


class _One(App):
    def compose(self) -> ComposeResult:
        yield ChatView()


@pytest.mark.slow
async def test_rows_fit_the_view_and_are_wrapped_again_on_resize() -> None:
    app = _One()
    async with app.run_test(size=(60, 20)) as pilot:
        view = app.query_one(ChatView)
        msg = view.add("assistant", "")
        words = [f"word{i}" for i in range(300)]
        for w in words:
            msg.append(" " + w)
        await pilot.pause()
        width = view.scrollable_content_region.width
        assert view.line_count > 20 and all(cell_len(r) <= width for r in view.lines)
        assert " ".join(view.lines).split() == words  # nothing lost or cut at the edge
        assert view.is_vertical_scroll_end  # it followed the stream
        await pilot.resize_terminal(40, 20)
        await pilot.pause()
        narrow = view.scrollable_content_region.width
        assert narrow < width and all(cell_len(r) <= narrow for r in view.lines)
        assert " ".join(view.lines).split() == words


@pytest.mark.slow
async def test_a_streamed_reply_does_not_lay_out_the_screen_per_line(synth_model: Path) -> None:
    """Textual's Log laid out (and then repainted) the whole screen for every
    line a reply added: about 45 ms of CPU a line here. The chat view lays out
    only when its scrollbar appears."""
    backend = ScriptedEngine(ttft_ms=10, itl_ms=10, tokens=300)  # 3 s: about 15 batches of tokens
    app = create_app(str(synth_model), vram=4 * GiB, settings=Settings(n_ctx=4096, system_prompt=""), backend_factory=lambda: backend)
    async with app.run_test(size=(100, 16)) as pilot:
        await wait_idle(app, pilot)
        view = app.query_one(ChatView)
        layouts: list[object] = []
        app.screen.screen_layout_refresh_signal.subscribe(app, layouts.append)
        before = view.line_count
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        added = view.line_count - before
        assert added > 15  # the reply overflowed the view: the scrollbar came
        assert len(layouts) <= 6, f"{len(layouts)} layout passes for {added} lines"
        # it followed the reply to its end, within 5 s (once in a full suite run, on a busy worker, it
        # was not there yet right after the reply was drawn)
        await until(pilot, lambda: view.is_vertical_scroll_end, "followed the reply to its end", 5,
                    detail=lambda: f"scroll_y={view.scroll_y}, max_scroll_y={view.max_scroll_y}")


@pytest.mark.slow
async def test_streamed_pieces_wrap_as_the_whole_text_would() -> None:
    """The view wraps again only the last row as pieces arrive; the rows must be
    those of wrapping the whole text at once (words, long words, wide characters,
    newlines, pieces that split words)."""
    rng = random.Random(3)
    vocab = ["a", "word", "longerword", "x" * 70, "模型", "运行很快", "\n", "\n\n", " ", "end."]
    text = "".join(rng.choice(vocab) + (" " if rng.random() < 0.7 else "") for _ in range(600))
    app = _One()
    async with app.run_test(size=(50, 20)) as pilot:
        view = app.query_one(ChatView)
        i = 0
        while i < len(text):
            n = rng.randint(1, 9)
            view.write(text[i:i + n])
            i += n
        await pilot.pause()
        width = view.scrollable_content_region.width
        assert view.lines == [row for para in text.split("\n") for row in wrap(para, width)]


@pytest.mark.slow
@pytest.mark.settles_heap
async def test_a_load_takes_long_lived_objects_out_of_the_collectors_way(synth_model: Path) -> None:
    """A full garbage collection while a reply streamed took 75 ms here,
    holding the GIL the engine thread needs between tokens: after a load the
    cockpit freezes what is alive (gc.freeze), a reload unfreezes it first (so
    the replaced model can be freed), and closing the app unfreezes it."""
    import gc

    gc.unfreeze()  # the test worker froze its own heap (tests/conftest.py): start unfrozen, as a cockpit process does
    backend = ScriptedEngine(ttft_ms=10, itl_ms=1, tokens=4)
    app = create_app(str(synth_model), vram=4 * GiB, settings=Settings(n_ctx=1024, system_prompt=""), backend_factory=lambda: backend)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_idle(app, pilot)
        assert gc.get_freeze_count() > 10_000
        walked = len(gc.get_objects())
        app.reload_model()
        assert gc.get_freeze_count() == 0  # unfrozen before the old model goes
        await wait_idle(app, pilot)
        assert gc.get_freeze_count() > 10_000
        assert walked < gc.get_freeze_count()  # a full collection walks fewer objects than are kept out of it
    assert gc.get_freeze_count() == 0


@pytest.mark.slow
async def test_the_view_follows_the_end_until_the_user_scrolls_up() -> None:
    """New text scrolls a view that shows the end, also after the terminal got
    shorter; a view the user scrolled up stays where it is while a reply
    streams; sending a message brings it back to the end."""
    app = _One()
    async with app.run_test(size=(60, 20)) as pilot:
        view = app.query_one(ChatView)
        msg = view.add("assistant", "")
        for i in range(200):
            msg.append(f" word{i}")
        await pilot.pause()
        assert view.is_vertical_scroll_end
        await pilot.resize_terminal(60, 12)  # shorter: the end moves down
        await pilot.pause()
        for i in range(40):
            msg.append(f" more{i}")
        await pilot.pause()
        assert view.is_vertical_scroll_end and view.scroll_offset.y > 0
        view.scroll_to(y=0, animate=False)
        await pilot.pause()
        for i in range(40):
            msg.append(f" later{i}")
        await pilot.pause()
        assert view.scroll_offset.y == 0  # left where the user put it
        view.add("user", "a new question")
        view.add("assistant", "and its answer")
        await pilot.pause()
        assert view.is_vertical_scroll_end
