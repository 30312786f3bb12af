"""The cockpit under Textual's Pilot: a real model streams a reply and the
panels fill in; a scripted backend with set delays checks the timing display
exactly; Esc stops; sessions survive; settings reload."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from localllm.chat import sessions
from localllm.tui.app import create_app
from localllm.tui.settings import Settings
from localllm.tui.widgets import MemoryPanel
from tests.helpers.tui import (
    chat_text,
    laid_out,
    models_screen,
    panel_text,
    scripted_app,
    send,
    sessions_screen,
    settings_screen,
    until,
    wait_idle,
)

GiB = 1024**3


















@pytest.mark.slow
async def test_timings_shown_exactly(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=300, itl_ms=40, tokens=10)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        text = panel_text(app)
        assert "TTFT 300.0 ms" in text
        assert "ITL p50 40.0 ms · p95 40.0 ms" in text
        assert "decode 25.0 t/s" in text  # 9 evaluations in 360 ms
        assert "streaming is 55% of the reply" in text  # 360 ms streaming > 300 ms TTFT
        assert chat_text(app)[-1] == ("assistant", "".join(f" tok{i}" for i in range(10)))


@pytest.mark.slow
async def test_slow_start_verdict(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=800, itl_ms=20, tokens=6)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "hello")
        await wait_idle(app, pilot)
        assert "slow start: prompt read at 3.8 t/s" in panel_text(app)  # 3 tokens in 800 ms: under reading speed
        assert "TTFT is 89% of the reply" in panel_text(app)


@pytest.mark.slow
async def test_escape_stops_and_input_stays_responsive(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=50, itl_ms=30, tokens=2000)  # 60 s: typing on a busy machine takes seconds
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "a long one")
        await until(pilot, lambda: chat_text(app)[-1][0] == "assistant" and chat_text(app)[-1][1], "streamed the first tokens of the reply",
                    timeout=30, detail=lambda: chat_text(app)[-2:])
        assert app.busy
        await pilot.press(*"next question")  # typing while the reply streams
        assert app.query_one("#prompt").value == "next question"
        await pilot.press("escape")
        await wait_idle(app, pilot)
        roles = [r for r, _ in chat_text(app)]
        assert roles[-1] == "note" and chat_text(app)[-1][1] == "(stopped)"
        stats = app.chat.turns[-1].stats  # the stopped generation still has its stats
        assert 0 < stats.generated_tokens < 2000 and stats.generated_tokens == len(backend.stamps)
        assert app.query_one("#prompt").value == "next question"


@pytest.mark.slow
async def test_session_saved_and_reopened(synth_model: Path, _isolated_home: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "remember me")
        await wait_idle(app, pilot)
    saved = sessions.list_sessions()
    assert len(saved) == 1 and [m["role"] for m in saved[0].messages] == ["user", "assistant"]
    files = list((_isolated_home / "sessions").iterdir())
    assert sorted(f.suffix for f in files) == [".json", ".state"]  # its KV cache kept beside it (issue 61); no temporary file left behind
    # A crash mid-reply leaves the user's message saved without an answer: reopening drops it.
    s = saved[0]
    s.messages.append({"role": "user", "content": "unanswered"})
    sessions.save(s)
    app2, backend2 = scripted_app(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app2.run_test(size=(140, 40)) as pilot:
        await wait_idle(app2, pilot)
        await sessions_screen(app2, pilot)
        await pilot.press("enter")
        await wait_idle(app2, pilot)
        assert [m["content"] for m in app2.chat.messages] == ["remember me", " tok0 tok1 tok2"]
        assert ("user", "remember me") in chat_text(app2)


@pytest.mark.slow
async def test_settings_change_reloads(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model)
    async with app.run_test(size=(140, 50)) as pilot:
        await wait_idle(app, pilot)
        assert backend.loads == 1 and backend.config.n_ctx == 1024
        await settings_screen(app, pilot)
        app.screen.query_one("#n_ctx").value = "2048"
        await pilot.click("#apply")
        await wait_idle(app, pilot)
        assert backend.loads == 2 and backend.config.n_ctx == 2048
        assert any("reloading" in t for _, t in chat_text(app))
        assert "context 0 of 2048" in panel_text(app)
        await settings_screen(app, pilot)
        app.screen.query_one("#temperature").value = "0.1"
        await pilot.click("#apply")
        await wait_idle(app, pilot)
        assert backend.loads == 2 and app.chat.sampling.temperature == 0.1  # no reload for sampling


@pytest.mark.slow
async def test_models_screen_lists_and_judges_fit(synth_model: Path) -> None:
    from tests.helpers.stores import ollama_store

    ollama_store(Path(os.environ["OLLAMA_MODELS"]), synth_model, "tinyllama", "1b")  # the registry names Ollama's blob
    app, _ = scripted_app(synth_model)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await models_screen(app, pilot)
        table = app.screen.query_one("#models")
        first = [str(c) for c in table.get_row_at(0)]
        assert first[0] == f"{synth_model.name} (loaded)" and first[2] == "F32" and first[4] == "yes"
        rows = {str(table.get_row_at(i)[0]): [str(c) for c in table.get_row_at(i)] for i in range(table.row_count)}
        assert rows["tinyllama:1b"][5] == "ollama" and rows["smollm2"][5] == "embedded"
        assert "synthetic-llama" in str(app.screen.query_one("#details").render())


@pytest.mark.slow
async def test_real_model_streams_and_panels_fill(smollm2: Path) -> None:
    app = create_app(None, vram=4 * GiB, settings=Settings(n_ctx=2048, temperature=0, system_prompt="Answer in one short sentence."))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        assert "TTFT n/a" in panel_text(app)
        await send(app, pilot, "What is the capital of France?")
        await wait_idle(app, pilot)
        reply = chat_text(app)[-1]
        assert reply[0] == "assistant" and "Paris" in reply[1]
        text = panel_text(app)
        assert "TTFT n/a" not in text and "ITL p50 n/a" not in text
        stats = app.chat.turns[-1].stats
        assert f"TTFT {stats.ttft_ms:.1f} ms" in text and f"decode {stats.decode_tokens_per_s:.1f} t/s" in text
        roof = re.search(r"roofline (\d+) t/s: decode at (\d+)%", text)
        assert roof and int(roof.group(1)) > stats.decode_tokens_per_s * 0.5  # a ceiling from measured bandwidth
        mem = app.query_one(MemoryPanel)
        used1, kv1 = mem.context_used, mem.kv_now_bytes
        assert used1 > 0 and kv1 == used1 * 30 * 192 * 2 * 2  # SmolLM2: 30 layers, 3 KV heads x 64, K+V, f16
        await send(app, pilot, "And of Italy?")
        await wait_idle(app, pilot)
        assert mem.context_used > used1 and mem.kv_now_bytes > kv1
        assert "Rome" in chat_text(app)[-1][1]


@pytest.mark.slow
async def test_models_screen_quantizes_and_switches(tmp_path: Path) -> None:
    """From the models screen: quantize the selected model after a question that
    names the output, its predicted size and type (a progress bar; the file goes
    into localllm's own folder, so ``localllm list`` shows it), then switch to
    it, which reloads. A quantized source needs the explicit requantize choice;
    Cancel writes nothing."""
    import os

    from localllm.store import registry
    from localllm.tui.quantize_confirm import QuantizeConfirm
    from localllm.tui.screens import ModelsScreen
    from scripts.synth_gguf import SynthSpec, write_llama_gguf

    src = write_llama_gguf(tmp_path / "tiny-F32.gguf", SynthSpec(n_embd=256, n_head=4, n_head_kv=2, n_ff=512))
    own = Path(os.environ["LOCALLLM_HOME"]) / "models"
    app, backend = scripted_app(src)
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        screen = await models_screen(app, pilot)
        assert isinstance(screen, ModelsScreen)

        def details() -> str:
            return str(screen.query_one("#details").render())

        async def ask(qtype: str) -> QuantizeConfirm:
            screen.query_one("#qtype").value = qtype
            await pilot.press("q")
            # laid out before it is clicked
            await until(pilot, lambda: isinstance(app.screen, QuantizeConfirm) and laid_out(app.screen, "#q-go"), f"asked before quantizing to {qtype}",
                        timeout=30, detail=details)
            return app.screen

        dialog = await ask("Q8_0")
        text = " ".join(str(w.render()) for w in dialog.query("Label"))
        out = own / "tiny-Q8_0.gguf"
        assert "Quantize tiny-F32.gguf (F32) to Q8_0?" in text and str(out) in text and "llama.cpp's dry run" in text
        assert not dialog.query("#q-requantize") and not dialog.query_one("#q-go").disabled
        await pilot.click("#q-go")
        table = screen.query_one("#models")

        def listed() -> list[str]:
            return [str(table.get_row_at(i)[0]) for i in range(table.row_count)]

        await until(pilot, lambda: "tiny-q8_0" in listed(), "listed the quantized model tiny-q8_0", timeout=60, detail=details)
        names = listed()
        assert out.exists() and "tiny-q8_0" in names and not (tmp_path / "tiny-Q8_0.gguf").exists(), str(screen.query_one("#details").render())
        assert out in [e.path for e in registry.discover()]  # what localllm list shows
        bar = screen.query_one("#qprogress")
        assert bar.total and bar.progress == bar.total  # one step per tensor, all done
        from localllm.modelfile.model_info import inspect_model

        assert inspect_model(out).file_type == "Q8_0"
        row = names.index("tiny-q8_0")

        # the quantized file again, to Q4_0: the requantize choice must be made; Cancel writes nothing
        table.move_cursor(row=row)
        dialog = await ask("Q4_0")
        assert dialog.query_one("#q-go").disabled and dialog.query_one("#q-requantize")
        await pilot.click("#q-requantize")
        assert not dialog.query_one("#q-go").disabled
        await pilot.click("#q-cancel")
        await until(pilot, lambda: "cancelled" in details(), "said the quantize was cancelled", timeout=30, detail=details)
        assert not (own / "tiny-Q4_0.gguf").exists() and "cancelled" in str(screen.query_one("#details").render())

        table.move_cursor(row=row)
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert app.model_path == out and backend.loads == 2


@pytest.mark.slow
async def test_a_message_too_long_for_the_context_is_refused_with_its_token_count(smollm2: Path) -> None:
    """The prompt box takes any length; llama.cpp's context does not: the
    message is refused with its token count and the fix, and the chat goes on."""
    app = create_app(None, vram=4 * GiB, settings=Settings(n_ctx=256, temperature=0, system_prompt=""))
    async with app.run_test(size=(140, 40)) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "word " * 400)
        await wait_idle(app, pilot)
        note = chat_text(app)[-1]
        assert note[0] == "note" and re.fullmatch(
            r"error: the message is \d+ tokens; the context holds 256 with 0 kept: try a larger context size", note[1]), note
        await send(app, pilot, "Hi")
        await wait_idle(app, pilot)
        assert chat_text(app)[-1][0] == "assistant", chat_text(app)[-3:]
