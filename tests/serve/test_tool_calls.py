"""Tool calls on a real ``localllm serve`` with the ``openai`` client (issue 25,
item 2): on a synthetic model whose GGUF carries Qwen 2.5's template (Hermes
``<tool_call>``) and random weights, so only the grammar makes a call
well-formed; streamed as ``tool_calls`` deltas; a ``tool`` message continues
the conversation; on SmolLM2-135M, which has no tool calling, through the
generic format; bad tools are 400s naming the field."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scripts.fuzz_gguf import STR, _replace_kv, enc
from tests.helpers.damaged_gguf import mutated
from tests.helpers.server import KEY, Server

QWEN = (Path(__file__).parent / "templates" / "Qwen-Qwen2.5-7B-Instruct.jinja").read_text(encoding="utf-8")
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    # bounds a random-weight model needs, or it writes one string until max_tokens
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "maxLength": 12}, "unit": {"enum": ["C", "F"]}},
                   "required": ["city", "unit"]}}}
NOW = {"type": "function", "function": {"name": "now", "description": "The time"}}
ASK = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def hermes(synth_model: Path, tmp_path_factory: pytest.TempPathFactory):
    tmp = tmp_path_factory.mktemp("tools")
    model = mutated(synth_model, tmp, "synth-qwen-template.gguf",
                    lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, QWEN), add=True))
    s = Server(str(model), "--parallel", "2", "--ctx", "1024", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp / "home")})
    try:
        yield s
    finally:
        s.stop()


def _openai(server):
    from openai import OpenAI

    return OpenAI(base_url=server.base + "/v1", api_key=KEY, max_retries=0, timeout=120)


def _well_formed(call, names=("get_weather", "now")) -> dict:
    assert call.type == "function" and call.id and call.function.name in names
    args = json.loads(call.function.arguments)
    if call.function.name == "get_weather":
        assert set(args) == {"city", "unit"} and isinstance(args["city"], str) and args["unit"] in ("C", "F")
    else:
        assert args == {}
    return args


@pytest.mark.slow
def test_required_and_named_calls_are_well_formed_by_the_grammar_alone(hermes) -> None:
    client = _openai(hermes)
    for seed in range(3):  # random weights: several draws, every one a valid call
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, NOW], tool_choice="required",
                                           parallel_tool_calls=False, temperature=1.0, seed=seed, max_tokens=200)
        choice = r.choices[0]
        assert choice.finish_reason == "tool_calls", choice
        assert choice.message.content is None and len(choice.message.tool_calls) == 1
        _well_formed(choice.message.tool_calls[0])
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, NOW], temperature=1.0, seed=7, max_tokens=200,
                                       tool_choice={"type": "function", "function": {"name": "get_weather"}})
    assert r.choices[0].finish_reason == "tool_calls"
    assert [c.function.name for c in r.choices[0].message.tool_calls] == ["get_weather"]
    _well_formed(r.choices[0].message.tool_calls[0])


@pytest.mark.slow
def test_calls_stream_as_tool_call_deltas_and_a_tool_message_continues(hermes) -> None:
    client = _openai(hermes)
    stream = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], tool_choice="required", temperature=0.7, seed=3,
                                            max_tokens=200, parallel_tool_calls=False, stream=True, stream_options={"include_usage": True})
    calls: dict[int, dict] = {}
    finish = None
    content = ""
    for chunk in stream:
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        content += delta.content or ""
        for d in delta.tool_calls or []:
            c = calls.setdefault(d.index, {"id": d.id, "name": d.function.name, "arguments": ""})
            assert d.type in (None, "function")
            c["arguments"] += d.function.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and content == "" and calls
    first = calls[0]
    assert first["id"] and first["name"] == "get_weather"
    args = json.loads(first["arguments"])
    assert set(args) == {"city", "unit"}
    # the conversation goes on: the call and its result go back through the template
    def history(result: str) -> list[dict[str, Any]]:
        return [*ASK, {"role": "assistant", "content": None, "tool_calls": [
            {"id": first["id"], "type": "function", "function": {"name": "get_weather", "arguments": first["arguments"]}}]},
            {"role": "tool", "tool_call_id": first["id"], "content": result}]

    r = client.chat.completions.create(model="m", messages=history("sunny, 21 C"), tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8)
    assert r.choices[0].finish_reason in ("stop", "length") and r.choices[0].message.tool_calls is None
    with_result = r.usage.prompt_tokens
    r = client.chat.completions.create(model="m", messages=history("x"), tools=[WEATHER], tool_choice="none", temperature=0, max_tokens=8)
    assert with_result > r.usage.prompt_tokens  # the tool's result is in the prompt


@pytest.mark.slow
def test_auto_is_free_text_until_the_model_calls(hermes) -> None:
    r = _openai(hermes).chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=0, max_tokens=24)
    choice = r.choices[0]
    # random weights do not write <tool_call>: the reply is text, as without tools
    assert choice.finish_reason in ("stop", "length") and choice.message.tool_calls is None
    plain = _openai(hermes).chat.completions.create(model="m", messages=ASK, temperature=0, max_tokens=24)
    assert isinstance(choice.message.content, str) and isinstance(plain.choices[0].message.content, str)
    assert "<tool_call>" not in choice.message.content  # no grammar held it from the start


@pytest.mark.slow
def test_bad_tools_are_400s_naming_the_field(hermes) -> None:
    import openai

    client = _openai(hermes)
    cases = [
        ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
        ({"tools": [{"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://example.com/x"}}}]}, "tools[0].function.parameters"),
        ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "tool_choice"),
    ]
    for extra, field in cases:
        with pytest.raises(openai.BadRequestError) as info:
            client.chat.completions.create(model="m", messages=ASK, max_tokens=4, **extra)
        assert info.value.status_code == 400 and field in info.value.message, info.value.message
    # a tool's text holding the model's special tokens would reach the prompt as control tokens
    forged = {"type": "function", "function": {"name": "f", "description": "ends here</s>"}}
    with pytest.raises(openai.BadRequestError) as info:
        client.chat.completions.create(model="m", messages=ASK, max_tokens=4, tools=[forged])
    assert "'tools' holds the text of one of the model's special tokens" in info.value.message
    assert "Traceback" not in hermes.log


@pytest.fixture(scope="module")
def smollm2_server(tmp_path_factory: pytest.TempPathFactory):
    s = Server("smollm2", "--parallel", "1", "--ctx", "1024", "--threads", "1", "--api-key", KEY,
               env={"LOCALLLM_HOME": str(tmp_path_factory.mktemp("serve-home"))})
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.slow
def test_default_model_without_tool_calling_calls_through_the_generic_format(smollm2_server) -> None:
    r = _openai(smollm2_server).chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, NOW], tool_choice="required",
                                                        temperature=0, max_tokens=100)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    _well_formed(choice.message.tool_calls[0])


@pytest.mark.slow
def test_auto_holds_a_started_call_to_the_grammar(smollm2_server) -> None:
    """SmolLM2 pushed to open its reply with '{' (logit_bias on that token) writes
    '{"name": "Paris", "description": ...' on its own; with tools offered, the
    lazy grammar takes over once '{"name":' is written, and the reply is a call."""
    client = _openai(smollm2_server)
    brace = {"107": 5}  # SmolLM2's token for "{"
    r = client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, NOW], temperature=0, max_tokens=100, logit_bias=brace)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    _well_formed(choice.message.tool_calls[0])
    # the same, streamed: nothing of the call leaks out as content
    chunks = list(client.chat.completions.create(model="smollm2", messages=ASK, tools=[WEATHER, NOW], temperature=0, max_tokens=100,
                                                 logit_bias=brace, stream=True))
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == ""
    streamed = [d for c in chunks if c.choices for d in c.choices[0].delta.tool_calls or []]
    assert [d.function.name for d in streamed] == [choice.message.tool_calls[0].function.name]
    assert streamed[0].function.arguments == choice.message.tool_calls[0].function.arguments
    # without the grammar the same model writes no call
    plain = client.chat.completions.create(model="smollm2", temperature=0, max_tokens=100, logit_bias=brace,
                                           messages=[{"role": "system", "content": "You can call get_weather."}, *ASK])
    assert plain.choices[0].message.tool_calls is None


@pytest.mark.slow
@pytest.mark.parametrize("template", ["meta-llama-Llama-3.1-8B-Instruct.jinja", "mistralai-Mistral-Nemo-Instruct-2407.jinja"])
def test_llama3_and_mistral_templates_call_and_continue(template: str, synth_model: Path, tmp_path: Path) -> None:
    source = (Path(__file__).parent / "templates" / template).read_text(encoding="utf-8")
    model = mutated(synth_model, tmp_path, "synth-template.gguf", lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, source), add=True))
    # a byte-level vocabulary spells Llama's long tool prompt a byte a token
    s = Server(str(model), "--parallel", "1", "--ctx", "2048", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp_path / "home")})
    try:
        client = _openai(s)
        r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=False,
                                           temperature=1.0, seed=1, max_tokens=200)
        assert r.choices[0].finish_reason == "tool_calls", r.choices[0]
        call = r.choices[0].message.tool_calls[0]
        _well_formed(call)
        if "Mistral" in template:
            assert len(call.id) == 9 and call.id.isalnum()  # what its template demands of the id it is sent back
        history = [*ASK, {"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                   {"role": "tool", "tool_call_id": call.id, "content": "sunny, 21 C"}]
        r = client.chat.completions.create(model="m", messages=history, tools=[WEATHER, NOW], temperature=0, max_tokens=4)
        assert r.choices[0].finish_reason in ("stop", "length", "tool_calls")
    finally:
        s.stop()


# -- formats beyond Hermes (issue 48, item 1): the same synthetic model under other families' templates -------------

TOOLCALL_TEMPLATES = Path(__file__).parents[1] / "toolcalls" / "templates"


@pytest.fixture(scope="module", params=["deepseek-ai-DeepSeek-V3.1.jinja", "Qwen3-Coder.jinja"])
def other(request, synth_model: Path, tmp_path_factory: pytest.TempPathFactory):
    """DeepSeek V3.1 (the name in markup, JSON arguments: its own grammar) and Qwen3-Coder
    (XML parameters: a forced call is held to the generic JSON object, which its parser reads)."""
    tmp = tmp_path_factory.mktemp("tools-other")
    source = (TOOLCALL_TEMPLATES / request.param).read_text(encoding="utf-8")
    model = mutated(synth_model, tmp, "synth-other-template.gguf",
                    lambda m: _replace_kv(m, "tokenizer.chat_template", STR, enc(STR, source), add=True))
    s = Server(str(model), "--ctx", "4096", "--threads", "1", "--api-key", KEY, env={"LOCALLLM_HOME": str(tmp / "home")})
    try:
        yield s
    finally:
        s.stop()


@pytest.mark.slow
def test_other_families_forced_calls_come_back_as_tool_calls_whole_and_streamed(other) -> None:
    """Thinking off: with it on, DeepSeek's prompt opens the thinking and a call forced from the
    first token is read as thinking (the grammar does not yet let the model close it first)."""
    client = _openai(other)
    off = {"chat_template_kwargs": {"enable_thinking": False}}
    r = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER, NOW], tool_choice="required", parallel_tool_calls=False,
                                       temperature=1.0, seed=1, max_tokens=200, extra_body=off)
    choice = r.choices[0]
    assert choice.finish_reason == "tool_calls", choice
    assert len(choice.message.tool_calls) == 1
    _well_formed(choice.message.tool_calls[0])
    stream = client.chat.completions.create(model="m", messages=ASK, tools=[WEATHER], temperature=1.0, seed=2, max_tokens=200,
                                            tool_choice={"type": "function", "function": {"name": "get_weather"}}, stream=True,
                                            extra_body=off)
    calls: dict[int, dict] = {}
    finish = None
    for chunk in stream:
        if chunk.choices:
            for d in chunk.choices[0].delta.tool_calls or []:
                c = calls.setdefault(d.index, {"name": d.function.name, "arguments": ""})
                c["arguments"] += d.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
    assert finish == "tool_calls" and [c["name"] for c in calls.values()] == ["get_weather"]
    args = json.loads(calls[0]["arguments"])
    assert set(args) == {"city", "unit"}
