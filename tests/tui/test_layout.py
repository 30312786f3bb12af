"""The cockpit fits the terminal it is given (issue 14.4): at 80×24 the side
panels fold into one status line and the chat and its input keep the width;
at medium widths the panels narrow; nothing ever covers the input."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings
from localllm.tui.widgets import LatencyPanel, Lines, MemoryPanel, StatusLine
from tests.helpers.tui import send, wait_idle

GiB = 1024**3


def _app(model: Path):
    backend = ScriptedEngine(ttft_ms=30, itl_ms=10, tokens=8)
    return create_app(str(model), vram=4 * GiB, settings=Settings(n_ctx=1024, system_prompt=""), backend_factory=lambda: backend,
                      bandwidth=20e9)


def _visible(widget) -> bool:
    return widget.display and all(a.display for a in widget.ancestors_with_self if hasattr(a, "display"))


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (100, 30), (140, 40), (200, 60), (120, 20)])
async def test_input_never_covered_and_chat_keeps_room(synth_model: Path, size: tuple[int, int]) -> None:
    app = _app(synth_model)
    async with app.run_test(size=size) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        prompt = app.query_one("#prompt").region
        assert prompt.height >= 3 and prompt.bottom <= size[1] - 1  # above the footer
        for panel in (app.query_one(LatencyPanel), app.query_one(MemoryPanel)):
            if _visible(panel):
                assert not panel.region.overlaps(prompt), f"{type(panel).__name__} covers the input at {size}"
        chat = app.query_one("#chat").region
        assert chat.width >= min(size[0] - 52, 60) and not chat.overlaps(prompt)
        status = app.query_one(StatusLine)
        if size[0] < 100:
            assert not _visible(app.query_one(LatencyPanel)) and _visible(status)
            assert chat.width >= size[0] - 2
            line = str(status.lines[0])
            assert line.startswith("TTFT 30 ms · ITL p50 10.0 ms · decode 100.0 t/s") and "ctx " in line and "/1024" in line
        else:
            assert _visible(app.query_one(LatencyPanel)) and not _visible(status)
            assert app.query_one("#side").region.width == (50 if size[0] >= 120 else 42)
            for block in app.query(Lines):  # every figure shown whole: no wrapped row cut off
                if _visible(block) and block is not status:
                    assert len(block._rows(block.size.width)) <= block.size.height, (block.id, block.lines)
