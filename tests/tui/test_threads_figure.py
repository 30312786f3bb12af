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
