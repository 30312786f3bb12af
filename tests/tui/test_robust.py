"""The cockpit never dies on a model or a file (issue 16.7), under Textual's Pilot:
a base model opens in completion mode, damaged session files are skipped with a
notice, a load that fails (a bad file, or llama.cpp refusing for memory) keeps
the previous model, quitting mid-reply stops within one token, and a worker that
fails shows its error in the chat log while the app goes on."""

from __future__ import annotations

import asyncio
import json
from dataclasses import replace
from pathlib import Path

import pytest

from localllm.chat import sessions
from localllm.testing import ScriptedEngine
from localllm.tui.app import LocalLLMApp, create_app
from localllm.tui.settings import Settings
from tests.helpers.tui import chat_text, panel_text, send, sessions_screen, settings_screen, spy_on_ui_thread, until

GiB = 1024**3


async def settle(app: LocalLLMApp, pilot, timeout: float = 120.0) -> None:
    """Wait until nothing is loading or streaming (a model may or may not be loaded)."""
    await until(pilot, lambda: not app.busy, "finished loading or replying", timeout, detail=lambda: chat_text(app)[-1:])
    await pilot.pause()


async def saves_done(app: LocalLLMApp, pilot, timeout: float = 30.0) -> None:
    """Wait until the saves queued so far have run on the disk thread, then
    let Textual handle what they posted (a save that failed, or works again)."""
    done = asyncio.ensure_future(asyncio.to_thread(app.wait_for_saves))
    await until(pilot, done.done, "ran the saves it had queued", timeout)
    done.result()
    await pilot.pause()


def scripted(model: Path, **kw) -> tuple[LocalLLMApp, ScriptedEngine]:
    backend = ScriptedEngine(**kw)
    app = create_app(str(model), vram=4 * GiB, settings=Settings(n_ctx=1024, system_prompt="Be brief."),
                     backend_factory=lambda: backend, bandwidth=20e9)
    return app, backend


def notes(app: LocalLLMApp) -> list[str]:
    return [t for r, t in chat_text(app) if r == "note"]


@pytest.mark.slow
async def test_model_without_template_opens_in_completion_mode(synth_model: Path) -> None:
    app, _ = scripted(synth_model, ttft_ms=20, itl_ms=10, tokens=5, chat_template=False)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        assert app.chat is not None and app.chat.completion
        assert any("completion mode" in n for n in notes(app))
        await send(app, pilot, "Once upon a time")
        await settle(app, pilot)
        assert chat_text(app)[-1] == ("assistant", " tok0 tok1 tok2 tok3 tok4")
        assert "TTFT 20.0 ms" in panel_text(app) and "context 0 of" not in panel_text(app)
        # No template: the model reads the text itself, without the system prompt.
        assert app.chat.messages[0] == {"role": "user", "content": "Once upon a time"}


@pytest.mark.slow
async def test_base_gemma_continues_the_text(gemma: Path) -> None:
    app = create_app(str(gemma), vram=4 * GiB, settings=Settings(n_ctx=512, temperature=0, max_tokens=8, threads=1),
                     bandwidth=20e9)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        assert app.chat is not None and app.chat.completion, notes(app)
        await send(app, pilot, "The capital of France is")
        await settle(app, pilot)
        role, reply = chat_text(app)[-1]
        assert role == "assistant" and reply.strip(), chat_text(app)
        turn = app.chat.turns[-1]
        assert turn.stats.generated_tokens > 0 and f"TTFT {turn.stats.ttft_ms:.1f} ms" in panel_text(app)
        assert f"context {app.chat.context_used} of 512" in panel_text(app)
        # the BOS token leads, then the typed text as text
        assert app.backend.cache_tokens[0] == app.backend.tokenize("", add_special=True)[0]
        await send(app, pilot, "and the capital of Italy is")  # the text goes on from the reply
        await settle(app, pilot)
        assert chat_text(app)[-1][0] == "assistant" and len(app.chat.turns) == 2


def _write(d: Path, name: str, data: object) -> None:
    d.mkdir(parents=True, exist_ok=True)
    (d / name).write_text(data if isinstance(data, str) else json.dumps(data), encoding="utf-8")


@pytest.mark.slow
async def test_damaged_session_files_are_skipped_with_a_notice(synth_model: Path) -> None:
    good = sessions.SavedSession.new(str(synth_model), None, {"n_ctx": 1024})
    good.messages = [{"role": "user", "content": "kept question"}, {"role": "assistant", "content": "kept answer"}]
    sessions.save(good)
    d = sessions.sessions_dir()
    base = {"id": "x", "model": str(synth_model), "created": 1.0, "updated": 1.0, "system_prompt": None, "settings": {}}
    _write(d, "no-content.json", {**base, "messages": [{"role": "user"}]})
    _write(d, "a-list.json", [1, 2, 3])
    _write(d, "not-json.json", "{\"model\": ")
    _write(d, "messages-text.json", {**base, "messages": "hello"})
    _write(d, "bad-settings.json", {**base, "updated": 0.5, "messages": [{"role": "user", "content": "odd settings"}],
                                    "settings": {"n_ctx": "huge", "temperature": -3, "type_k": 5}})
    app, backend = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await sessions_screen(app, pilot)
        skipped = str(app.screen.query_one("#skipped").render())
        assert "skipped 4 damaged session files" in skipped
        for cause in ("no-content.json: message 1 has no text content", "a-list.json: not a JSON object",
                      "not-json.json: not valid JSON", "messages-text.json: 'messages' is not a list"):
            assert cause in skipped
        listed = app.screen.query_one("OptionList")
        assert listed.option_count == 2  # the good one, and the one whose bad settings fall back to defaults
        await pilot.press("enter")  # newest first: the good one
        await settle(app, pilot)
        assert ("user", "kept question") in chat_text(app) and ("assistant", "kept answer") in chat_text(app)
        assert backend.config.n_ctx == 1024
    assert all(p.exists() for p in d.iterdir())  # nothing deleted


@pytest.mark.slow
async def test_session_whose_model_is_gone_keeps_the_current_model(synth_model: Path, tmp_path: Path) -> None:
    bad = tmp_path / "broken.gguf"
    bad.write_bytes(b"GGUF" + b"\xff" * 40)
    s = sessions.SavedSession.new(str(bad), None, {})
    s.messages = [{"role": "user", "content": "from the broken model"}, {"role": "assistant", "content": "old"}]
    sessions.save(s)
    app, backend = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "before")
        await settle(app, pilot)
        await sessions_screen(app, pilot)
        listed = app.screen.query_one("OptionList")
        listed.highlighted = 1  # newest first: this chat, then the broken model's
        await pilot.press("enter")
        await settle(app, pilot)
        assert any(n.startswith("could not load broken.gguf") and n.endswith(f"still on {synth_model.name}") for n in notes(app)), notes(app)
        assert app.model_path == synth_model and ("user", "before") in chat_text(app)
        assert ("user", "from the broken model") not in chat_text(app)
        await send(app, pilot, "after")
        await settle(app, pilot)
        assert chat_text(app)[-1] == ("assistant", " tok0 tok1 tok2")


@pytest.mark.slow
async def test_load_refused_for_memory_keeps_the_model(smollm2: Path) -> None:
    """A context llama.cpp cannot allocate (16M tokens: a 368 GB KV cache for
    SmolLM2; larger ones spend minutes on llama.cpp's per-cell bookkeeping
    first): the load fails, the previous model is loaded again and answers."""
    # The fitting service would shrink the context to the RAM available (as run
    # does): told of a 1 PiB RAM it lets the context through, and llama.cpp is
    # asked as typed. (The cockpit fitting: tests/tui/test_options.py.)
    app = create_app(str(smollm2), vram=4 * GiB, settings=Settings(n_ctx=1024, n_gpu_layers=0, threads=1, temperature=0, max_tokens=16,
                                                                    system_prompt="Answer in one short sentence."), bandwidth=20e9)
    app.hardware = replace(app.hardware, ram_available_bytes=1 << 50)
    async with app.run_test(size=(140, 50)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "What is the capital of France?")
        await settle(app, pilot)
        await settings_screen(app, pilot)
        app.screen.query_one("#n_ctx").value = "16000000"
        await pilot.click("#apply")
        await settle(app, pilot)
        assert any(n.startswith(f"could not load {smollm2.name}") and "still on" in n for n in notes(app)), notes(app)
        assert app.settings.n_ctx == 1024 and app.load_config.n_ctx == 1024 and app.backend.n_ctx == 1024
        assert "context 0 of 1024" in panel_text(app) or "of 1024" in panel_text(app)
        await send(app, pilot, "And of Italy?")
        await settle(app, pilot)
        role, reply = chat_text(app)[-1]
        assert role == "assistant" and "Rome" in reply


@pytest.mark.slow
async def test_quit_mid_reply_stops_within_one_token(synth_model: Path) -> None:
    app, backend = scripted(synth_model, ttft_ms=20, itl_ms=50, tokens=400)  # 20 s if it ran to the end
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "a long one")
        await until(pilot, lambda: chat_text(app)[-1][0] == "assistant" and chat_text(app)[-1][1], "streamed the first tokens of the reply",
                    timeout=30, detail=lambda: chat_text(app)[-2:])
        assert app.busy
        await pilot.press("ctrl+q")
    assert app.stop_ns is not None
    after = [t for t in backend.stamps if t > app.stop_ns]
    assert len(after) <= 1, f"{len(after)} tokens after quit"
    assert 0 < len(backend.stamps) < 100


@pytest.mark.slow
async def test_failed_worker_shows_the_error_and_the_app_goes_on(synth_model: Path) -> None:
    app, backend = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=6, fail_at=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "break")
        await settle(app, pilot)
        assert "error: RuntimeError: scripted failure at token 3" in notes(app)
        assert app.is_running and not app.busy
        backend.fail_at = None
        await send(app, pilot, "again")
        await settle(app, pilot)
        assert chat_text(app)[-1] == ("assistant", "".join(f" tok{i}" for i in range(6)))


@pytest.mark.slow
async def test_failing_backend_factory_is_reported(synth_model: Path) -> None:
    def factory():
        raise RuntimeError("no engine here")

    app = create_app(str(synth_model), vram=4 * GiB, settings=Settings(n_ctx=1024), backend_factory=factory, bandwidth=20e9)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        assert any("RuntimeError: no engine here" in n and "no model loaded" in n for n in notes(app)), notes(app)
        await send(app, pilot, "anyone?")
        assert app.is_running and notes(app)[-1] == "no model is loaded: F2 picks one"


@pytest.mark.slow
async def test_file_names_are_shown_escaped(synth_model: Path, tmp_path: Path) -> None:
    """A model file whose name carries an escape sequence cannot draw on the screen."""
    odd = tmp_path / "evil\x1b[2J\nname.gguf"
    odd.write_bytes(synth_model.read_bytes())
    app, _ = scripted(odd, ttft_ms=5, itl_ms=5, tokens=2)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        shown = [n for n in notes(app) if "evil" in n]
        assert shown and all("\x1b" not in n and "\n" not in n for n in shown)
        assert any("evil\\x1b[2J\\nname.gguf · context 1024" in n for n in shown), shown


def test_saved_settings_of_the_wrong_type_fall_back_to_defaults() -> None:
    s = Settings.from_dict({"n_ctx": "huge", "temperature": -3, "type_k": 5, "threads": -2, "n_gpu_layers": -1,
                            "max_tokens": 64, "system_prompt": None, "swa_full": True, "unknown": 1})
    d = Settings()
    assert (s.n_ctx, s.temperature, s.type_k, s.threads, s.system_prompt) == (d.n_ctx, d.temperature, d.type_k, d.threads, d.system_prompt)
    assert (s.n_gpu_layers, s.max_tokens, s.swa_full) == (-1, 64, True)


def _wrap_save(monkeypatch: pytest.MonkeyPatch, before) -> None:
    """sessions.save runs ``before(session)`` first (which may raise or wait)."""
    real_save = sessions.save

    def save(session):
        before(session)
        return real_save(session)

    monkeypatch.setattr(sessions, "save", save)


@pytest.mark.slow
async def test_sessions_are_saved_off_the_ui_thread_and_a_failed_save_is_one_line(synth_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A save is two fsyncs: they run on the disk thread, in order, never on
    Textual's thread. A disk that refuses (ENOSPC here) gives one line in the
    chat log however many saves fail, and one when saving works again; the
    chat goes on."""
    import errno
    import threading

    threads: list[str] = []
    full = threading.Event()

    def before(_session) -> None:
        threads.append(threading.current_thread().name)
        if full.is_set():
            raise OSError(errno.ENOSPC, "No space left on device")

    _wrap_save(monkeypatch, before)
    app, _ = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await settle(app, pilot)
        full.set()
        await send(app, pilot, "second")
        await settle(app, pilot)
        await saves_done(app, pilot)
        failed = [n for n in notes(app) if n.startswith("the session could not be saved")]
        assert len(failed) == 1 and "No space left on device" in failed[0], notes(app)  # two saves failed: one line
        full.clear()
        await send(app, pilot, "third")
        await settle(app, pilot)
        await saves_done(app, pilot)
        assert notes(app)[-1] == "the session is saved again"
        assert [r for r, _ in chat_text(app) if r == "assistant"] == ["assistant"] * 3
    assert threads and all(name.startswith("save") for name in threads), threads
    # closing the app waited for the last save: the third reply is on disk
    assert any(m["content"] == "third" for s in sessions.list_sessions() for m in s.messages)


@pytest.mark.slow
async def test_sessions_screen_reads_the_files_off_the_ui_thread(synth_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """F4 reads every saved chat in a worker and shows them from a message:
    hundreds of files on a slow disk never freeze the cockpit."""
    from localllm.tui import saved as saved_module

    for i in range(3):
        s = sessions.SavedSession.new(str(synth_model), None, {})
        s.messages = [{"role": "user", "content": f"question {i}"}, {"role": "assistant", "content": "answer"}]
        sessions.save(s)
    on_ui = spy_on_ui_thread(monkeypatch, saved_module, "read")
    app, _ = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await sessions_screen(app, pilot)
        assert app.screen.query_one("OptionList").option_count == 3
        await pilot.press("enter")
        await settle(app, pilot)
        assert ("user", "question 2") in chat_text(app) or ("user", "question 0") in chat_text(app)
    assert len(on_ui) == 3 and not any(on_ui)  # each file read once, by the worker; opening one reads nothing again


@pytest.mark.slow
async def test_sessions_screen_lists_the_chat_as_last_saved(synth_model: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Saves are queued on the disk thread: F4 waits for them before reading the
    files, so the chat it lists (and reopens) is the latest, not an older copy
    that would then overwrite it."""
    import time as _time

    _wrap_save(monkeypatch, lambda _session: _time.sleep(0.4))  # a slow disk: part of the scenario, not a wait
    app, _ = scripted(synth_model, ttft_ms=10, itl_ms=5, tokens=3)
    async with app.run_test(size=(140, 40)) as pilot:
        await settle(app, pilot)
        await send(app, pilot, "first")
        await settle(app, pilot)
        await send(app, pilot, "second")
        await settle(app, pilot)  # the reply is done; its saves are still queued
        await sessions_screen(app, pilot)
        option = str(app.screen.query_one("OptionList").get_option_at_index(0).prompt)
        assert "2 turns" in option, option  # both exchanges
