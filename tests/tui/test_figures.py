"""The figures on screen belong to the model they were measured on: a model
switch or a reopened session shows "n/a" until the next reply measures them
again (issue 22's example: the previous model's TTFT next to a new model)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from localllm.chat import sessions
from tests.helpers.tui import panel_text, scripted_app, send, sessions_screen, wait_idle


async def _one_reply(app, pilot) -> None:
    """A reply measured and shown: the figures that must not outlive their model."""
    await wait_idle(app, pilot)
    await send(app, pilot, "hello")
    await wait_idle(app, pilot)
    text = panel_text(app)
    assert "TTFT 300.0 ms" in text and "ITL p50 40.0 ms" in text and "decode 25.0 t/s" in text


def _cleared(app) -> None:
    text = panel_text(app)
    for stale in ("TTFT 300", "ITL p50 40", "25.0 t/s", "of the reply", "roofline"):
        assert stale not in text, (stale, text)
    assert "TTFT n/a" in text and "ITL p50 n/a · p95 n/a" in text and "decode n/a" in text
    status = str(app.query_one("#status").lines[0])
    assert "TTFT n/a" in status and "ITL p50 n/a" in status


@pytest.mark.slow
async def test_model_switch_clears_the_previous_models_figures(synth_model: Path, tmp_path: Path) -> None:
    other = shutil.copy(synth_model, tmp_path / "other-model.gguf")
    app, _ = scripted_app(synth_model, ttft_ms=300, itl_ms=40, tokens=10)
    async with app.run_test(size=(140, 40)) as pilot:
        await _one_reply(app, pilot)
        app.reload_model(Path(other), redraw=True)  # what F2's choice does
        await wait_idle(app, pilot)
        assert app.model_path == Path(other)
        _cleared(app)


@pytest.mark.slow
async def test_reopened_session_shows_no_figures_of_the_last_reply(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=300, itl_ms=40, tokens=10)
    async with app.run_test(size=(140, 40)) as pilot:
        await _one_reply(app, pilot)
        await sessions_screen(app, pilot)
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert len(sessions.list_sessions()) == 1
        _cleared(app)
