"""Experts in RAM in the cockpit: the settings screen's field reaches the load
as --cpu-moe / --n-cpu-moe do, and a dense model refuses it in one line."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from textual.widgets import Input, TabbedContent

from localllm.cli import build_parser
from localllm.tui.cli import settings_from_args
from localllm.tui.settings import Settings
from localllm.tui.settings_screen import SettingsScreen
from scripts.plan_conformance import CASES
from scripts.synth_gguf import write_gguf
from tests.helpers.tui import chat_text, scripted_app, settings_screen, wait_idle


def test_the_setting_is_a_load_option_and_reloads() -> None:
    s = Settings(n_cpu_moe=-1)
    assert s.load_options().config().n_cpu_moe == -1 and Settings().load_options().config().n_cpu_moe == 0
    assert s.needs_reload(Settings())
    assert settings_from_args(build_parser().parse_args(["tui", "--n-cpu-moe", "2"])).n_cpu_moe == 2
    assert Settings.from_dict({"n_cpu_moe": -1}).n_cpu_moe == -1
    assert Settings.from_dict({"n_cpu_moe": -7}).n_cpu_moe is None  # a hand-edited session falls back


async def _apply(app, pilot, value: str) -> SettingsScreen:
    screen = await settings_screen(app, pilot)
    assert isinstance(screen, SettingsScreen)
    screen.query_one(TabbedContent).active = "model-tab"
    screen.query_one("#n_cpu_moe", Input).value = value
    await pilot.click("#apply")
    await wait_idle(app, pilot)
    return screen


@pytest.mark.slow
async def test_experts_in_ram_reach_the_engine(tmp_path: Path) -> None:
    model = write_gguf(tmp_path / "olmoe.gguf", replace(CASES["olmoe"], n_layer=3))
    app, backend = scripted_app(model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        await _apply(app, pilot, "-1")
        assert backend.loads == 2 and backend.config is not None and backend.config.n_cpu_moe == -1
        await _apply(app, pilot, "2")
        assert backend.loads == 3 and backend.config.n_cpu_moe == 2


@pytest.mark.slow
async def test_a_bad_count_or_a_dense_model_is_one_line(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(80, 24)) as pilot:
        await wait_idle(app, pilot)
        screen = await _apply(app, pilot, "-2")
        assert str(screen.query_one("#error").render()) == "not applied: experts in RAM must be -1 (every layer), 0 or more, or blank"
        await pilot.press("escape")
        await _apply(app, pilot, "1")  # a dense model: one line in the chat, the model stays loaded
        assert chat_text(app)[-1] == ("note", "could not load synth-llama.gguf: experts in RAM: this model (llama) has no expert tensors "
                                              "to keep in RAM: it is not a mixture of experts · still on synth-llama.gguf")
