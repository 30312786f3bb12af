"""The models screen at 80×24: no cell is cut, nothing scrolls sideways, and an
unreadable file's whole cause is shown (it once read "unreadable: …/mymodels/brok")."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual.widgets import DataTable

from localllm.modelfile.gguf_file import read_header
from localllm.tui.saved import reason
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli
from tests.helpers.tui import models_screen, scripted_app, until, wait_idle


@pytest.mark.slow
async def test_models_screen_fits_80x24_and_shows_the_whole_cause(tmp_path: Path) -> None:
    folder = tmp_path / "mymodels"
    folder.mkdir()
    model = write_llama_gguf(folder / "synth-llama.gguf", SynthSpec())
    broken = folder / "broken-model-with-a-rather-long-file-name.gguf"
    broken.write_bytes(b"GGUF" + b"\xff" * 40)
    assert cli("add", str(folder)).returncode == 0
    try:
        read_header(broken)
    except Exception as exc:  # noqa: BLE001 - the cause the screen must show whole
        cause = reason(exc)
    app, _ = scripted_app(model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await models_screen(app, pilot)
        table = screen.query_one(DataTable)
        assert table.max_scroll_x == 0 and table.region.right <= 80  # every column on screen
        for i in range(table.row_count):
            cells = [str(c) for c in table.get_row_at(i)]
            widths = [col.width for col in table.columns.values()]
            height = table.rows[table.coordinate_to_cell_key((i, 0)).row_key].height
            for text, width in zip(cells, widths):
                assert len(text) <= width * height, (text, width, height)  # a long name wraps onto more lines
        row = [str(table.get_row_at(i)[0]) for i in range(table.row_count)].index(broken.stem)
        assert str(table.get_row_at(row)[4]) == "unreadable"
        table.move_cursor(row=row)
        await until(pilot, lambda: "unreadable" in str(screen.query_one("#details").render()), "showed the unreadable file's details", timeout=30,
                    detail=lambda: str(screen.query_one("#details").render()))
        await pilot.pause()  # laid out again with the longer details
        details = str(screen.query_one("#details").render())
        assert f"unreadable: {cause}" in details and str(broken) in details.replace("\n", "")
        assert screen.query_one("#details").region.bottom <= 24
