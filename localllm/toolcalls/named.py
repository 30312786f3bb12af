"""The families that write a call's name in markup and only its arguments as
JSON: Functionary v3.1 (``<function=NAME>{...}</function>``), Mistral Small
3.2 / Devstral / Ministral 3 (``[TOOL_CALLS]NAME[CALL_ID]ID[ARGS]{...}``),
Kimi K2 (``<|tool_call_begin|>functions.NAME:0<|tool_call_argument_begin|>{...}``)
and DeepSeek R1 / V3.1 (``<｜tool▁call▁begin｜>NAME<｜tool▁sep｜>{...}``).

Read from llama.cpp's ``common/chat.cpp`` (``common_chat_params_init_kimi_k2``,
``..._ministral_3``) and the outputs ``tests/test-chat.cpp`` parses.
"""

from __future__ import annotations

import re

from localllm.toolcalls.base import Call, Format, Incomplete, Invalid, Segment, expect, read_json, until

_NAME = re.compile(r"^[A-Za-z0-9_.\-:]{1,128}$")


def _name(name: str) -> str:
    name = name.strip()
    if not _NAME.match(name):
        raise Invalid
    return name


def _args(text: str, at: int, final: bool, end: str = "") -> tuple[dict, int]:
    obj, j = read_json(text, at, final or (bool(end) and text.find(end, at) >= 0))
    if not isinstance(obj, dict):
        raise Invalid
    return obj, j


def _next(text: str, i: int, final: bool, *lits: str) -> tuple[str, int]:
    """Which of ``lits`` comes next, and where it ends."""
    cut = False
    for lit in lits:
        try:
            return lit, expect(text, i, lit, final)
        except Incomplete:
            cut = True
        except Invalid:
            pass
    if cut:
        raise Incomplete
    raise Invalid


def _functionary_v3_1(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    name, i = until(text, at + len("<function="), ">", final)
    args, j = _args(text, i, final, "</function>")
    return [Call(_name(name), args)], expect(text, j, "</function>", final, ws=False)


def _ministral(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = at + len("[TOOL_CALLS]")
    head, j = until(text, i, "[ARGS]", final)
    cid = None
    if "[CALL_ID]" in head:
        head, cid = head.split("[CALL_ID]", 1)
    args, k = _args(text, j, final)
    return [Call(_name(head), args, cid or None)], k


def _kimi(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    section = text.startswith("<|tool_calls_section_begin|>", at)
    i = at + len("<|tool_calls_section_begin|>") if section else at
    calls: list[Segment] = []
    while True:
        if section:
            lit, i = _next(text, i, final, "<|tool_calls_section_end|>", "<|tool_call_begin|>")
            if lit == "<|tool_calls_section_end|>":
                return calls, i
        elif calls:
            return calls, i
        else:
            i = expect(text, i, "<|tool_call_begin|>", final)
        cid, j = until(text, i, "<|tool_call_argument_begin|>", final)
        cid = cid.strip()
        m = re.match(r"^(?:functions\.)?([A-Za-z0-9_.\-]+?)(?::\d+)?$", cid)
        if not m:
            raise Invalid
        args, k = _args(text, j, final, "<|tool_call_end|>")
        i = expect(text, k, "<|tool_call_end|>", final)
        calls.append(Call(m.group(1), args, cid))


_DS = ("<｜tool▁calls▁begin｜>", "<｜tool▁call▁begin｜>", "<｜tool▁sep｜>", "<｜tool▁call▁end｜>", "<｜tool▁calls▁end｜>")


def _deepseek(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """V3.1: ``NAME<｜tool▁sep｜>{...}``; R1: ``function<｜tool▁sep｜>NAME\\n```json\\n{...}\\n```"``."""
    begin, call_begin, sep, call_end, end = _DS
    i = expect(text, at, begin, final)
    calls: list[Segment] = []
    while True:
        try:
            lit, i = _next(text, i, final, end, call_begin)
        except Invalid:
            if final and calls:  # calls whole but the closing marker missing (R1 Distill's own template writes them so)
                return calls, i
            raise
        if lit == end:
            return calls, i
        name, j = until(text, i, sep, final)
        if name.strip() == "function":  # R1
            name, j = until(text, j, "\n", final)
            j = expect(text, j, "```json", final)
            args, j = _args(text, j, final, call_end)
            j = expect(text, j, "```", final)
        else:
            args, j = _args(text, j, final, call_end)
        i = expect(text, j, call_end, final)
        calls.append(Call(_name(name), args))


FUNCTIONARY_V3_1 = Format("functionary-v3.1", trigger=r"(<function=)$", call_gbnf='"<function=@NAME@>" @ARGS@ "</function>"',
                          root_many='root ::= tool-call ("\\n"? tool-call)*\n', markers=("<function=",), block=_functionary_v3_1,
                          preserved=("<function=", "</function>"))
MINISTRAL = Format("ministral", trigger=r"(\[TOOL_CALLS\])$", call_gbnf='"[TOOL_CALLS]@NAME@[ARGS]" @ARGS@', id_len=9,
                   root_many="root ::= tool-call+\n", markers=("[TOOL_CALLS]",), block=_ministral,
                   preserved=("[TOOL_CALLS]", "[ARGS]", "[CALL_ID]"))
KIMI_K2 = Format("kimi-k2", trigger=r"(<\|tool_calls_section_begin\|>)$",
                 call_gbnf='"<|tool_call_begin|>functions.@NAME@:0<|tool_call_argument_begin|>" @ARGS@ "<|tool_call_end|>"',
                 root_one='root ::= "<|tool_calls_section_begin|>" tool-call "<|tool_calls_section_end|>"\n',
                 root_many='root ::= "<|tool_calls_section_begin|>" tool-call+ "<|tool_calls_section_end|>"\n',
                 markers=("<|tool_calls_section_begin|>", "<|tool_call_begin|>"), block=_kimi,
                 preserved=("<|tool_calls_section_begin|>", "<|tool_calls_section_end|>", "<|tool_call_begin|>",
                            "<|tool_call_argument_begin|>", "<|tool_call_end|>"))
DEEPSEEK = Format("deepseek", trigger=r"(<｜tool▁calls▁begin｜>)$",
                  call_gbnf='"<｜tool▁call▁begin｜>@NAME@<｜tool▁sep｜>" @ARGS@ "<｜tool▁call▁end｜>"',
                  root_one='root ::= "<｜tool▁calls▁begin｜>" tool-call "<｜tool▁calls▁end｜>"\n',
                  root_many='root ::= "<｜tool▁calls▁begin｜>" tool-call+ "<｜tool▁calls▁end｜>"\n',
                  markers=("<｜tool▁calls▁begin｜>",), block=_deepseek, preserved=_DS)
