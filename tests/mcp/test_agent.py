"""The tool loop's shapes on the scripted engine and a real MCP server: a call
out, its approval, the result back in as a tool message, the final text; a
denial; "always"; the step limit; the refusal where nobody can be asked."""

from __future__ import annotations

from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.engine_api import LoadConfig
from localllm.mcp import Hub
from localllm.mcp.agent import CallDone, CallRun, Decision, Notice, StepDone, TextOut, ToolCall, ToolChat
from localllm.testing import ScriptedEngine

pytestmark = pytest.mark.slow  # MCP servers are processes (the SDK's start in ~1.5 s); SmolLM2

CALL = ['{"name": "add", ', '"arguments": {"a": 2, "b": 3}}']
ANSWER = ["The", " sum", " is", " 5."]


def engine(*replies: list[str]) -> ScriptedEngine:
    e = ScriptedEngine(ttft_ms=0, itl_ms=0, reply=ANSWER)
    e.load(Path("scripted.gguf"), LoadConfig(n_ctx=1 << 16))
    e.replies = list(replies)
    return e


def chat_with(hub: Hub, e: ScriptedEngine, answers: list[Decision], **kw) -> tuple[ToolChat, list[ToolCall]]:
    asked: list[ToolCall] = []

    def approve(call: ToolCall) -> Decision:
        asked.append(call)
        return answers.pop(0)

    return ToolChat(ChatSession(e, system_prompt="Be brief."), hub, approve=approve, **kw), asked


def test_a_call_is_approved_run_and_answered(hub: Hub) -> None:
    e = engine(CALL, ANSWER)
    chat, asked = chat_with(hub, e, [Decision.ONCE])
    events = list(chat.send("What is 2 + 3?"))
    assert [a.name for a in asked] == ["add"] and asked[0].arguments == {"a": 2, "b": 3} and asked[0].server == "tiny"
    kinds = [type(ev).__name__ for ev in events]
    assert kinds == ["StepDone", "CallRun", "CallDone", "TextOut", "TextOut", "TextOut", "TextOut", "StepDone"], kinds
    done = next(ev for ev in events if isinstance(ev, CallDone))
    assert done.result.text == "5" and not done.result.is_error
    assert "".join(ev.text for ev in events if isinstance(ev, TextOut)) == "The sum is 5."
    tool_msg = chat.session.messages[-2]
    assert tool_msg == {"role": "tool", "tool_call_id": asked[0].id, "name": "add", "content": "5"}
    # the generic format: the template got the result as data in a user turn, and the tools in the system message
    seen = e.chats[-1]
    assert seen[0]["role"] == "system" and '"name": "add"' in seen[0]["content"] and seen[0]["content"].startswith("Be brief.")
    assert seen[-1]["role"] == "user" and '"tool_response"' in seen[-1]["content"] and '"content": "5"' in seen[-1]["content"]
    assert sum(isinstance(ev, StepDone) and ev.stats is not None for ev in events) == 2


def test_a_denial_is_told_to_the_model(hub: Hub) -> None:
    e = engine(CALL, ANSWER)
    chat, _ = chat_with(hub, e, [Decision.DENY])
    events = list(chat.send("2 + 3?"))
    assert not any(isinstance(ev, CallRun) for ev in events)
    done = next(ev for ev in events if isinstance(ev, CallDone))
    assert done.decision is Decision.DENY and done.result.failed
    assert chat.session.messages[-2]["content"] == "The user denied this tool call."
    assert "denied" in e.chats[-1][-1]["content"]


def test_always_asks_once_per_session(hub: Hub) -> None:
    e = engine(CALL, ANSWER, CALL, ANSWER)
    chat, asked = chat_with(hub, e, [Decision.ALWAYS])
    for text in ("first", "second"):
        events = list(chat.send(text))
        assert next(ev for ev in events if isinstance(ev, CallDone)).result.text == "5"
    assert len(asked) == 1


def test_the_step_limit_stops_a_loop(hub: Hub) -> None:
    e = engine()
    e.reply = CALL  # every reply calls again
    chat, asked = chat_with(hub, e, [Decision.ALWAYS], max_steps=3)
    events = list(chat.send("loop"))
    assert sum(isinstance(ev, CallDone) for ev in events) == 3 and len(asked) == 1
    assert isinstance(events[-1], Notice) and "after 3 steps" in events[-1].line


def test_nobody_to_ask_refuses_and_ends_the_turn(hub: Hub) -> None:
    e = engine(CALL, ANSWER)
    chat, _ = chat_with(hub, e, [Decision.REFUSE])
    events = list(chat.send("2 + 3?"))
    assert not any(isinstance(ev, (CallRun, CallDone)) for ev in events)
    assert isinstance(events[-1], Notice) and "--yes-tools" in events[-1].line


def test_a_failing_call_goes_back_to_the_model_and_the_chat_goes_on(hub: Hub) -> None:
    e = engine(['{"name": "go", "arguments": {}}'], ANSWER)
    chat, _ = chat_with(hub, e, [Decision.ONCE])
    chat.tools = [t for t in chat.tools if t.name != "go"] + [hub.servers["crash"].tools[0]]
    events = list(chat.send("crash it"))
    done = next(ev for ev in events if isinstance(ev, CallDone))
    assert done.result.failed and "crash" in done.result.text
    assert "".join(ev.text for ev in events if isinstance(ev, TextOut)) == "The sum is 5."


def test_a_chat_offers_at_most_128_tools_with_a_line(hub: Hub) -> None:
    chat, _ = chat_with(hub, engine(), [])
    assert len(chat.tools) == 128 and chat.tools[0].name == "add"
    assert any("a chat offers at most 128 tools" in n for n in chat.notices)


def test_tools_allowed_in_the_config_run_without_asking(hub: Hub) -> None:
    e = engine(CALL, ANSWER)
    chat, asked = chat_with(hub, e, [], allowed=["tiny/add"])
    events = list(chat.send("2 + 3?"))
    assert asked == [] and next(ev for ev in events if isinstance(ev, CallDone)).result.text == "5"


def test_a_running_call_is_cancelled_and_the_model_told(hub: Hub) -> None:
    import threading

    e = engine(['{"name": "sleep", "arguments": {"seconds": 30}}'], ANSWER)
    chat, _ = chat_with(hub, e, [Decision.ONCE])
    events = []
    for ev in chat.send("wait"):
        events.append(ev)
        if isinstance(ev, CallRun):
            threading.Timer(0.3, chat.cancel).start()  # the cockpit's Esc, from another thread
    done = next(ev for ev in events if isinstance(ev, CallDone))
    assert done.result.failed and "cancelled" in done.result.text
    assert chat.session.messages[-2]["content"] == "the call was cancelled"
