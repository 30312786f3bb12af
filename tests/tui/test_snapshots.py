"""Snapshots of the cockpit's main screens (pytest-textual-snapshot). A few only:
each costs seconds. Update them with ``pytest --snapshot-update`` after a
deliberate change of the look."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.testing import ScriptedEngine
from localllm.tui.app import create_app
from localllm.tui.settings import Settings
from tests.helpers.snapshot_model import snapshot_model
from tests.helpers.tui import laid_out, send, settings_screen, until, wait_idle

GiB = 1024**3
SIZE = (140, 40)


@pytest.fixture(scope="module")
def fixed_model() -> Path:
    """The models screen shows the file's path: keep it the same from run to run."""
    return snapshot_model()


def make_app(model: Path):
    backend = ScriptedEngine(ttft_ms=300, itl_ms=40, tokens=12, word="word")
    return create_app(str(model), vram=4 * GiB, settings=Settings(n_ctx=1024, system_prompt=""), backend_factory=lambda: backend,
                      bandwidth=20e9)


async def _settle(app, pilot) -> None:
    await wait_idle(app, pilot)
    app.query_one("#prompt").cursor_blink = False


@pytest.mark.slow
def test_main_screen_after_a_reply(snap_compare, fixed_model: Path) -> None:
    async def run_before(pilot) -> None:
        app = pilot.app
        await _settle(app, pilot)
        await send(app, pilot, "Tell me something")
        await wait_idle(app, pilot)

    assert snap_compare(make_app(fixed_model), terminal_size=SIZE, run_before=run_before)


@pytest.mark.slow
@pytest.mark.parametrize("size", [(80, 24), (200, 60)], ids=["80x24", "200x60"])
def test_main_screen_fits_the_terminal(snap_compare, fixed_model: Path, size: tuple[int, int]) -> None:
    """80×24: the panels fold into one status line above a full-width input;
    200×60: the panels at full size beside a wide chat."""

    async def run_before(pilot) -> None:
        app = pilot.app
        await _settle(app, pilot)
        await send(app, pilot, "Tell me something")
        await wait_idle(app, pilot)

    assert snap_compare(make_app(fixed_model), terminal_size=size, run_before=run_before)


@pytest.mark.slow
@pytest.mark.parametrize("size, tab", [((80, 24), "model-tab"), ((80, 24), "sampling-tab"), ((200, 60), "sampling-tab")],
                         ids=["80x24-model", "80x24-sampling", "200x60-sampling"])
def test_settings_screen(snap_compare, fixed_model: Path, size: tuple[int, int], tab: str) -> None:
    async def run_before(pilot) -> None:
        await _settle(pilot.app, pilot)
        screen = await settings_screen(pilot.app, pilot)
        screen.query_one("#tabs").active = tab
        for box in screen.query("Input"):  # a blinking cursor would make the picture depend on timing
            box.cursor_blink = False
        await until(pilot, lambda: laid_out(screen, f"#{tab}"), f"drew the {tab}", timeout=30)
        await pilot.pause()

    assert snap_compare(make_app(fixed_model), terminal_size=size, run_before=run_before)


@pytest.mark.slow
def test_models_screen(snap_compare, fixed_model: Path) -> None:
    async def run_before(pilot) -> None:
        await _settle(pilot.app, pilot)
        from tests.helpers.tui import models_screen

        await models_screen(pilot.app, pilot)

    assert snap_compare(make_app(fixed_model), terminal_size=SIZE, run_before=run_before)
