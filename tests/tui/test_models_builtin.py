"""F2 lists the built-in gemma3-270m before it is first assembled, as ``localllm
list`` does (issue 45 item 3), and choosing it there assembles it, off the UI
thread, and loads it."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable

from localllm.store.builtin import embedded_path
from localllm.tui.screens import ModelsScreen
from tests.helpers.cli import cli
from tests.helpers.tui import models_screen, scripted_app, wait_idle


@pytest.mark.slow
async def test_f2_lists_gemma_before_it_is_assembled_and_choosing_it_loads_it(synth_model: Path) -> None:
    target = embedded_path("gemma3-270m")
    assert not target.exists()  # a data directory of this test's own: never assembled here
    assert "gemma3-270m" in cli("list").stdout  # the list the screen must agree with
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        screen = await models_screen(app, pilot)
        assert isinstance(screen, ModelsScreen)
        names = [r.cells[0] for r in screen.rows]
        assert "gemma3-270m" in names, names
        row = screen.rows[names.index("gemma3-270m")]
        assert row.cells[1:5] == ("n/a", "n/a", "n/a", "n/a")  # nothing measured before the file exists
        table = screen.query_one(DataTable)
        table.move_cursor(row=names.index("gemma3-270m"))
        await pilot.pause()
        assert "assembled from its PyPI package" in str(screen.query_one("#details").render())
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert target.is_file() and app.model_path == target, (app.model_path, target)
        assert app.backend is not None
