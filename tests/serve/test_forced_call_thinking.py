"""A forced call (``tool_choice`` required or named) on a template whose
generation prompt opens the thinking (issue 48): DeepSeek R1's ends the prompt
with ``<think>``, so the reply is thinking first. Held to the call from its
first token, the call was written inside the thinking and read as thinking
(no ``tool_calls``). As llama.cpp does, the grammar lets the thinking come
first and close (``serve/tools.thinking_first``), and the split knows it was open.

The model is synthetic (random weights) with R1 Distill's template and
DeepSeek's markers as tokens; a logit bias makes it close the thinking and
write the markers as the tokens they are."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.reasoning import MARKERS
from localllm.serve import tools
from localllm.toolcalls import DEEPSEEK, HERMES
from scripts.synth_gguf import SynthSpec, write_gguf
from tests.helpers.server import KEY, Server, http_client

TEMPLATE = (Path(__file__).parent.parent / "toolcalls" / "templates" / "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja").read_text("utf-8")
CONTROLS = ("<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>",
            "<｜tool▁calls▁end｜>", "</think>")
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city", "parameters": {
    "type": "object", "properties": {"city": {"enum": ["Paris", "Lyon"]}}, "required": ["city"]}}}


def test_the_grammar_puts_the_thinking_first() -> None:
    req = tools.parse_request({"tools": [WEATHER], "tool_choice": "required"}, DEEPSEEK)
    assert req is not None and req.grammar is not None
    g = tools.thinking_first(req.grammar, MARKERS[0])
    assert g.startswith('root ::= thinking "</think>" [ \\t\\r\\n]{0,4} tool-root\nthinking ::= ([^<] | "<" [^/] | "</" [^t] |')
    assert '\ntool-root ::= "<｜tool▁calls▁begin｜>" tool-call+ "<｜tool▁calls▁end｜>"\n' in g
    assert g.count("root ::=") == 2  # the format's root, renamed, once
    named = tools.parse_request({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "get_weather"}}}, HERMES)
    assert named is not None and named.grammar is not None
    assert tools.thinking_first(named.grammar, MARKERS[2]).startswith('root ::= thinking "[/THINK]" ')


@pytest.mark.slow
def test_a_forced_call_after_an_opened_thinking_is_a_call(tmp_path_factory: pytest.TempPathFactory) -> None:
    tmp = tmp_path_factory.mktemp("r1")
    path = write_gguf(tmp / "synth-r1.gguf", SynthSpec(controls=CONTROLS, chat_template=TEMPLATE))
    s = Server(str(path), "--ctx", "2048", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp / "home")})
    try:
        with http_client(s) as c:
            ids = c.post("/tokenize", json={"content": "".join(CONTROLS), "parse_special": True}).json()["tokens"]
            assert len(ids) == len(CONTROLS)
            bias = {str(i): 100 for i in ids[2:]}  # the call's markers and </think> outbid their spelling in bytes
            body = {"model": "m", "messages": [{"role": "user", "content": "Weather in Paris?"}], "tools": [WEATHER],
                    "tool_choice": "required", "parallel_tool_calls": False, "temperature": 0, "max_tokens": 120, "logit_bias": bias}
            r = c.post("/v1/chat/completions", json=body).json()
            choice = r["choices"][0]
            assert choice["finish_reason"] == "tool_calls", choice
            (call,) = choice["message"]["tool_calls"]
            assert call["function"]["name"] == "get_weather" and json.loads(call["function"]["arguments"])["city"] in ("Paris", "Lyon")
            streamed = c.post("/v1/chat/completions", json={**body, "stream": True}).text
            deltas = [json.loads(line[6:])["choices"] for line in streamed.splitlines() if line.startswith("data: {")]
            calls = [tc for d in deltas if d for tc in d[0]["delta"].get("tool_calls") or []]
            assert [tc["function"]["name"] for tc in calls] == ["get_weather"]
    finally:
        s.stop()
