"""``localllm tui`` honours every load option it accepts: parsed by the real
CLI parser, the cockpit built as ``localllm tui`` builds it, each option is
checked where it lands, in the config the engine is asked to load (a scripted
engine records it; the fitting service decides it, as for ``run``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.cli import build_parser
from localllm.engine_api import LoadConfig
from localllm.speculation import rows
from localllm.testing import ScriptedEngine
from localllm.tui.cli import app_from_args
from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.tui import chat_text, models_screen, panel_text, settings_screen, until, wait_idle

GiB = 1024**3


def _app(*argv: str):
    args = build_parser().parse_args(["tui", *argv])
    backend = ScriptedEngine()
    return app_from_args(args, backend_factory=lambda: backend, bandwidth=20e9), backend


@pytest.mark.slow
async def test_every_load_option_reaches_the_engine(synth_model: Path) -> None:
    app, backend = _app(str(synth_model), "--ctx", "1024", "--k-type", "q8_0", "--flash-attn", "off", "--batch", "256",
                        "--ubatch", "128", "--threads", "1", "--ngl", "0", "--swa-full", "--vram", "4GiB")
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_idle(app, pilot)
        want = LoadConfig(n_ctx=1024, n_threads=1, n_gpu_layers=0, flash_attn="off", type_k="q8_0", type_v="f16",
                          n_batch=256, n_ubatch=128, swa_full=True, n_outputs_max=rows("auto") or 1)  # rows for speculation's drafts
        assert backend.config == want and app.load_config == want
        assert app.hardware.gpu_budget == 4 * GiB and "GPU budget (--vram)" in panel_text(app)
        # The settings screen changes what it shows and keeps the options it does not show.
        await settings_screen(app, pilot)
        app.screen.query_one("#n_ctx").value = "2048"
        await pilot.click("#apply")
        await wait_idle(app, pilot)
        assert backend.loads == 2 and backend.config == LoadConfig(**{**want.to_dict(), "n_ctx": 2048})


async def test_quantized_v_cache_turns_flash_attention_on(tmp_path: Path) -> None:
    # head size 64: llama.cpp accepts q4_0 with flash attention (synth_model's 16 it refuses)
    model = write_llama_gguf(tmp_path / "h64.gguf", SynthSpec(n_embd=128, n_head=2, n_head_kv=2))
    app, backend = _app(str(model), "--ctx", "512", "--kv-type", "q4_0", "--flash-attn", "off")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        c = backend.config
        assert (c.type_k, c.type_v, c.flash_attn, c.n_ctx) == ("q4_0", "q4_0", "on", 512)


@pytest.mark.slow
async def test_policy_and_vram_decide_the_fit(smollm2: Path) -> None:
    """SmolLM2 at 8192 tokens in a 300 MiB budget: the ctx policy keeps every
    layer on the GPU and gives up context, the offload policy keeps the context
    and moves layers; the models screen says 'with changes' from the outcome."""
    ctx_app, ctx_backend = _app(str(smollm2), "--ctx", "8192", "--vram", "300MiB", "--policy", "ctx")
    async with ctx_app.run_test(size=(140, 40)) as pilot:
        await wait_idle(ctx_app, pilot)
        c = ctx_backend.config
        assert c.n_ctx < 8192 and c.n_gpu_layers == 31 and c.type_k == "f16"
        assert any(f"auto-fit: context {c.n_ctx} instead of 8192" in t for _, t in chat_text(ctx_app))
        screen = await models_screen(ctx_app, pilot)
        assert [str(x) for x in screen.query_one("#models").get_row_at(0)][4] == "with changes"
    off_app, off_backend = _app(str(smollm2), "--ctx", "8192", "--vram", "300MiB", "--policy", "offload")
    async with off_app.run_test(size=(140, 40)) as pilot:
        await wait_idle(off_app, pilot)
        c = off_backend.config
        assert c.n_ctx == 8192 and 0 < c.n_gpu_layers < 31


@pytest.mark.slow
async def test_what_does_not_fit_is_not_loaded(smollm2: Path) -> None:
    """Every layer fixed on a 50 MiB GPU: the fitting service says no, the
    cockpit says why and asks the engine for nothing."""
    app, backend = _app(str(smollm2), "--ngl", "31", "--vram", "50MiB")
    async with app.run_test(size=(140, 40)) as pilot:
        await until(pilot, lambda: not app.busy, "finished the load", timeout=30, detail=lambda: chat_text(app)[-1:])
        await pilot.pause()
        notes = [t for r, t in chat_text(app) if r == "note"]
        assert any(t.startswith(f"could not load {smollm2.name}: does not fit:") for t in notes), notes
        assert backend.loads == 0 and app.backend is None


@pytest.mark.slow
async def test_models_screen_reads_headers_off_the_ui_thread(synth_model: Path, monkeypatch) -> None:
    """The models screen reads each model's header in a worker thread and gets
    the rows in a message; the UI thread reads none (a slow disk never freezes it)."""
    from localllm.tui import screens
    from tests.helpers.tui import spy_on_ui_thread

    on_ui = spy_on_ui_thread(monkeypatch, screens, "read_header")
    app, _ = _app(str(synth_model), "--ctx", "512")
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        screen = await models_screen(app, pilot)
        first = [str(c) for c in screen.query_one("#models").get_row_at(0)]
        assert first[0] == f"{synth_model.name} (loaded)" and first[4] == "yes"
        details = screen.query_one("#details")
        first_row = str(details.render())
        await pilot.press("down")
        await until(pilot, lambda: str(details.render()) != first_row, "showed the next row's details", timeout=30)
        assert on_ui and not any(on_ui)  # moving through the rows reads nothing either
