"""Tool calls (issue 25, item 2), the pure part: which format a chat template
teaches, the catalog's real templates rendering tools, calls and results, each
family's replies parsed into OpenAI's ``tool_calls``, streaming that holds back
only what may be a call, and bad ``tools`` values named.

The templates under ``templates/`` are the models' own, as llama.cpp keeps
them in models/templates/."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.engine.chat_template import ChatTemplate
from localllm.serve import tools
from localllm.serve.protocol import RequestError, parse_gen
from tests.helpers.vocab import grammar_takes

TEMPLATES = Path(__file__).parent / "templates"
WEATHER = {"type": "function", "function": {"name": "get_weather", "description": "The weather in a city",
                                            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def _template(name: str) -> str:
    return (TEMPLATES / name).read_text(encoding="utf-8")


def test_each_catalog_family_is_read_from_its_template() -> None:
    assert tools.detect(_template("Qwen-Qwen2.5-7B-Instruct.jinja")) is tools.HERMES
    assert tools.detect(_template("meta-llama-Llama-3.1-8B-Instruct.jinja")) is tools.LLAMA3
    assert tools.detect(_template("meta-llama-Llama-3.2-3B-Instruct.jinja")) is tools.LLAMA3
    assert tools.detect(_template("mistralai-Mistral-Nemo-Instruct-2407.jinja")) is tools.MISTRAL
    # no tool calling in these: the generic format (tools described in a system message)
    assert tools.detect(_template("microsoft-Phi-3.5-mini-instruct.jinja")) is tools.GENERIC
    gemma = tools.detect(_template("google-gemma-2-2b-it.jinja"))
    assert gemma.name == "generic" and not gemma.system_role  # it refuses a system message
    assert tools.detect("{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}") is tools.GENERIC
    assert tools.detect(None) is tools.GENERIC


def _conversation(fmt: tools.Format) -> tuple[list[dict], tools.ToolRequest | None]:
    """A full round: the user asks, the assistant calls, the tool answers; through parse_gen as serve parses it."""
    call_id = "abcDEF123"  # 9 alphanumerics: Mistral's templates insist
    body = {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": call_id, "type": "function",
                                                                "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'}}]},
        {"role": "tool", "tool_call_id": call_id, "content": "sunny, 21 C"}]}
    p = parse_gen(body, chat=True, n_vocab=100, tool_format=fmt)
    assert p.messages is not None
    return p.messages, p.tools


@pytest.mark.parametrize("name, fmt, call_text", [
    ("Qwen-Qwen2.5-7B-Instruct.jinja", tools.HERMES, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", tools.LLAMA3, '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", tools.MISTRAL, '[TOOL_CALLS][{"name": "get_weather", "arguments": {"city": "Paris"}'),
])
def test_real_templates_render_tools_calls_and_results(name: str, fmt: tools.Format, call_text: str) -> None:
    messages, req = _conversation(fmt)
    assert req is not None and req.template_tools == [WEATHER]
    text = ChatTemplate(_template(name), name).render(messages, bos_token="<s>", eos_token="</s>", add_generation_prompt=True,
                                                      tools=req.template_tools)
    assert "The weather in a city" in text  # the tool reached the template
    assert call_text in text  # the assistant's call, arguments as an object, in the model's own format
    assert "sunny, 21 C" in text  # the tool's result continues the conversation


def test_gemma_gets_the_tools_and_results_as_user_turns() -> None:
    """Gemma 2's template refuses a system message and wants roles to alternate."""
    gemma = tools.detect(_template("google-gemma-2-2b-it.jinja"))
    body = {"tools": [WEATHER], "messages": [
        {"role": "user", "content": "Weather in Paris and Rome?"},
        {"role": "assistant", "tool_calls": [{"id": f"c{i}", "type": "function", "function": {"name": "get_weather", "arguments": json.dumps({"city": c})}}
                                             for i, c in enumerate(("Paris", "Rome"))]},
        {"role": "tool", "tool_call_id": "c0", "content": "sunny"}, {"role": "tool", "tool_call_id": "c1", "content": "rain"}]}
    p = parse_gen(body, chat=True, n_vocab=100, tool_format=gemma)
    assert p.messages is not None and [m["role"] for m in p.messages] == ["user", "assistant", "user"]
    text = ChatTemplate(_template("google-gemma-2-2b-it.jinja"), "gemma").render(p.messages, bos_token="<bos>", eos_token="<eos>",
                                                                                add_generation_prompt=True)
    assert '"name": "get_weather"' in text and "sunny" in text and "rain" in text and text.endswith("<start_of_turn>model\n")


def test_generic_format_says_the_tools_in_a_system_message() -> None:
    messages, req = _conversation(tools.GENERIC)
    assert req is not None and req.template_tools is None
    assert messages[0]["role"] == "system" and '"name": "get_weather"' in messages[0]["content"]
    assert messages[2] == {"role": "assistant", "content": '{"name": "get_weather", "arguments": {"city": "Paris"}}'}
    assert messages[3]["role"] == "user" and json.loads(messages[3]["content"])["tool_response"]["content"] == "sunny, 21 C"


NAMES = {"get_weather", "now"}


@pytest.mark.parametrize("fmt, reply, content, calls", [
    (tools.HERMES, 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
                   '<tool_call>{"name": "now", "arguments": {}}</tool_call>', "Let me look.\n",
     [("get_weather", {"city": "Paris"}), ("now", {})]),
    (tools.HERMES, '{"name": "now", "arguments": {}}', "", [("now", {})]),  # <tool_call> a control token, not in the text
    (tools.LLAMA3, ' {"name": "get_weather", "parameters": {"city": "Oslo"}}', "", [("get_weather", {"city": "Oslo"})]),
    (tools.LLAMA3, '<|python_tag|>{"name": "now", "parameters": {}}', "", [("now", {})]),
    (tools.MISTRAL, '[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "now", "arguments": {}}]', "",
     [("get_weather", {"city": "Rome"}), ("now", {})]),
    (tools.MISTRAL, '[TOOL_CALLS][{"name": "now", "arguments": {}}]', "", [("now", {})]),
    (tools.GENERIC, '{"name": "get_weather", "arguments": {"city": "Lima"}}', "", [("get_weather", {"city": "Lima"})]),
    # not calls: all content
    (tools.HERMES, '<tool_call>{"name": "get_weather", "arguments": {"ci', None, []),  # cut short
    (tools.HERMES, '<tool_call>{"name": "now", "arguments": {}}</tool_call>\n<tool_call>{"na', None, []),  # the second cut short
    (tools.GENERIC, '{"name": "get_weather", "arguments": {"city": "a\x1cb"}}', "", [("get_weather", {"city": "a\x1cb"})]),  # the grammar allows it
    (tools.LLAMA3, '{"name": "launch_missiles", "parameters": {}}', None, []),  # a function nobody offered
    (tools.GENERIC, '{"name": "now", "arguments": {}, "extra": 1}', None, []),
    (tools.MISTRAL, "Sure: [1, 2]", None, []),
    (tools.GENERIC, "Hello there", None, []),
])
def test_replies_parse_per_family(fmt: tools.Format, reply: str, content: str | None, calls: list) -> None:
    got_content, got = tools.parse_reply(reply, fmt, NAMES)
    assert got_content == (reply if content is None else content)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    for c in got:
        assert c["type"] == "function" and isinstance(c["function"]["arguments"], str)
        assert len(c["id"]) == 9 and c["id"].isalnum() if fmt is tools.MISTRAL else c["id"].startswith("call_")


def _request(fmt: tools.Format, **body) -> tools.ToolRequest:
    req = tools.parse_request({"tools": [WEATHER, {"type": "function", "function": {"name": "now"}}], **body}, fmt)
    assert req is not None
    return req


def _stream(req: tools.ToolRequest, pieces: list[str]) -> tuple[str, list[dict]]:
    s = tools.ReplySplitter(req)
    sent = "".join(s.feed(p) for p in pieces)
    rest, calls = s.finish()
    return sent + rest, calls


def test_streaming_holds_back_only_what_may_be_a_call() -> None:
    req = _request(tools.HERMES)
    s = tools.ReplySplitter(req)
    assert s.feed("Checking the") == "Checking the"
    assert s.feed(" weather <tool") == " weather "  # may begin <tool_call>: held
    assert s.feed('_call>{"name": "now", ') == ""
    assert s.feed('"arguments": {}}</tool_call>') == ""
    rest, calls = s.finish()
    assert rest == "" and [c["function"]["name"] for c in calls] == ["now"]
    # a held tail that turns out not to be a call is sent in the end
    assert _stream(req, ["a <to", "y> b"]) == ("a <toy> b", [])
    # the JSON formats: the first character decides
    assert _stream(_request(tools.LLAMA3), ["Hel", "lo"]) == ("Hello", [])
    text, calls = _stream(_request(tools.LLAMA3), [' {"name": "now",', ' "parameters": {}}'])
    assert text == "" and calls[0]["function"]["name"] == "now"
    assert _stream(_request(tools.GENERIC), ["{1: ", "2}"]) == ("{1: 2}", [])


def test_tool_choice_shapes_the_grammar() -> None:
    auto = _request(tools.HERMES)
    assert auto.choice == "auto" and auto.triggers == (tools.HERMES.trigger,)  # free text until <tool_call>
    required = _request(tools.HERMES, tool_choice="required")
    assert required.triggers == () and required.grammar.startswith("root ::= tool-block (")  # one or more calls from the start
    single = _request(tools.HERMES, tool_choice="required", parallel_tool_calls=False)
    assert single.grammar.startswith("root ::= tool-block\n")
    named = _request(tools.MISTRAL, tool_choice={"type": "function", "function": {"name": "now"}})
    assert '"\\"now\\""' in named.grammar and "get_weather" not in named.grammar
    assert tools.parse_request({"tools": [WEATHER], "tool_choice": "none"}, tools.HERMES) is None
    assert tools.parse_request({}, tools.HERMES) is None
    assert '"\\"parameters\\""' in _request(tools.LLAMA3, tool_choice="required").grammar


@pytest.mark.parametrize("fmt, so_far, capture", [
    (tools.HERMES, "Let me check. <tool_call>", "<tool_call>"),
    (tools.HERMES, 'Ok <tool_call>\n{"', '<tool_call>\n{"'),  # a token that ran on past the marker
    (tools.HERMES, "<tool_call> x", None),  # text the grammar would refuse: never replayed into it
    (tools.MISTRAL, "[TOOL_CALLS]", "[TOOL_CALLS]"),
    (tools.MISTRAL, '[TOOL_CALLS][{"', '[TOOL_CALLS][{"'),
    (tools.LLAMA3, '{"name":', '{"name":'),
    (tools.LLAMA3, '\n{\n  "name": "', '{\n  "name": "'),
    (tools.LLAMA3, '<|python_tag|>{"name":', '{"name":'),  # the control token's text is in what llama.cpp matches
    (tools.GENERIC, '{"names": ', None),
    (tools.GENERIC, 'The answer is {"name":', None),  # a JSON format's call is the whole reply
])
def test_lazy_triggers_capture_only_what_the_grammar_takes(fmt: tools.Format, so_far: str, capture: str | None) -> None:
    """llama.cpp tries the trigger (ECMAScript regex, the same here) on the reply so
    far after each token, and replays from its capture into the grammar."""
    import re

    m = re.search(fmt.trigger, so_far)
    assert (m.group(1) if m else None) == capture


@pytest.mark.parametrize("body, field", [
    ({"tools": {"type": "function"}}, "tools"),
    ({"tools": [{"type": "function", "function": {"description": "no name"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [{"type": "retrieval"}]}, "tools[0]"),
    ({"tools": [{"type": "function", "function": {"name": "f", "parameters": "object"}}]}, "tools[0].function.parameters"),
    ({"tools": [WEATHER, {"type": "function", "function": {"name": "f", "parameters": {"$ref": "https://example.com/s.json"}}}]},
     "tools[1].function.parameters"),
    ({"tools": [WEATHER], "tool_choice": "always"}, "tool_choice"),
    ({"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "other"}}}, "tool_choice"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tools": [WEATHER], "parallel_tool_calls": "yes"}, "parallel_tool_calls"),
    ({"tools": [WEATHER], "response_format": {"type": "json_object"}}, "response_format"),
    ({"functions": [WEATHER["function"]]}, "functions"),
    ({"messages": [{"role": "tool", "content": "x"}]}, "messages[0].tool_call_id"),
    ({"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]}, "messages[0].tool_calls[0]"),
])
def test_bad_tool_values_are_400s_naming_the_field(body: dict, field: str) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], **body}
    with pytest.raises(RequestError) as info:
        parse_gen(body, chat=True, n_vocab=100, tool_format=tools.HERMES)
    assert info.value.status == 400 and info.value.param == field, info.value.message


# -- the formats of localllm.toolcalls, as serve uses them (issue 48, item 1) ---------------

def test_templates_that_share_tool_call_are_told_apart() -> None:
    """``<tool_call>`` alone no longer means Hermes: Qwen3-Coder's XML and GLM's key/values are their own."""
    from localllm import toolcalls

    assert tools.detect(_template("Qwen-Qwen2.5-7B-Instruct.jinja")) is tools.HERMES
    coder = (Path(__file__).parents[1] / "toolcalls" / "templates" / "Qwen3-Coder.jinja").read_text(encoding="utf-8")
    assert tools.detect(coder) is toolcalls.QWEN3_CODER
    glm = (Path(__file__).parents[1] / "reasoning" / "templates" / "GLM-4.6.jinja").read_text(encoding="utf-8")
    assert tools.detect(glm) is toolcalls.GLM


def _every_format() -> list[tools.Format]:
    from localllm import toolcalls

    return list(toolcalls.FORMATS)


@pytest.fixture(scope="module")
def vocab(smollm2_vocab):
    """SmolLM2's vocabulary alone, as a tokenizer (tests/conftest.py)."""
    from localllm.engine.tokenizer import Tokenizer

    return Tokenizer(smollm2_vocab, None)


_ARGS = '{"city": "Paris"}'
_J = '{"name": "get_weather", "arguments": ' + _ARGS + "}"
# each format's call as its grammar (tool_choice required) writes it: the grammar takes it, the parser reads it back
WRITTEN = {
    "hermes": f"<tool_call>\n{_J}\n</tool_call>", "llama3": '{"name": "get_weather", "parameters": ' + _ARGS + "}",
    "mistral": f"[TOOL_CALLS][{_J}]", "generic": _J, "nemotron-v2": f"<TOOLCALL>[{_J}]</TOOLCALL>", "granite": f"<|tool_call|>[{_J}]",
    "command-r7b": '<|START_ACTION|>[{"name": "get_weather", "parameters": ' + _ARGS + "}]<|END_ACTION|>",
    "command-r-plus": 'Action:\n```json\n[{"name": "get_weather", "parameters": ' + _ARGS + "}]\n```",
    "apertus": '<|tools_prefix|>[{"get_weather": ' + _ARGS + "}]<|tools_suffix|>", "apriel": f"<tool_calls>[{_J}]</tool_calls>",
    "firefunction-v2": f" functools[{_J}]", "gigachat3": f"<|message_sep|>\n\nfunction call<|role_sep|>\n{_J}",
    "gigachat3.1": f"<|function_call|>{_J}", "functionary-v3.1": f"<function=get_weather>{_ARGS}</function>",
    "ministral": f"[TOOL_CALLS]get_weather[ARGS]{_ARGS}",
    "kimi-k2": f"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{_ARGS}"
               "<|tool_call_end|><|tool_calls_section_end|>",
    "deepseek": f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{_ARGS}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
    "gpt-oss": f"<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{_ARGS}",
    "functionary-v3.2": f"get_weather\n{_ARGS}",
}


@pytest.mark.slow
@pytest.mark.parametrize("fmt", _every_format(), ids=lambda f: f.name)
def test_every_formats_grammar_parses_in_llama_cpp_and_its_call_parses_back(fmt: tools.Format, vocab) -> None:
    """tool_choice auto (lazy, from the trigger), required (one or parallel calls) and
    named: llama.cpp's GBNF parser takes each grammar (SmolLM2's vocabulary); the
    call the required grammar lets through parses back into the call."""
    import llama_cpp

    from localllm.engine import grammar

    for body in ({}, {"tool_choice": "required"}, {"tool_choice": "required", "parallel_tool_calls": False},
                 {"tool_choice": {"type": "function", "function": {"name": "get_weather"}}}):
        req = _request(fmt, **body)
        if req.grammar is None:  # no grammar of its own (XML-ish arguments): auto is free text
            assert fmt.json_fallback and req.choice == "auto" and req.triggers == ()
            continue
        llama_cpp.llama_sampler_free(grammar.init(vocab.vocab, req.grammar, req.triggers))
    req = _request(fmt, tool_choice="required")
    text = _J if fmt.json_fallback else WRITTEN[fmt.name]  # a forced call of an XML-ish format: the generic JSON object
    assert grammar_takes(vocab, req.grammar, text)
    assert not grammar_takes(vocab, req.grammar, text.replace("get_weather", "get_wether"))  # the walk can fail
    content, calls = tools.parse_reply(text, req.fmt, NAMES)
    assert content == "" and [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in calls] == [("get_weather", {"city": "Paris"})]


_NOW = '{"name": "now", "arguments": {}}'
PARALLEL = {
    "hermes": f"<tool_call>\n{_J}\n</tool_call>\n<tool_call>\n{_NOW}\n</tool_call>", "mistral": f"[TOOL_CALLS][{_J}, {_NOW}]",
    "nemotron-v2": f"<TOOLCALL>[{_J}, {_NOW}]</TOOLCALL>", "ministral": f"[TOOL_CALLS]get_weather[ARGS]{_ARGS}[TOOL_CALLS]now[ARGS]{{}}",
    "kimi-k2": f"<|tool_calls_section_begin|><|tool_call_begin|>functions.get_weather:0<|tool_call_argument_begin|>{_ARGS}<|tool_call_end|>"
               "<|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}<|tool_call_end|><|tool_calls_section_end|>",
    "deepseek": f"<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_weather<｜tool▁sep｜>{_ARGS}<｜tool▁call▁end｜>"
                "<｜tool▁call▁begin｜>now<｜tool▁sep｜>{}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", sorted(PARALLEL))
def test_parallel_calls_pass_the_grammar_and_parse_back(name: str, vocab) -> None:
    from localllm import toolcalls

    fmt = next(f for f in toolcalls.FORMATS if f.name == name)
    text = PARALLEL[name]
    assert grammar_takes(vocab, _request(fmt, tool_choice="required").grammar, text)
    _, calls = tools.parse_reply(text, fmt, NAMES)
    assert [c["function"]["name"] for c in calls] == ["get_weather", "now"]


def test_parallel_calls_follow_the_format_and_the_request() -> None:
    from localllm import toolcalls

    for fmt in (toolcalls.HERMES, toolcalls.MISTRAL, toolcalls.KIMI_K2, toolcalls.DEEPSEEK, toolcalls.NEMOTRON_V2):
        assert _request(fmt, tool_choice="required").grammar.startswith(fmt.root_many)
        assert _request(fmt, tool_choice="required", parallel_tool_calls=False).grammar.startswith(fmt.root_one)
    for fmt in (toolcalls.LLAMA3, toolcalls.GENERIC):  # one call a reply
        assert _request(fmt, tool_choice="required").grammar.startswith("root ::= tool-call\n")


@pytest.mark.parametrize("fmt_name, reply, content, calls, ids", [
    ("QWEN3_CODER", "Let me look.\n<tool_call>\n<function=get_weather>\n<parameter=city>\n1984\n</parameter>\n</function>\n</tool_call>",
     "Let me look.\n", [("get_weather", {"city": "1984"})], None),  # a string by the schema, though it spells a number
    ("KIMI_K2", "<|tool_calls_section_begin|><|tool_call_begin|>functions.now:0<|tool_call_argument_begin|>{}<|tool_call_end|>"
     "<|tool_call_begin|>functions.get_weather:1<|tool_call_argument_begin|>{\"city\": \"Oslo\"}<|tool_call_end|>"
     "<|tool_calls_section_end|>", "", [("now", {}), ("get_weather", {"city": "Oslo"})], ["functions.now:0", "functions.get_weather:1"]),
    ("MINISTRAL", '[TOOL_CALLS]now[CALL_ID]abcDEF123[ARGS]{}', "", [("now", {})], ["abcDEF123"]),
    ("HARMONY", "<|channel|>analysis<|message|>Need weather.<|end|><|start|>assistant<|channel|>commentary to=functions.get_weather "
     "<|constrain|>json<|message|>{\"city\": \"Rome\"}<|call|>", "", [("get_weather", {"city": "Rome"})], None),
    ("GLM", "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Lima</arg_value>\n</tool_call>", "",
     [("get_weather", {"city": "Lima"})], None),
    ("QWEN3_CODER", "<tool_call>\n<function=launch>\n</function>\n</tool_call>", None, [], None),  # not offered: all content
])
def test_new_families_parse_into_openai_calls(fmt_name: str, reply: str, content: str | None, calls: list, ids: list | None) -> None:
    from localllm import toolcalls

    req = _request(getattr(toolcalls, fmt_name))
    got_content, got = tools.parse_reply(reply, req.fmt, NAMES)
    assert got_content == (reply if content is None else content)
    assert [(c["function"]["name"], json.loads(c["function"]["arguments"])) for c in got] == calls
    if ids is not None:
        assert [c["id"] for c in got] == ids
    # streamed a character at a time through the splitter, the same
    s = tools.ReplySplitter(req)
    sent = "".join(s.feed(ch) for ch in reply)
    rest, streamed = s.finish()
    assert sent + rest == got_content
    assert [(c["function"]["name"], c["function"]["arguments"]) for c in streamed] == [(c["function"]["name"], c["function"]["arguments"])
                                                                                        for c in got]


def test_gpt_oss_thinking_is_kept_apart_from_the_answer() -> None:
    from localllm import toolcalls

    reply = "<|channel|>analysis<|message|>Weather, so a call.<|end|><|start|>assistant<|channel|>final<|message|>Sunny."
    assert tools.split_reply(reply, toolcalls.HARMONY, NAMES) == ("Weather, so a call.", "Sunny.", [])
    assert tools.parse_reply(reply, toolcalls.HARMONY, NAMES) == ("Sunny.", [])
    bad = "<|channel|>analysis<|message|>x<|end|><|start|>assistant<|channel|>commentary to=functions.launch<|message|>{}"
    assert tools.split_reply(bad, toolcalls.HARMONY, NAMES) == (None, bad, [])  # a function not offered: all text, as it came
