"""A call that opens with a control token (issue 48: preserved tokens). A real
Mistral vocabulary holds ``[TOOL_CALLS]`` and ``[ARGS]`` as control tokens,
which a reply renders as nothing: the parser then never sees the marker and the
call is read as content. As llama-server does (``preserved_tokens``), the
control tokens of the template's tool-call format and thinking markers are
shown as their text, and every other control token stays hidden.

The model is synthetic (random weights, ``scripts/synth_gguf``) with those
control tokens in its vocabulary and Mistral Small 3.2's template (the
Ministral format); the grammar holds the reply to a call and a logit bias on
the two control tokens makes the model write them as tokens, not as bytes.
Checked on a real ``serve`` (whole and streamed) and through ``ToolChat``, the
loop of ``chat --tools``, ``run --tools`` and the cockpit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.chat.session import ChatSession
from localllm.engine import LlamaCppBackend
from localllm.engine.batch import BatchModel
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.mcp import Hub, Limits
from localllm.mcp.agent import CallDone, Decision, ToolCall, ToolChat
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.server import KEY, Server, http_client
from tests.mcp.conftest import rogue

pytestmark = pytest.mark.slow  # llama.cpp loads a model; a server and an MCP server are processes

TEMPLATE = (Path(__file__).parent.parent / "toolcalls" / "templates" / "Mistral-Small-3.2-24B-Instruct-2506.jinja").read_text("utf-8")
CONTROLS = ("[INST]", "[/INST]", "[SYSTEM_PROMPT]", "[/SYSTEM_PROMPT]", "[AVAILABLE_TOOLS]", "[/AVAILABLE_TOOLS]",
            "[TOOL_RESULTS]", "[/TOOL_RESULTS]", "[TOOL_CALLS]", "[ARGS]", "[CALL_ID]")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"]}}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def mistral(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_gguf(tmp_path_factory.mktemp("preserved") / "synth-mistral.gguf", SynthSpec(controls=CONTROLS, chat_template=TEMPLATE))


@pytest.fixture(scope="module")
def ids(mistral: Path) -> dict[str, int]:
    """Each control token's id, and how a generated one reads (BatchModel.piece, serve's text path)."""
    m = BatchModel()
    try:
        m.load(mistral, LoadConfig(n_ctx=256, n_threads=1), 1)
        out = {}
        for text in CONTROLS:
            got = m.tok.tokenize(text, add_special=False, parse_special=True)
            assert len(got) == 1, text
            out[text] = got[0]
        shown = {t for t, i in out.items() if m.piece(i)}
        assert {t: m.piece(out[t]) for t in shown} == {t: t.encode() for t in shown}
        assert shown == {"[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"}  # the format's; [INST], [/INST]... stay hidden
        word = m.tok.tokenize("Paris", add_special=False)
        assert b"".join(m.piece(t) for t in word) == m.tok.detokenize(word).encode()  # ordinary tokens as before
        return out
    finally:
        m.close()


def _bias(ids: dict[str, int]) -> dict[str, float]:
    return {str(ids["[TOOL_CALLS]"]): 100, str(ids["[ARGS]"]): 100}


@pytest.fixture(scope="module")
def server(mistral: Path, tmp_path_factory: pytest.TempPathFactory):
    s = Server(str(mistral), "--ctx", "4096", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("home"))})
    try:
        yield s
    finally:
        s.stop()


def test_a_call_opened_by_control_tokens_is_parsed_by_serve(server, ids: dict[str, int]) -> None:
    body = {"model": "m", "messages": ASK, "tools": [WEATHER], "tool_choice": "required", "parallel_tool_calls": False,
            "temperature": 0, "max_tokens": 40, "logit_bias": _bias(ids)}
    with http_client(server) as c:
        # auto: the lazy grammar's trigger sees the control token's text too (llama.cpp's trigger buffer holds special pieces)
        for choice_of in ("required", "auto"):
            r = c.post("/v1/chat/completions", json={**body, "tool_choice": choice_of}).json()
            choice = r["choices"][0]
            assert choice["finish_reason"] == "tool_calls", (choice_of, choice)
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"] in ("Paris", "Lyon")
            assert len(call["id"]) == 9  # Mistral's ids
        streamed = c.post("/v1/chat/completions", json={**body, "stream": True}).text
        deltas = [json.loads(line[6:]) for line in streamed.splitlines() if line.startswith("data: {")]
        calls = [tc for d in deltas for tc in d["choices"][0]["delta"].get("tool_calls") or []]
        assert [tc["function"]["name"] for tc in calls] == ["get_weather"]
        assert deltas[-1]["choices"][0]["finish_reason"] == "tool_calls"
        # the same reply as raw text (no tools): the control tokens are its text, as llama-server shows them
        raw = c.post("/v1/completions", json={"model": "m", "prompt": "[INST]weather?[/INST]", "max_tokens": 12, "temperature": 0,
                                              "logit_bias": {str(ids["[TOOL_CALLS]"]): 100}}).json()
        assert raw["choices"][0]["text"].startswith("[TOOL_CALLS][TOOL_CALLS]")


def test_tool_chat_reads_a_call_opened_by_control_tokens(mistral: Path, ids: dict[str, int]) -> None:
    hub = Hub([rogue("chatty", "quick")], limits=Limits(call_timeout=5, start_timeout=20))
    try:
        assert hub.start() == []
        with LlamaCppBackend() as b:
            b.load(mistral, LoadConfig(n_ctx=4096, n_threads=1))
            # the grammar allows more calls after the first (no parallel_tool_calls here): the end of text outbids another
            bias = ((ids["[TOOL_CALLS]"], 50.0), (ids["[ARGS]"], 100.0), (b.tokenize("</s>", add_special=False, parse_special=True)[0], 100.0))
            session = ChatSession(b, sampling=SamplingConfig(temperature=0, max_tokens=40, logit_bias=bias))
            asked: list[ToolCall] = []

            def approve(call: ToolCall) -> Decision:
                asked.append(call)
                return Decision.ONCE

            chat = ToolChat(session, hub, approve=approve, choice="required", max_steps=1)
            assert chat.fmt.name == "ministral"
            events = list(chat.send("Go!"))
            assert [c.name for c in asked] == ["go"] and asked[0].server == "quick"
            assert next(ev for ev in events if isinstance(ev, CallDone)).result.text == "went"
    finally:
        hub.close()


GPT_OSS = (Path(__file__).parent.parent / "toolcalls" / "templates" / "openai-gpt-oss-120b.jinja").read_text("utf-8")
HARMONY = ("<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>")
# what gpt-oss writes: its thinking on the analysis channel, then the answer on the final one
THOUGHT = ('root ::= "<|channel|>analysis<|message|>" "I think." "<|end|>" "<|start|>assistant<|channel|>final<|message|>" "Hi!"\n')


@pytest.fixture(scope="module")
def gpt_oss(tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("harmony")
    path = write_gguf(tmp / "synth-gpt-oss.gguf", SynthSpec(controls=HARMONY, chat_template=GPT_OSS))
    s = Server(str(path), "--ctx", "4096", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp / "home")})
    try:
        with http_client(s) as c:
            got = c.post("/tokenize", json={"content": "".join(HARMONY), "parse_special": True}).json()["tokens"]
        assert len(got) == len(HARMONY)
        yield s, {str(i): 100 for i in got}  # each control token outbids spelling it in bytes
    finally:
        s.stop()


def test_gpt_oss_thinking_answer_and_calls_go_where_each_route_puts_them(gpt_oss) -> None:
    """The analysis channel is the reasoning (reasoning_content: every route's split is
    localllm.reasoning's), the final channel the answer, a call on the commentary channel a tool call."""
    s, bias = gpt_oss
    with http_client(s) as c:
        base = {"model": "m", "messages": ASK, "temperature": 0, "max_tokens": 200, "logit_bias": bias}
        r = c.post("/v1/chat/completions", json={**base, "grammar": THOUGHT}).json()
        msg = r["choices"][0]["message"]
        assert (msg.get("reasoning_content"), msg["content"]) == ("I think.", "Hi!"), r
        streamed = c.post("/v1/chat/completions", json={**base, "grammar": THOUGHT, "stream": True}).text
        deltas = [json.loads(line[6:])["choices"] for line in streamed.splitlines() if line.startswith("data: {")]
        said = [d[0]["delta"] for d in deltas if d]
        assert "".join(d.get("reasoning_content") or "" for d in said) == "I think."
        assert "".join(d.get("content") or "" for d in said) == "Hi!"
        r = c.post("/v1/chat/completions", json={**base, "tools": [WEATHER], "tool_choice": "required"}).json()
        choice = r["choices"][0]
        assert choice["finish_reason"] == "tool_calls", choice
        (call,) = choice["message"]["tool_calls"]
        assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"] in ("Paris", "Lyon")
        assert not choice["message"].get("content")
