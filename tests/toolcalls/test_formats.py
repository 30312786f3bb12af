"""Tool-call formats as llama.cpp reads them (issue 48, item 1): each
template ``tests/test-chat.cpp`` exercises is detected from its markers,
and the model outputs test-chat.cpp feeds llama.cpp's parsers parse back to
the same calls, content and reasoning, whole and streamed one character at a
time. The templates are llama.cpp's own (models/templates/), copied under
``templates/`` here and under tests/serve/ and tests/reasoning/."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from localllm import toolcalls
from localllm.engine.chat_template import ChatTemplate, TemplateError  # the project's own jinja sandbox, as serve renders
from localllm.reasoning import Markers, markers
from localllm.toolcalls import Call, Format, Stream, collect, detect, parse

HERE = Path(__file__).parent
DIRS = (HERE / "templates", HERE.parent / "serve" / "templates", HERE.parent / "reasoning" / "templates")


def template(name: str) -> str:
    for d in DIRS:
        if (d / name).exists():
            return (d / name).read_text(encoding="utf-8")
    raise FileNotFoundError(name)


# The family each template test-chat.cpp exercises is read as ("generic": llama.cpp has a parser this package has not).
DETECTED = {
    "Qwen3-Coder.jinja": "qwen3-coder", "Qwen3.5-4B.jinja": "qwen3-coder", "NVIDIA-Nemotron-3-Nano-30B-A3B-BF16.jinja": "qwen3-coder",
    "StepFun3.5-Flash.jinja": "qwen3-coder", "openai-gpt-oss-120b.jinja": "gpt-oss",
    "meta-llama-Llama-3.1-8B-Instruct.jinja": "llama3", "meta-llama-Llama-3.2-3B-Instruct.jinja": "llama3",
    "meta-llama-Llama-3.3-70B-Instruct.jinja": "llama3",
    "mistralai-Ministral-3-14B-Reasoning-2512.jinja": "ministral", "Mistral-Small-3.2-24B-Instruct-2506.jinja": "ministral",
    "unsloth-mistral-Devstral-Small-2507.jinja": "ministral", "mistralai-Mistral-Nemo-Instruct-2407.jinja": "mistral",
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja": "deepseek", "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B.jinja": "deepseek",
    "llama-cpp-deepseek-r1.jinja": "deepseek", "deepseek-ai-DeepSeek-V3.1.jinja": "deepseek",
    "Qwen-Qwen2.5-7B-Instruct.jinja": "hermes", "Qwen-Qwen3-0.6B.jinja": "hermes", "Qwen-QwQ-32B.jinja": "hermes",
    "NousResearch-Hermes-2-Pro-Llama-3-8B-tool_use.jinja": "hermes", "NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja": "hermes",
    "ibm-granite-granite-4.0.jinja": "hermes", "ibm-granite-granite-4.1.jinja": "hermes", "Reka-Edge.jinja": "hermes",
    "MiMo-VL.jinja": "hermes",
    "GLM-4.6.jinja": "glm-4.5", "GLM-4.7-Flash.jinja": "glm-4.5", "Spark2.5.jinja": "glm-4.5",
    "ibm-granite-granite-3.3-2B-Instruct.jinja": "granite",
    "CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja": "command-r7b",
    "meetkai-functionary-medium-v3.1.jinja": "functionary-v3.1", "meetkai-functionary-medium-v3.2.jinja": "functionary-v3.2",
    "fireworks-ai-llama-3-firefunction-v2.jinja": "firefunction-v2",
    "Kimi-K2-Instruct.jinja": "kimi-k2", "Kimi-K2-Thinking.jinja": "kimi-k2", "moonshotai-Kimi-K2.jinja": "kimi-k2",
    "MiniMax-M2.jinja": "minimax",
    "LFM2-8B-A1B.jinja": "lfm2", "LFM2.5-8B-A1B.jinja": "lfm2", "LFM2.5-Instruct.jinja": "lfm2",
    "Apertus-8B-Instruct.jinja": "apertus", "ByteDance-Seed-OSS.jinja": "seed-oss",
    "NVIDIA-Nemotron-Nano-v2.jinja": "nemotron-v2", "unsloth-Apriel-1.5.jinja": "apriel",
    # llama.cpp parses these with parsers not written here: the generic format, as for an unknown template
    "deepseek-ai-DeepSeek-V3.2.jinja": "deepseek-dsml", "deepseek-ai-DeepSeek-V4.jinja": "deepseek-dsml",
    "google-gemma-4-31B-it.jinja": "gemma4",
    "MiniMax-M3.jinja": "minimax-m3", "inclusionai-ling-3.0-flash.jinja": "glm-4.5", "Apriel-1.6-15b-Thinker-fixed.jinja": "apriel",
    "GigaChat3-10B-A1.8B.jinja": "gigachat3", "GigaChat3.1-10B-A1.8B.jinja": "gigachat3.1",
    "CohereForAI-c4ai-command-r-plus-tool_use.jinja": "command-r-plus", "openbmb-MiniCPM5-1B.jinja": "minicpm5",
    "Cohere2MoE.jinja": "generic", "Kimi-K3.jinja": "generic", "tencent-Hy3.jinja": "generic", "upstage-Solar-Open-100B.jinja": "generic",
    "muse-glimmer.jinja": "generic",
    "google-gemma-2-2b-it.jinja": "generic",  # no tool calling at all
}


@pytest.mark.parametrize("name, family", sorted(DETECTED.items()))
def test_each_template_is_detected_from_its_markers(name: str, family: str) -> None:
    assert detect(template(name)).name == family


def test_unknown_templates_fall_back_to_generic() -> None:
    assert detect(None) is toolcalls.GENERIC and detect("") is toolcalls.GENERIC
    chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}"
    assert detect(chatml) is toolcalls.GENERIC
    # one marker alone is not a family: <tool_call> without Hermes's closing tag, [ARGS] without [TOOL_CALLS]
    assert detect(chatml + "{# <tool_call> #}") is toolcalls.GENERIC
    assert detect(chatml + "[ARGS]") is toolcalls.GENERIC


SF = Call("special_function", {"arg1": 1})
SF_OPT = Call("special_function_with_opt", {"arg1": 1, "arg2": 2})
THINK = Markers("<think>", "</think>")

# (template, model output as test-chat.cpp writes it, (reasoning markers, prompt opened them), reasoning, content, calls)
CASES = [
    ("Qwen3-Coder.jinja", "<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
     None, None, "", [SF]),
    ("Qwen3-Coder.jinja", "<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>", None, None, "", [SF]),
    ("Qwen3-Coder.jinja", "Let me call it.\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>",
     None, None, "Let me call it.\n", [SF]),
    ("Qwen3-Coder.jinja", "<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n</function>\n</tool_call>\n<tool_call>\n"
     "<function=special_function_with_opt>\n<parameter=arg1>\n1\n</parameter>\n<parameter=arg2>\n2\n</parameter>\n</function>\n</tool_call>",
     None, None, "", [SF, SF_OPT]),
    ("Qwen3.5-4B.jinja", "I'm\nthinking\n</think>\n\n<tool_call>\n<function=special_function>\n<parameter=arg1>\n1\n</parameter>\n"
     "</function>\n</tool_call>", (THINK, True), "I'm\nthinking", "", [SF]),
    ("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant<|channel|>final<|message|>"
     "Hello, world!\nWhat's up?", None, "I'm\nthinking", "Hello, world!\nWhat's up?", []),
    ("openai-gpt-oss-120b.jinja", " to=functions.special_function<|channel|>analysis<|message|>{\"arg1\": 1}", None, None, "", [SF]),
    ("openai-gpt-oss-120b.jinja", "<|channel|>analysis to=functions.special_function<|message|>{\"arg1\": 1}", None, None, "", [SF]),
    ("openai-gpt-oss-120b.jinja", " to=functions.special_function<|channel|>analysis <|constrain|>json<|message|>{\"arg1\": 1}",
     None, None, "", [SF]),
    ("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>I'm\nthinking<|end|><|start|>assistant to=functions.special_function"
     "<|channel|>analysis<|message|>{\"arg1\": 1}", None, "I'm\nthinking", "", [SF]),
    ("openai-gpt-oss-120b.jinja", "<|channel|>analysis<|message|>Thinking about edit...<|end|><|start|>assistant<|channel|>commentary "
     "to=functions.edit <|constrain|>json<|message|>{\"oldString\": \"if (part < railCount - 1) {\", \"newString\": \"if (part < 4) {\", "
     "\"replaceAll\": false}", None, "Thinking about edit...", "",
     [Call("edit", {"oldString": "if (part < railCount - 1) {", "newString": "if (part < 4) {", "replaceAll": False})]),
    ("meta-llama-Llama-3.3-70B-Instruct.jinja", '{"name": "special_function", "parameters": {"arg1": 1}}', None, None, "", [SF]),
    ("meta-llama-Llama-3.1-8B-Instruct.jinja", '<|python_tag|>{"name": "special_function", "parameters": {"arg1": 1}}',
     None, None, "", [SF]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1":1}', None, None, "", [SF]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[THINK]I\'m\nthinking[/THINK][TOOL_CALLS]special_function[ARGS]{"arg1":1}',
     (Markers("[THINK]", "[/THINK]"), False), "I'm\nthinking", "", [SF]),
    ("mistralai-Ministral-3-14B-Reasoning-2512.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[ARGS]{"arg1": 1, "arg2": 2}', None, None, "", [SF, SF_OPT]),
    ("Mistral-Small-3.2-24B-Instruct-2506.jinja", '[TOOL_CALLS]special_function[CALL_ID]000000001[ARGS]{"arg1": 1}'
     '[TOOL_CALLS]special_function_with_opt[CALL_ID]000000002[ARGS]{"arg1": 1, "arg2": 2}', None, None, "",
     [Call("special_function", {"arg1": 1}, "000000001"), Call("special_function_with_opt", {"arg1": 1, "arg2": 2}, "000000002")]),
    ("unsloth-mistral-Devstral-Small-2507.jinja", '[TOOL_CALLS]special_function[ARGS]{"arg1": 1}', None, None, "", [SF]),
    ("mistralai-Mistral-Nemo-Instruct-2407.jinja", '[TOOL_CALLS][{"name": "special_function", "arguments": {"arg1": 1}, "id": "123456789"}]',
     None, None, "", [Call("special_function", {"arg1": 1}, "123456789")]),
    ("deepseek-ai-DeepSeek-R1-Distill-Llama-8B.jinja", "I'm\nthinking</think>Hello, world!\nWhat's up?", (THINK, True),
     "I'm\nthinking", "Hello, world!\nWhat's up?", []),
    ("llama-cpp-deepseek-r1.jinja", "</think><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>special_function\n"
     "```json\n{\"arg1\": 1}```<｜tool▁call▁end｜><｜tool▁calls▁end｜>", (THINK, True), None, "", [SF]),
    ("deepseek-ai-DeepSeek-V3.1.jinja", "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>get_time<｜tool▁sep｜>{\"city\": "
     "\"XYZCITY\"}<｜tool▁call▁end｜><｜tool▁calls▁end｜>", None, None, "", [Call("get_time", {"city": "XYZCITY"})]),
    ("Qwen-Qwen2.5-7B-Instruct.jinja", "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
     None, None, "", [SF]),
    ("Qwen-Qwen3-0.6B.jinja", "<think>I'm\nthinking</think>\n<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}"
     "\n</tool_call>\n<tool_call>\n{\"name\": \"special_function_with_opt\", \"arguments\": {\"arg1\": 1, \"arg2\": 2}}\n</tool_call>",
     (THINK, False), "I'm\nthinking", "", [SF, SF_OPT]),
    ("NousResearch-Hermes-3-Llama-3.1-8B-tool_use.jinja", "Hello, world!\nWhat's up?<tool_call>\n{\"name\": \"special_function\", "
     "\"arguments\": {\"arg1\": 1}}\n</tool_call>", None, None, "Hello, world!\nWhat's up?", [SF]),
    ("ibm-granite-granite-4.0.jinja", "<tool_call>\n{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}\n</tool_call>",
     None, None, "", [SF]),
    ("Reka-Edge.jinja", "<tool_call>\n{\"name\": \"get_time\", \"arguments\": {\"city\": \"XYZCITY\"}}</tool_call>", None, None, "",
     [Call("get_time", {"city": "XYZCITY"})]),
    ("GLM-4.6.jinja", "<tool_call>special_function\n<arg_key>arg1</arg_key>\n<arg_value>1</arg_value>\n</tool_call>", None, None, "", [SF]),
    ("GLM-4.7-Flash.jinja", "<tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>", None, None, "", [SF]),
    ("GLM-4.7-Flash.jinja", "I'm\nthinking</think><tool_call>special_function<arg_key>arg1</arg_key><arg_value>1</arg_value></tool_call>",
     (THINK, True), "I'm\nthinking", "", [SF]),
    ("ibm-granite-granite-3.3-2B-Instruct.jinja", "<think>I'm\nthinking</think><|tool_call|>[{\"name\": \"special_function\", "
     "\"arguments\": {\"arg1\": 1}}]", (THINK, False), "I'm\nthinking", "", [SF]),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_ACTION|>[\n"
     "    {\"tool_call_id\": \"0\", \"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}\n]<|END_ACTION|>",
     (Markers("<|START_THINKING|>", "<|END_THINKING|>"), False), "I'm\nthinking", "", [Call("special_function", {"arg1": 1}, "0")]),
    ("CohereForAI-c4ai-command-r7b-12-2024-tool_use.jinja", "<|START_THINKING|>I'm\nthinking<|END_THINKING|><|START_RESPONSE|>"
     "Hello, world!\nWhat's up?<|END_RESPONSE|>", (Markers("<|START_THINKING|>", "<|END_THINKING|>"), False), "I'm\nthinking",
     "Hello, world!\nWhat's up?", []),
    ("meetkai-functionary-medium-v3.1.jinja", "<function=special_function>{\"arg1\": 1}</function>", None, None, "", [SF]),
    ("meetkai-functionary-medium-v3.2.jinja", "special_function\n{\"arg1\": 1}", None, None, "", [SF]),
    ("meetkai-functionary-medium-v3.2.jinja", "all\nHello, world!\nWhat's up?>>>special_function\n{\"arg1\": 1}", None, None,
     "Hello, world!\nWhat's up?", [SF]),
    ("fireworks-ai-llama-3-firefunction-v2.jinja", " functools[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]",
     None, None, "", [SF]),
    ("Kimi-K2-Instruct.jinja", "<|tool_calls_section_begin|><|tool_call_begin|>functions.special_function:0<|tool_call_argument_begin|>"
     "{\"arg1\": 1}<|tool_call_end|><|tool_calls_section_end|>", None, None, "",
     [Call("special_function", {"arg1": 1}, "functions.special_function:0")]),
    ("MiniMax-M2.jinja", "\n</think>\n\n<minimax:tool_call>\n<invoke name=\"special_function\">\n<parameter name=\"arg1\">1</parameter>"
     "\n</invoke>\n</minimax:tool_call>", (THINK, True), None, "", [SF]),
    ("MiniMax-M2.jinja", "Let's call a tool:\n</think>\n\n<minimax:tool_call>\n<invoke name=\"empty_args\">\n</invoke>\n</minimax:tool_call>",
     (THINK, True), "Let's call a tool:", "", [Call("empty_args", {})]),
    ("LFM2.5-8B-A1B.jinja", "<think>I'm\nthinking</think><|tool_call_start|>[special_function(arg1=1)]<|tool_call_end|>",
     (THINK, False), "I'm\nthinking", "", [SF]),
    ("LFM2.5-8B-A1B.jinja", "<think>I need to call a function</think>Let me check the time.<|tool_call_start|>[get_time(city=\"Paris\")]"
     "<|tool_call_end|>", (THINK, False), "I need to call a function", "Let me check the time.", [Call("get_time", {"city": "Paris"})]),
    ("Apertus-8B-Instruct.jinja", "<|tools_prefix|>[{\"special_function\": {\"arg1\": 1}}]<|tools_suffix|>", None, None, "", [SF]),
    ("ByteDance-Seed-OSS.jinja", "<seed:tool_call>\n<function=special_function>\n<parameter=arg1>1</parameter>\n</function>\n"
     "</seed:tool_call>", None, None, "", [SF]),
    ("ByteDance-Seed-OSS.jinja", "<seed:think>I'm thinking about the answer</seed:think>\nHello, world!",
     (Markers("<seed:think>", "</seed:think>"), False), "I'm thinking about the answer", "Hello, world!", []),
    ("NVIDIA-Nemotron-Nano-v2.jinja", "I'm\nthinking\n</think>\n<TOOLCALL>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]"
     "</TOOLCALL>\n", (THINK, True), "I'm\nthinking", "", [SF]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "Let me check the time</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Tokyo</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     (THINK, True), "Let me check the time", "", [Call("get_time", {"city": "Tokyo"})]),
    ("deepseek-ai-DeepSeek-V3.2.jinja", "Calling both</think>\n\n<｜DSML｜function_calls>\n<｜DSML｜invoke name=\"get_time\">\n"
     "<｜DSML｜parameter name=\"city\" string=\"true\">Paris</｜DSML｜parameter>\n</｜DSML｜invoke>\n<｜DSML｜invoke name=\"special_function\">\n"
     "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜function_calls>",
     (THINK, True), "Calling both", "", [Call("get_time", {"city": "Paris"}), SF]),
    ("deepseek-ai-DeepSeek-V4.jinja", "<｜DSML｜tool_calls>\n<｜DSML｜invoke name=\"special_function\">\n"
     "<｜DSML｜parameter name=\"arg1\" string=\"false\">1</｜DSML｜parameter>\n</｜DSML｜invoke>\n</｜DSML｜tool_calls>", None, None, "", [SF]),
    ("google-gemma-4-31B-it.jinja", "Hello, world!\nWhat's up?<|tool_call>call:get_time{city:<|\"|>Paris<|\"|>}<tool_call|>", None, None,
     "Hello, world!\nWhat's up?", [Call("get_time", {"city": "Paris"})]),
    ("google-gemma-4-31B-it.jinja", "<|tool_call>call:get_time{city:<|\"|>London<|\"|>}<tool_call|><|tool_call>call:empty_args{}<tool_call|>",
     None, None, "", [Call("get_time", {"city": "London"}), Call("empty_args", {})]),
    ("google-gemma-4-31B-it.jinja", "<|tool_call>call:set_config{config:{theme:<|\"|>dark<|\"|>,count:3},todos:[<|\"|>buy milk<|\"|>,"
     "<|\"|>walk: dog<|\"|>],orig:1.5e10,enabled:false,value:null,n:-7}<tool_call|>", None, None, "",
     [Call("set_config", {"config": {"theme": "dark", "count": 3}, "todos": ["buy milk", "walk: dog"], "orig": 1.5e10, "enabled": False,
                          "value": None, "n": -7})]),
    ("MiniMax-M3.jinja", "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"get_time\">]<]minimax[>[<city>Tokyo]<]minimax[>[</city>"
     "]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>", None, None, "", [Call("get_time", {"city": "Tokyo"})]),
    ("MiniMax-M3.jinja", "]<]minimax[>[<tool_call>\n]<]minimax[>[<invoke name=\"special_function\">]<]minimax[>[<arg1>1]<]minimax[>[</arg1>"
     "]<]minimax[>[</invoke>\n]<]minimax[>[<invoke name=\"empty_args\">]<]minimax[>[</invoke>\n]<]minimax[>[</tool_call>", None, None, "",
     [SF, Call("empty_args", {})]),
    ("GigaChat3-10B-A1.8B.jinja", "Hello, world!\nWhat's up?<|message_sep|>\n\nfunction call<|role_sep|>\n{\"name\": \"special_function\", "
     "\"arguments\": {\"arg1\": 1}}", None, None, "Hello, world!\nWhat's up?", [SF]),
    ("GigaChat3.1-10B-A1.8B.jinja", "Hello, world!\nWhat's up?<|function_call|>{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}",
     None, None, "Hello, world!\nWhat's up?", [SF]),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "Action:\n```json\n[{\"tool_name\": \"special_function\", \"parameters\": {\"arg1\": 1}}]\n```",
     None, None, "", [SF]),
    ("CohereForAI-c4ai-command-r-plus-tool_use.jinja", "<|CHATBOT_TOKEN|>Hello, world!\nWhat's up?<|END_OF_TURN_TOKEN|>", None, None,
     "Hello, world!\nWhat's up?", []),
    ("openbmb-MiniCPM5-1B.jinja", "<function name=\"python\"><param name=\"code\">print('Hello, World!')</param></function>", None, None, "",
     [Call("python", {"code": "print('Hello, World!')"})]),
    ("openbmb-MiniCPM5-1B.jinja", "<function name=\"empty_args\"></function>", None, None, "", [Call("empty_args", {})]),
    ("inclusionai-ling-3.0-flash.jinja", "<tool_call>get_time\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n</tool_call>"
     "\nThe time has been checked.", None, None, "\nThe time has been checked.", [Call("get_time", {"city": "Paris"})]),
    ("unsloth-Apriel-1.5.jinja", "<tool_calls>[{\"name\": \"special_function\", \"arguments\": {\"arg1\": 1}}]</tool_calls>",
     None, None, "", [SF]),
]


def _streamed(fmt: Format, text: str, think: tuple[Markers, bool] | None) -> toolcalls.Parsed:
    s = Stream(fmt, think[0] if think else None, started_open=think[1] if think else False)
    parts = [p for ch in text for p in s.feed(ch)] + s.finish()
    return collect(parts, s)


@pytest.mark.parametrize("name, text, think, reasoning, content, calls", CASES,
                         ids=[f"{c[0].removesuffix('.jinja')}-{i}" for i, c in enumerate(CASES)])
def test_test_chat_outputs_parse_whole_and_streamed(name: str, text: str, think: tuple[Markers, bool] | None,
                                                   reasoning: str | None, content: str, calls: list[Call]) -> None:
    fmt = detect(template(name))
    if think is not None:  # the markers are the ones the template writes
        assert markers(template(name))[0] == think[0]
    whole = parse(text, fmt, think[0] if think else None, started_open=think[1] if think else False)
    # llama.cpp trims the reasoning; the shared split (localllm.reasoning) keeps it as the model wrote it
    assert ((whole.reasoning or "").strip() or None, whole.content, whole.calls, whole.broken) == (reasoning, content, calls, False)
    assert _streamed(fmt, text, think) == whole


HARMONY_CASES = [c for c in CASES if c[0] == "openai-gpt-oss-120b.jinja"]


@pytest.mark.parametrize("name, text, think, reasoning, content, calls", HARMONY_CASES)
def test_gpt_oss_replies_parse_the_same_behind_the_harmony_split(name: str, text: str, think: None, reasoning: str | None,
                                                                 content: str, calls: list[Call]) -> None:
    """Serve splits the thinking first (the analysis channel: localllm.reasoning's
    HARMONY), then parses the rest for calls: the same reasoning, content and calls."""
    from localllm.reasoning import HARMONY

    fmt = detect(template(name))
    assert markers(template(name))[0] == HARMONY
    whole = parse(text, fmt, HARMONY)
    assert (whole.reasoning, whole.content, whole.calls, whole.broken) == (reasoning, content, calls, False)
    assert _streamed(fmt, text, (HARMONY, False)) == whole


TOOL = {"type": "function", "function": {"name": "special_function", "description": "I'm special",
                                         "parameters": {"type": "object", "properties": {"arg1": {"type": "integer"}}, "required": ["arg1"]}}}
USER = {"role": "user", "content": "Hey there!"}
ASKED: dict[str, Any] = {"role": "assistant", "content": "", "tool_calls": [{"id": "123456789", "type": "function",
                                                             "function": {"name": "special_function", "arguments": {"arg1": 1}}}]}
ANSWER = {"role": "tool", "tool_call_id": "123456789", "name": "special_function", "content": "sunny, 21 C"}


def _render(name: str, messages: list[dict], prompt: bool) -> str:
    return ChatTemplate(template(name), name).render(messages, bos_token="<s>", eos_token="</s>", add_generation_prompt=prompt,
                                                     tools=[TOOL])


NATIVE = sorted(n for n, f in DETECTED.items() if f != "generic")
# templates that write no call in an assistant turn of the history (the call is only ever the model's own output)
NO_CALL_HISTORY = {"LFM2-8B-A1B.jinja", "LFM2.5-Instruct.jinja", "ibm-granite-granite-3.3-2B-Instruct.jinja"}
# every one renders here (engine/chat_template.py runs what llama.cpp's Jinja runs for them: Kimi K2's list.append,
# DeepSeek R1's tojson of a map, Command R+'s and FireFunction's text + none)


def _call_turn(name: str) -> str:
    """The assistant's turn holding the call, as llama.cpp's template probing
    renders it: arguments an object or (templates that concatenate them) a
    JSON string, content empty or null, whichever the template takes."""
    prompt = _render(name, [USER], True)
    refused: TemplateError | None = None
    rendered = False
    for content in ("", None):
        for args in ({"arg1": 1}, '{"arg1": 1}'):
            asked = {**ASKED, "content": content,
                     "tool_calls": [{**ASKED["tool_calls"][0], "function": {"name": "special_function", "arguments": args}}]}
            try:
                turn = _render(name, [USER, asked], False)
            except TemplateError as exc:  # this variant is not the template's
                refused = exc
                continue
            added = turn[len(prompt):] if turn.startswith(prompt) else _inserted(_render(name, [USER], False), turn)
            if "special_function" in added:
                return added
            rendered = True
    if refused is not None and not rendered:
        raise refused  # no variant rendered at all
    return ""


def _inserted(before: str, after: str) -> str:
    """What rendering one more message put into the text, as llama.cpp's diff analyzer
    finds it: ``after`` less the prefix and suffix it shares with ``before`` (Command R+
    writes its instructions after the last turn, so the call is in the middle)."""
    head = 0
    while head < min(len(before), len(after)) and before[head] == after[head]:
        head += 1
    tail = 0
    while tail < min(len(before), len(after)) - head and before[-1 - tail] == after[-1 - tail]:
        tail += 1
    return after[head:len(after) - tail]


@pytest.mark.parametrize("name", NATIVE)
def test_a_call_and_its_result_render_through_the_template_and_parse_back(name: str) -> None:
    """As llama.cpp's autoparser reads a template: the assistant's turn is what
    rendering the call adds to the conversation before it; it parses back to the call."""
    fmt = detect(template(name))
    tail = _call_turn(name)
    if name in NO_CALL_HISTORY:
        assert tail == ""
        return
    marks, _ = markers(template(name))
    got = parse(tail, fmt, marks)
    assert [(c.name, c.arguments) for c in got.calls] == [("special_function", {"arg1": 1})], tail
