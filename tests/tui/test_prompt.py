"""The cockpit's prompt box and conversation controls under Pilot: a
multi-line message (Ctrl+J, Shift+Enter, a paste) reaches the model whole, Up
recalls earlier prompts, Enter during a reply is refused with the reason, Esc
says at once that it stopped; copy the last reply or code block, regenerate,
edit the last message."""

from __future__ import annotations

from pathlib import Path

import pytest
from textual import events

from localllm.tui.chatview import ChatView
from tests.helpers.tui import ask, chat_text, scripted_app, send, until, wait_idle

CODE = "def add(a, b):\n    return a + b\n"
REPLY = ["Two", " blocks:\n\n", "```sh\nls\n```\n\n", "```python\n", *CODE.splitlines(keepends=True), "```\n"]


def toasts(app) -> str:
    return " ".join(str(t.render()) for t in app.screen.query("Toast"))


def users(backend) -> list[str]:
    """The user messages of the last conversation the model was given."""
    return [m["content"] for m in backend.chats[-1] if m["role"] == "user"]


@pytest.mark.slow
async def test_ctrl_j_shift_enter_and_a_paste_keep_every_line(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=20, itl_ms=5, tokens=3)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        await pilot.press(*"one", "ctrl+j", *"two", "shift+enter", *"three")
        box = app.query_one("#prompt")
        assert box.value == "one\ntwo\nthree" and not backend.chats  # not sent: newlines only
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert users(backend) == ["one\ntwo\nthree"]
        assert chat_text(app)[-2] == ("user", "one\ntwo\nthree")
        assert box.value == ""
        pasted = "Summarize this list in one line:\n- apples\n- pears\n- plums"
        app.post_message(events.Paste(pasted))  # as the terminal driver does: to the app, which hands it to the focused box
        await until(pilot, lambda: box.value == pasted, "put the paste in the box", detail=lambda: box.value)
        assert box.value == pasted
        await pilot.press("enter")
        await wait_idle(app, pilot)
        assert users(backend)[-1] == pasted


@pytest.mark.slow
async def test_up_recalls_earlier_prompts_when_the_box_is_empty(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=20, itl_ms=5, tokens=2)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        for text in ("first", "second\nline"):
            await ask(app, pilot, text)
        box = app.query_one("#prompt")
        await pilot.press("up")
        assert box.value == "second\nline"
        await pilot.press("up")
        assert box.value == "first"
        await pilot.press("down")
        assert box.value == "second\nline"
        await pilot.press("down")
        assert box.value == ""
        await pilot.press(*"draft", "up")  # a box with text: Up moves the cursor, the draft stays
        assert box.value == "draft"


@pytest.mark.slow
async def test_enter_during_a_reply_is_refused_with_the_reason_and_esc_says_so_at_once(synth_model: Path) -> None:
    """A token every 3 s: Esc is answered on the log before the engine reaches
    its next token (where it stops). (At one a second, a busy machine could let the
    engine reach it first, between the key and the check.)"""
    app, backend = scripted_app(synth_model, ttft_ms=20, itl_ms=3000, tokens=30)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        await send(app, pilot, "a long one")
        await until(pilot, lambda: chat_text(app)[-1][0] == "assistant" and chat_text(app)[-1][1], "showed the reply's first token",
                    timeout=30, detail=lambda: chat_text(app)[-2:])
        await pilot.press(*"next", "enter")
        await until(pilot, lambda: "not sent" in toasts(app), "said why the message was not sent", detail=lambda: toasts(app))
        assert "not sent: a reply is streaming: Esc stops it" in toasts(app)
        assert app.query_one("#prompt").value == "next" and len(backend.chats) == 1
        await pilot.press("escape")
        assert app.busy and chat_text(app)[-1] == ("note", "(stopped)")  # said before the engine answers
        await wait_idle(app, pilot)
        assert app.stop_ns is not None
        assert len([t for t in backend.stamps if t > app.stop_ns]) <= 1  # within one token
        assert [t for _, t in chat_text(app)].count("(stopped)") == 1  # said once
        assert app.query_one(ChatView).lines[-1] == "· (stopped)"  # the token after Esc joined the reply, above the note
        reply = [t for r, t in chat_text(app) if r == "assistant"][-1]
        assert reply == app.chat.messages[-1]["content"]  # the log shows what was saved, the token after Esc included


@pytest.mark.slow
async def test_copy_the_last_reply_and_the_last_code_block(synth_model: Path) -> None:
    app, _ = scripted_app(synth_model, ttft_ms=20, itl_ms=5, reply=REPLY)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: "no reply to copy yet" in toasts(app), "said there was no reply to copy", detail=lambda: toasts(app))
        assert "no reply to copy yet" in toasts(app) and app.clipboard == ""
        await ask(app, pilot, "code please")
        await pilot.press("ctrl+n")
        await until(pilot, lambda: "copied the last code block" in toasts(app), "said the code block was copied", detail=lambda: toasts(app))
        assert app.clipboard == CODE
        assert "copied the last code block (python, 2 lines)" in toasts(app)
        await pilot.press("ctrl+o")
        await until(pilot, lambda: "copied the last reply" in toasts(app), "said the reply was copied", detail=lambda: toasts(app))
        assert app.clipboard == "".join(REPLY).strip()
        assert "copied the last reply (10 lines, 72 characters)" in toasts(app)


@pytest.mark.slow
async def test_regenerate_replaces_the_last_reply_and_keeps_the_cache(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=20, itl_ms=5, tokens=4)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        await ask(app, pilot, "hello")
        await ask(app, pilot, "again")
        used = app.chat.context_used
        backend.word = "new"
        await pilot.press("ctrl+r")
        await wait_idle(app, pilot)
        assert [m["role"] for m in app.chat.messages] == ["user", "assistant"] * 2
        assert app.chat.messages[-1]["content"] == " new0 new1 new2 new3"
        assert users(backend) == ["hello", "again"]
        log = chat_text(app)
        assert [t for r, t in log if r == "user"] == ["hello", "again"]
        assert [t for r, t in log if r == "assistant"][-1] == " new0 new1 new2 new3" and " tok0 tok1 tok2 tok3" in [t for _, t in log]
        assert sum(r == "assistant" for r, _ in log) == 2
        assert app.chat.context_used == used  # the old reply left the cache


@pytest.mark.slow
async def test_edit_the_last_message_and_send_it_in_place(synth_model: Path) -> None:
    app, backend = scripted_app(synth_model, ttft_ms=20, itl_ms=5, tokens=2)
    async with app.run_test(size=(100, 30), notifications=True) as pilot:
        await wait_idle(app, pilot)
        await ask(app, pilot, "What is 2+2?")
        await pilot.press("ctrl+g")
        box = app.query_one("#prompt")
        assert box.value == "What is 2+2?"
        await pilot.press("escape")  # dropped: nothing changes
        assert box.value == "" and [m["content"] for m in app.chat.messages][0] == "What is 2+2?"
        await pilot.press("ctrl+g", "backspace", "backspace", *"3?", "enter")
        await wait_idle(app, pilot)
        assert [m["content"] for m in app.chat.messages if m["role"] == "user"] == ["What is 2+3?"]
        assert [t for r, t in chat_text(app) if r == "user"] == ["What is 2+3?"]
        assert users(backend) == ["What is 2+3?"]


@pytest.mark.slow
async def test_a_typed_caret_is_kept(synth_model: Path) -> None:
    """Only a "^" that came in one read with the next key is taken for an Esc
    (tests/tui/test_prompt_terminal.py); one typed is text."""
    app, _ = scripted_app(synth_model, tokens=2)
    async with app.run_test(size=(100, 30)) as pilot:
        await wait_idle(app, pilot)
        await pilot.press(*"2^3", "ctrl+j", "^")
        await pilot.pause(0.05)  # typing speed between "^" and the next key: part of the scenario, not a wait
        await pilot.press("x")
        assert app.query_one("#prompt").value == "2^3\n^x"
