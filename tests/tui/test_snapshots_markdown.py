"""Snapshots of a finished Markdown reply with a code block at 80×24 and
200×60 (pytest-textual-snapshot; ``--snapshot-update`` after a deliberate
change of the look)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings
from tests.helpers.snapshot_model import snapshot_model
from tests.helpers.tui import ask, wait_idle

REPLY = ["## Sorting\n\n", "Use `sorted()` on the **list**:\n\n", "```python\n", "fruit = ['pear', 'apple']\n",
         "print(sorted(fruit))  # ['apple', 'pear']\n", "```\n", "\n- it returns a new list\n- `list.sort()` sorts in place\n"]


@pytest.fixture(scope="module")
def model() -> Path:
    """The screen shows the file's name: the same from run to run."""
    return snapshot_model()


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_a_markdown_reply_with_a_code_block(snap_compare, model: Path, size: tuple[int, int]) -> None:
    backend = ScriptedEngine(ttft_ms=300, itl_ms=40, reply=REPLY)
    app = create_app(str(model), vram=4 * 1024**3, settings=Settings(n_ctx=1024, system_prompt=""),
                     backend_factory=lambda: backend, bandwidth=20e9)

    async def run_before(pilot) -> None:
        await wait_idle(pilot.app, pilot)
        pilot.app.query_one("#prompt").cursor_blink = False  # a blinking cursor would make the picture depend on timing
        await ask(pilot.app, pilot, "How do I sort\na list?")

    assert snap_compare(app, terminal_size=size, run_before=run_before)
