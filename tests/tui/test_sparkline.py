"""The cockpit's ITL sparkline draws what Textual's Sparkline draws (the same
bars in the same cells, colours within one step of its blend), at a fraction
of its CPU."""

from __future__ import annotations

import random
import time

import pytest
from textual.app import App, ComposeResult
from textual.geometry import Region
from textual.widgets import Sparkline

from localllm.tui.widgets import ItlSparkline


class _Both(App):
    CSS = "Sparkline { height: 3; width: 46; }"

    def compose(self) -> ComposeResult:
        yield Sparkline([], id="textual")
        yield ItlSparkline([], id="ours")


def _cells(widget: Sparkline) -> list[list[tuple[str, tuple[int, int, int] | None]]]:
    rows = []
    for strip in widget.render_lines(Region(0, 0, widget.size.width, widget.size.height)):
        cells = []
        for seg in strip:
            color = seg.style.color.get_truecolor() if seg.style and seg.style.color and seg.text.strip() else None
            cells += [(ch, tuple(color) if color else None) for ch in seg.text]
        rows.append(cells)
    return rows


@pytest.mark.slow
@pytest.mark.parametrize("data", [[], [12.0], [10.0] * 30, [random.Random(7).uniform(8, 40) for _ in range(200)],
                                  [random.Random(8).uniform(8, 40) for _ in range(17)]], ids=["empty", "one", "flat", "200", "17"])
async def test_same_bars_as_textual(data: list[float]) -> None:
    app = _Both()
    async with app.run_test(size=(60, 10)) as pilot:
        theirs, ours = app.query_one("#textual", Sparkline), app.query_one("#ours", ItlSparkline)
        theirs.data, ours.data = data, data
        await pilot.pause()
        a, b = _cells(theirs), _cells(ours)
        assert ["".join(c for c, _ in row) for row in a] == ["".join(c for c, _ in row) for row in b]
        for row_a, row_b in zip(a, b):
            for (_, ca), (_, cb) in zip(row_a, row_b):
                assert (ca is None) == (cb is None)
                if ca and cb:
                    assert max(abs(x - y) for x, y in zip(ca, cb)) <= 12, (ca, cb)


@pytest.mark.slow
async def test_a_redraw_costs_a_fraction_of_textuals() -> None:
    app = _Both()
    rng = random.Random(1)
    async with app.run_test(size=(60, 10)) as pilot:
        await pilot.pause()
        rounds: dict[str, list[float]] = {"textual": [], "ours": []}
        for _ in range(5):  # alternated, the cheapest round of each: a busy machine's stalls land on either
            for name in ("textual", "ours"):
                widget = app.query_one(f"#{name}", Sparkline)
                t = time.thread_time()
                for _ in range(10):
                    widget.data = [rng.uniform(8, 40) for _ in range(200)]
                    widget.render_lines(Region(0, 0, widget.size.width, widget.size.height))
                rounds[name].append((time.thread_time() - t) / 10)
        cost = {k: min(v) for k, v in rounds.items()}
        print(f"ms per redraw: {({k: round(v * 1000, 2) for k, v in cost.items()})}")
        assert cost["ours"] < cost["textual"] / 2, cost
