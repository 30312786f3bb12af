"""The figures on screen belong to the model they were measured on: a model
switch or a reopened session shows "n/a" until the next reply measures them
again (issue 22's example: the previous model's TTFT next to a new model)."""

from __future__ import annotations

import dataclasses
import shutil
from pathlib import Path

import pytest

from localllm.chat import sessions
from tests.helpers.tui import chat_text, panel_text, scripted_app, send, sessions_screen, until, wait_idle


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


async def _reply(app, pilot, itl_ms: float) -> None:
    app.backend.itl_ms = itl_ms  # the scripted engine's pace for the next reply
    await send(app, pilot, "hello")
    await wait_idle(app, pilot)


def _advice(app) -> list[str]:
    return [t for r, t in chat_text(app) if r == "note" and "under a third" in t]


@pytest.mark.slow
async def test_starved_decode_is_told_once_with_the_fix(synth_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from localllm.cockpit import session as session_module
    from localllm.measure import starved

    monkeypatch.setattr(session_module, "busiest_process", lambda: starved.Busy("stress", 4242, 150.0))
    app, _ = scripted_app(synth_model, ttft_ms=20, itl_ms=10, tokens=6)
    app.settings = dataclasses.replace(app.settings, threads=4)
    asked: list[float] = []  # the rates the app looked up the busiest program for (the advice's worker), as each reply ended
    advise = app._advise_starved

    def spy(rate, reference, threads):
        asked.append(rate)
        return advise(rate, reference, threads)

    monkeypatch.setattr(app, "_advise_starved", spy)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await _reply(app, pilot, 10)  # 100 t/s: what this model does here
        await _reply(app, pilot, 25)  # 40 t/s: slower, not starved
        assert asked == []  # the reply has ended (its check too): no advice was sought, so none can arrive later
        assert _advice(app) == []
        await _reply(app, pilot, 40)  # 25 t/s: under a third of 100
        await until(pilot, lambda: _advice(app), "advised on the starved decode", timeout=30, detail=lambda: chat_text(app)[-3:])
        assert _advice(app) == ["decode ran at 25.0 t/s, under a third of the 100.0 t/s this model reached earlier here: "
                                "stress (pid 4242) is using 150% CPU; start with --threads 2 (F3: threads 2) or close it"]
        await _reply(app, pilot, 80)  # starved again: said once
        assert len(asked) == 1  # the reply has ended: no second advice was sought
        assert len(_advice(app)) == 1


@pytest.mark.slow
async def test_status_line_drops_whole_figures_rather_than_cut_one(synth_model: Path) -> None:
    """At 80 columns the panels fold into one status line; a long context must
    not cut a figure mid-number: the last figures give way whole."""
    from localllm.tui.widgets import LatencyPanel, MemoryPanel, StatusLine

    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        latency, memory, status = app.query_one(LatencyPanel), app.query_one(MemoryPanel), app.query_one(StatusLine)
        latency.ttft_ms, latency.gaps_ms, latency.decode_tps = 12345.0, [123.4] * 3, 123.4
        memory.n_ctx, memory.context_used, memory.kv_now_bytes, memory.shifts = 131072, 32768, 1023 * 2**20, 12
        status.show(latency, memory)
        await pilot.pause()
        line = str(status.lines[0])
        assert line == "TTFT 12345 ms · ITL p50 123.4 ms · decode 123.4 t/s · ctx 32768/131072"
        assert len(status._rows(status.size.width)) == 1
