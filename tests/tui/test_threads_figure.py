"""The cockpit's figures show the decode thread count and its last move with
why (issue 50), and "threads n/a" for an engine that chooses none."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.threads.controller import ThreadController
from tests.helpers.tui import panel_text, scripted_app, send, wait_idle


@pytest.mark.slow
async def test_the_figures_show_the_thread_count_and_why(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=20, itl_ms=10, tokens=4)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        assert "threads n/a" in panel_text(app)
        ctl = ThreadController(2, hi=2)
        for i in range(200):  # 2 threads 10.5 ms a token, then 25 once a core is taken; 1 thread 14 ms
            n = ctl.choose("token")
            ctl.observe("token", 1, n, int({1: 14.0, 2: 10.5 if i < 50 else 25.0}[n] * 1e6))
        assert ctl.count() == 1
        backend.threads = ctl  # type: ignore[attr-defined]  # what the llama.cpp engine exposes
        await send(app, pilot, "again")
        await wait_idle(app, pilot)
        assert "threads 1 · 2 → 1: another process is using a core" in panel_text(app)


@pytest.mark.slow
async def test_a_thread_count_in_the_settings_fixes_it_on_the_real_engine(synth_model: Path) -> None:
    """F3's threads (Settings.threads) reach llama.cpp's engine as a fixed count, and the figure says so."""
    from localllm.tui.app import create_app
    from localllm.tui.settings import Settings

    app = create_app(str(synth_model), vram=4 * 1024**3, bandwidth=20e9,
                     settings=Settings(n_ctx=256, threads=1, temperature=0, max_tokens=2, system_prompt=""))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        ctl = app.backend.threads
        assert ctl is not None and ctl.fixed and ctl.count() == 1
        assert "threads 1 · fixed" in panel_text(app)
