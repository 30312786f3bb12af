"""The families whose calls are JSON objects behind a marker: Hermes (Qwen
2.5/3, QwQ, Hermes 2/3, Granite 4), Llama 3.x, Mistral Nemo, Nemotron Nano
v2, Granite 3.x, Apriel, GigaChat 3 and 3.1, Command R+, Command R7B, Apertus, FireFunction v2, and the generic one.

The shapes are the ones ``tests/test-chat.cpp`` feeds llama.cpp's parsers
(``common/chat.cpp``, and the autoparser of ``common/chat-auto-parser*.cpp``
for the templates it has no specialized parser for).
"""

from __future__ import annotations

from localllm.toolcalls.base import (
    Block,
    Call,
    Format,
    Invalid,
    Segment,
    call_list,
    call_object,
    expect,
    read_json,
)

_JSON_START = r'^[ \t\n]{0,16}(\{[ \t\n]{0,8}"name"[ \t\n]{0,8}:[ \t\n]{0,8}"?)$'


def _wrapped(start: str, end: str, many: bool) -> Block:
    """A block ``start`` JSON ``end`` (``end`` "": none), the JSON a call
    object or (``many``) a list of them; a bare JSON value where the marker is
    a control token the text lacks."""

    def block(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
        marked = bool(start) and text.startswith(start, at)
        i = at + len(start) if marked else at
        closed = final or (marked and bool(end) and text.find(end, i) >= 0)  # the end is there: the JSON is whole or never will be
        obj, j = read_json(text, i, closed)
        got: list[Segment] = call_list(obj) if many else [call_object(obj)]
        return got, (expect(text, j, end, final) if end and marked else j)

    return block


def _apertus(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """``<|tools_prefix|>[{"name": {arguments}}, ...]<|tools_suffix|>``."""
    i = at + len("<|tools_prefix|>")
    obj, j = read_json(text, i, final or text.find("<|tools_suffix|>", i) >= 0)
    if not isinstance(obj, list) or not obj:
        raise Invalid
    calls: list[Segment] = []
    for it in obj:
        if not isinstance(it, dict) or len(it) != 1:
            raise Invalid
        ((name, args),) = it.items()
        if not isinstance(args, dict) or not name:
            raise Invalid
        calls.append(Call(name, args))
    return calls, expect(text, j, "<|tools_suffix|>", final)


def _dropped(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """A marker that wraps the answer and is no part of it (Command R7B's ``<|START_RESPONSE|>``)."""
    for m in ("<|START_RESPONSE|>", "<|END_RESPONSE|>"):
        if text.startswith(m, at):
            return [], at + len(m)
    raise Invalid


def _command_r7b(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    if text.startswith("<|START_ACTION|>", at):
        return _ACTION(text, at, final)
    return _dropped(text, at, final)


def _gigachat(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """``<|message_sep|>\n\nfunction call<|role_sep|>\n{"name", "arguments"}``."""
    i = expect(text, at + len("<|message_sep|>"), "function call<|role_sep|>", final)
    obj, j = read_json(text, i, final)
    return [call_object(obj)], j


def _command_r_plus(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """``Action:\n```json\n[{"tool_name", "parameters"}]\n```"``; its turn tokens are no part of the answer."""
    for m in ("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"):
        if text.startswith(m, at):
            return [], at + len(m)
    i = expect(text, at + len("Action:"), "```json", final)
    obj, j = read_json(text, i, final or text.find("```", i) >= 0)
    return call_list(obj), expect(text, j, "```", final)


_ACTION = _wrapped("<|START_ACTION|>", "<|END_ACTION|>", True)
_block = _wrapped
_HERMES_BLOCK = 'tool-block ::= "<tool_call>" [ \\n]{0,2} tool-call [ \\n]{0,2} "</tool_call>"\n'

HERMES = Format("hermes", root_one="root ::= tool-block\n" + _HERMES_BLOCK,
                root_many='root ::= tool-block ("\\n" tool-block)*\n' + _HERMES_BLOCK,
                trigger=r'(<tool_call>[ \n]{0,2}(?:\{[ \t\n]{0,8}"?)?)$',
                markers=("<tool_call>",), bare="{", block=_block("<tool_call>", "</tool_call>", False), preserved=("<tool_call>", "</tool_call>"))
LLAMA3 = Format("llama3", args_key="parameters", trigger=r"^(?:<\|python_tag\|>)?" + _JSON_START[1:], parallel=False,
                markers=("<|python_tag|>",), bare="{", block=_block("<|python_tag|>", "", False), preserved=("<|python_tag|>",))
MISTRAL = Format("mistral", root_one='root ::= "[TOOL_CALLS]" "[" tool-call "]"\n',
                 root_many='root ::= "[TOOL_CALLS]" "[" tool-call ("," " "? tool-call)* "]"\n',
                 trigger=r'(\[TOOL_CALLS\](?:\[(?:\{[ \t\n]{0,8}"?)?)?)$', id_len=9,
                 markers=("[TOOL_CALLS]",), bare="[", block=_block("[TOOL_CALLS]", "", True), preserved=("[TOOL_CALLS]",))
GENERIC = Format("generic", trigger=_JSON_START, parallel=False, bare="{", block=_block("", "", False))
NEMOTRON_V2 = Format("nemotron-v2", root_one='root ::= "<TOOLCALL>[" tool-call "]</TOOLCALL>"\n',
                     root_many='root ::= "<TOOLCALL>[" tool-call ("," " "? tool-call)* "]</TOOLCALL>"\n',
                     trigger=r"(<TOOLCALL>(?:\[(?:\{[ \t\n]{0,8}\"?)?)?)$",
                     markers=("<TOOLCALL>",), block=_block("<TOOLCALL>", "</TOOLCALL>", True), preserved=("<TOOLCALL>", "</TOOLCALL>"))
GRANITE = Format("granite", root_one='root ::= "<|tool_call|>[" tool-call "]"\n',
                 root_many='root ::= "<|tool_call|>[" tool-call ("," " "? tool-call)* "]"\n',
                 trigger=r"(<\|tool_call\|>(?:\[(?:\{[ \t\n]{0,8}\"?)?)?)$",
                 markers=("<|tool_call|>",), block=_block("<|tool_call|>", "", True), preserved=("<|tool_call|>",))
COMMAND_R7B = Format("command-r7b", args_key="parameters", root_one='root ::= "<|START_ACTION|>[" tool-call "]<|END_ACTION|>"\n',
                     root_many='root ::= "<|START_ACTION|>[" tool-call ("," " "? tool-call)* "]<|END_ACTION|>"\n',
                     trigger=r"(<\|START_ACTION\|>(?:\[(?:[ \t\n]{0,8}\{[ \t\n]{0,8}\"?)?)?)$",
                     markers=("<|START_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"), block=_command_r7b,
                     preserved=("<|START_ACTION|>", "<|END_ACTION|>", "<|START_RESPONSE|>", "<|END_RESPONSE|>"))
APERTUS = Format("apertus", root_one='root ::= "<|tools_prefix|>[" tool-call "]<|tools_suffix|>"\n',
                 root_many='root ::= "<|tools_prefix|>[" tool-call ("," " "? tool-call)* "]<|tools_suffix|>"\n',
                 trigger=r"(<\|tools_prefix\|>(?:\[(?:\{[ \t\n]{0,8}\"?)?)?)$", call_gbnf='"{\\"@NAME@\\": " @ARGS@ "}"',
                 markers=("<|tools_prefix|>",), block=_apertus, preserved=("<|tools_prefix|>", "<|tools_suffix|>"))
APRIEL = Format("apriel", root_one='root ::= "<tool_calls>[" tool-call "]</tool_calls>"\n',
                root_many='root ::= "<tool_calls>[" tool-call ("," " "? tool-call)* "]</tool_calls>"\n',
                trigger=r"(<tool_calls>(?:\[(?:\{[ \t\n]{0,8}\"?)?)?)$",
                markers=("<tool_calls>",), block=_block("<tool_calls>", "</tool_calls>", True), preserved=("<tool_calls>", "</tool_calls>"))
GIGACHAT3 = Format("gigachat3", root_one='root ::= "<|message_sep|>\\n\\nfunction call<|role_sep|>\\n" tool-call\n',
                   root_many='root ::= "<|message_sep|>\\n\\nfunction call<|role_sep|>\\n" tool-call\n', parallel=False,
                   trigger=r"(<\|message_sep\|>\s*function call<\|role_sep\|>)$", markers=("<|message_sep|>",), block=_gigachat,
                   preserved=("<|message_sep|>\n\n", "<|role_sep|>\n", "<|message_sep|>", "<|role_sep|>"))
GIGACHAT31 = Format("gigachat3.1", root_one='root ::= "<|function_call|>" tool-call\n', root_many='root ::= "<|function_call|>" tool-call\n',
                    parallel=False, trigger=r"(<\|function_call\|>)$", markers=("<|function_call|>",),
                    block=_block("<|function_call|>", "", False), preserved=("<|function_call|>",))
COMMAND_R_PLUS = Format("command-r-plus", args_key="parameters", root_one='root ::= "Action:\\n```json\\n[" tool-call "]\\n```"\n',
                        root_many='root ::= "Action:\\n```json\\n[" tool-call ("," " "? tool-call)* "]\\n```"\n',
                        trigger=r"(Action:\n```json\n)$", markers=("Action:", "<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"),
                        block=_command_r_plus, preserved=("<|CHATBOT_TOKEN|>", "<|END_OF_TURN_TOKEN|>"))
FIREFUNCTION = Format("firefunction-v2", root_one='root ::= " functools[" tool-call "]"\n',
                      root_many='root ::= " functools[" tool-call ("," " "? tool-call)* "]"\n',
                      trigger=r"( functools(?:\[(?:\{[ \t\n]{0,8}\"?)?)?)$",
                      markers=(" functools",), block=_block(" functools", "", True), preserved=(" functools[",))
