"""F2's catalog tab (issue 46 item 6): the catalog's models not downloaded,
each with its size and the plan's verdict for this machine (estimates, and
labelled so); a pull with a progress bar through ``localllm pull``'s own code,
against the loopback Hub; Esc stops it and keeps the part for the next pull to
resume; a failure (a 404, a bad checksum, a full disk, no hub) is one line; a
pulled model is switched to as any other.

The catalog is this test's own (``tests.helpers.catalog_hub``): tiny synthetic
GGUFs behind one entry, nothing behind the others.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from types import SimpleNamespace

import pytest
from textual.widgets import DataTable, ProgressBar, TabbedContent
from textual.widgets.data_table import ColumnKey

from localllm.store import hub as hub_module
from localllm.store import offers, registry
from localllm.tui.catalog import PENDING, CatalogPane
from localllm.tui.screens import ModelsScreen
from tests.helpers.catalog_hub import MISSING_REPO, TINY_REPO, tiny_files, use_catalog
from tests.helpers.fake_hub import FakeHub
from tests.helpers.tui import models_screen, scripted_app, until, wait_idle

SIZE = (110, 36)


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return tiny_files(tmp_path_factory.mktemp("catalog"))


@pytest.fixture
def hub(files: dict[str, Path], monkeypatch: pytest.MonkeyPatch, hf_hub_env: Callable[[], None]) -> Iterator[FakeHub]:
    """The loopback Hub serving tiny-chat's two quants, and the test's catalog."""
    h = FakeHub().start()
    for name, path in files.items():
        h.add(TINY_REPO, name, path)
    monkeypatch.setenv("HF_ENDPOINT", h.endpoint)
    hf_hub_env()
    use_catalog(monkeypatch)
    # the transfer reads 1 MiB at a time, more than a tiny file: read the hub's 64 KiB steps one by one, each a step of the bar
    monkeypatch.setattr(hub_module, "_CHUNK", 64 * 1024)
    yield h
    h.stop()


def names(pane: CatalogPane) -> list[str]:
    return [o.name for o in pane.offers]


def status(pane: CatalogPane) -> str:
    return str(pane.query_one("#pull-status").render())


async def catalog_tab(app, pilot) -> tuple[ModelsScreen, CatalogPane]:
    """F2, then c: wait until every catalog row has its verdict."""
    await wait_idle(app, pilot)
    screen = await models_screen(app, pilot)
    assert isinstance(screen, ModelsScreen)
    await pilot.press("c")
    pane = screen.query_one(CatalogPane)
    await until(pilot, lambda: pane.offers and all(n in pane.verdicts for n in names(pane)), "judged every catalog entry", timeout=30,
                detail=lambda: (names(pane), pane.verdicts))
    await pilot.pause()
    return screen, pane


def pick(screen: ModelsScreen, pane: CatalogPane, name: str) -> None:
    screen.query_one("#catalog", DataTable).move_cursor(row=names(pane).index(name))


def stored(filename: str) -> list[registry.ModelEntry]:
    return [e for e in registry.discover() if e.filename == filename]


async def test_catalog_lists_what_is_not_here_with_this_machines_verdict_and_a_pull_ends_switchable(hub: FakeHub, synth_model: Path) -> None:
    offers.pull("tiny-chat:f16")  # one quant is here already: the catalog leaves it out
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=SIZE) as pilot:
        screen, pane = await catalog_tab(app, pilot)
        assert names(pane) == ["tiny-chat:q8_0", "mid-model:q4_k_m", "huge-model:f16"]
        table = screen.query_one("#catalog", DataTable)
        assert "estimate" in str(table.columns[ColumnKey("fits")].label)
        cells = {n: [str(c) for c in table.get_row(n)] for n in names(pane)}
        assert all(c[1].startswith("≈") for c in cells.values()), cells  # the listing's size: approximate, and shown so
        # the planner's own verdict for this machine at the cockpit's settings, nothing made up
        for o in pane.offers:
            want = offers.judge(o, screen.hardware, screen.settings.fit_request(min(screen.settings.n_ctx, o.model.context))).text
            assert cells[o.name][2] == want != PENDING
        assert cells["tiny-chat:q8_0"][2].startswith("yes")
        assert cells["mid-model:q4_k_m"][2].startswith("partly:")  # 4.4 GB on a 4 GiB GPU: fewer layers on it
        assert cells["huge-model:f16"][2].startswith("no: needs")
        details = str(screen.query_one("#catalog-details").render())
        assert "tiny-chat Q8_0 · ≈" in details and "estimates" in details and "yes: ctx" in details, details
        assert not stored("Tiny-Chat-Q8_0.gguf")

        hub.trickle = 0.03  # ~0.4 s for its dozen chunks: the bar is seen between empty and full
        bar = pane.query_one("#pull-progress", ProgressBar)
        seen: list[float] = []
        pick(screen, pane, "tiny-chat:q8_0")
        await pilot.press("p")

        def done() -> bool:
            seen.append(bar.percentage or 0.0)
            return status(pane).startswith("pulled")

        await until(pilot, done, "finished the pull", timeout=30, detail=lambda: status(pane))
        assert any(0 < p < 1 for p in seen) and seen[-1] == 1, seen  # it advanced, and ended full
        assert "sha256 verified" in status(pane)
        assert "tiny-chat:q8_0" not in names(pane)
        (entry,) = stored("Tiny-Chat-Q8_0.gguf")

        # the Local tab lists it, selected: Enter switches to it as to any model
        await until(pilot, lambda: screen.query_one(TabbedContent).active == "local" and screen.select_after is None,
                    "listed and selected the pulled model", timeout=30)
        models = screen.query_one("#models", DataTable)
        assert screen.models[models.cursor_row].resolve() == entry.path.resolve()
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert app.model_path.resolve() == entry.path.resolve() and app.backend is not None


async def test_esc_stops_a_pull_lists_no_half_model_and_p_resumes_it(hub: FakeHub, synth_model: Path) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=SIZE) as pilot:
        screen, pane = await catalog_tab(app, pilot)
        bar = pane.query_one("#pull-progress", ProgressBar)
        hub.trickle = 0.1
        pick(screen, pane, "tiny-chat:q8_0")
        await pilot.press("p")
        await until(pilot, lambda: 0 < (bar.percentage or 0) < 1, "showed the pull under way", timeout=30, detail=lambda: status(pane))
        await pilot.press("escape")
        await until(pilot, lambda: "stopped" in status(pane), "stopped the pull", timeout=30, detail=lambda: status(pane))
        assert app.screen is screen  # the first Esc stops the pull; the screen stays
        assert "kept" in status(pane) and "\n" not in status(pane)
        assert not stored("Tiny-Chat-Q8_0.gguf")  # nothing half-downloaded is listed …
        assert list((Path(os.environ["HF_HOME"]) / "hub").rglob("*.incomplete"))  # … but the part is kept for a resume
        assert "tiny-chat:q8_0" in names(pane)

        hub.trickle = 0.0
        await pilot.press("p")
        await until(pilot, lambda: status(pane).startswith("pulled"), "finished the resumed pull", timeout=30, detail=lambda: status(pane))
        assert "resumed after" in status(pane)
        assert hub.ranges() and hub.ranges()[-1] != "bytes=0-"  # asked for the rest, not the whole file again
        assert stored("Tiny-Chat-Q8_0.gguf")


async def test_a_failing_hub_is_one_line(hub: FakeHub, synth_model: Path, monkeypatch: pytest.MonkeyPatch,
                                         hf_hub_env: Callable[[], None]) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=SIZE) as pilot:
        screen, pane = await catalog_tab(app, pilot)

        async def pull_fails(name: str, filename: str, cause: str) -> None:
            pick(screen, pane, name)
            await pilot.press("p")
            await until(pilot, lambda: "failed" in status(pane), f"said why the pull of {name} failed", timeout=30, detail=lambda: status(pane))
            line = status(pane)
            assert cause in line and "\n" not in line and "Traceback" not in line, line
            assert app.screen is screen and not stored(filename)

        await pull_fails("huge-model:f16", "Huge-F16.gguf", f"no repo {MISSING_REPO}")  # the Hub's 404
        hub.corrupt.add("Tiny-Chat-Q8_0.gguf")
        await pull_fails("tiny-chat:q8_0", "Tiny-Chat-Q8_0.gguf", "checksum mismatch")
        hub.corrupt.clear()
        with monkeypatch.context() as full:  # a full disk: refused before a byte is written
            full.setattr(shutil, "disk_usage", lambda _path: SimpleNamespace(total=1 << 40, used=1 << 40, free=0))
            await pull_fails("tiny-chat:q8_0", "Tiny-Chat-Q8_0.gguf", "not enough disk space")
        monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")  # nothing listens
        hf_hub_env()
        await pull_fails("tiny-chat:q8_0", "Tiny-Chat-Q8_0.gguf", "cannot reach")
        assert not pane.query_one("#pull-progress", ProgressBar).display  # no bar left over a failure

