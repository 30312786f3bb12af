"""Three families with a markup of their own: MiniMax M3 (every tag behind
``]<]minimax[>[``, a parameter a tag of its name), DeepSeek V3.2 / V4's DSML
(``<｜DSML｜function_calls><｜DSML｜invoke name="NAME"><｜DSML｜parameter name="K"
string="true">V</｜DSML｜parameter></｜DSML｜invoke></｜DSML｜function_calls>``; V4 says
``tool_calls``) and Gemma 4 (``<|tool_call>call:NAME{k:<|"|>text<|"|>,n:1}<tool_call|>``,
keys bare and strings between ``<|"|>``).

Read from llama.cpp's ``common/chat.cpp`` (``common_chat_params_init_deepseek_v3_2``,
``..._gemma4``) and the outputs ``tests/test-chat.cpp`` parses. Neither has a
JSON body a grammar could hold here, so a forced call is the generic JSON
object (``json_fallback``), which the parsers read too.
"""

from __future__ import annotations

import json
import re

from localllm.toolcalls.base import Call, Format, Incomplete, Invalid, Segment, expect, or_json, scalar, until

_D = "<｜DSML｜"
_PARAM = re.compile(r'^\s*name="([^"]{1,128})"(?:\s+string="(true|false)")?\s*$')


def _dsml(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    kind = "function_calls" if text.startswith(_D + "function_calls>", at) else "tool_calls"
    i = at + len(_D + kind + ">")
    end = "</｜DSML｜" + kind + ">"
    calls: list[Segment] = []
    while True:
        j = i
        while j < len(text) and text[j] in " \t\r\n":
            j += 1
        if calls and text.startswith(end, j):
            return calls, j + len(end)
        if not final and (end.startswith(text[j:]) or (_D + 'invoke name="').startswith(text[j:])):
            raise Incomplete
        i = expect(text, j, _D + 'invoke name="', final)
        name, i = until(text, i, '">', final)
        args: dict[str, object] = {}
        while True:
            j = i
            while j < len(text) and text[j] in " \t\r\n":
                j += 1
            if text.startswith("</｜DSML｜invoke>", j):
                i = j + len("</｜DSML｜invoke>")
                break
            if text.startswith(_D + "parameter", j):
                head, k = until(text, j + len(_D + "parameter"), ">", final)
                m = _PARAM.match(head)
                if not m:
                    raise Invalid
                stop = text.find("</｜DSML｜parameter>", k)
                if stop < 0:
                    raise Invalid if final else Incomplete
                value = text[k:stop]
                args[m.group(1)] = value if m.group(2) == "true" else scalar(value)
                i = stop + len("</｜DSML｜parameter>")
                continue
            if not final and ("</｜DSML｜invoke>".startswith(text[j:]) or (_D + "parameter").startswith(text[j:])):
                raise Incomplete
            raise Invalid
        if not name.strip():
            raise Invalid
        calls.append(Call(name.strip(), args))


_Q = '<|"|>'


def _gemma_json(body: str) -> str:
    """Gemma 4's argument notation as JSON: ``<|"|>``-quoted strings, bare keys."""
    out: list[str] = []
    i = 0
    while i < len(body):
        if body.startswith(_Q, i):
            end = body.find(_Q, i + len(_Q))
            if end < 0:
                raise Invalid
            out.append(json.dumps(body[i + len(_Q):end], ensure_ascii=False))
            i = end + len(_Q)
            continue
        m = re.match(r"[A-Za-z_][A-Za-z0-9_\-]*(?=\s*:)", body[i:]) if out and out[-1].rstrip()[-1:] in "{," else None
        if m:
            out.append(json.dumps(m.group(0)))
            i += m.end()
            continue
        out.append(body[i])
        i += 1
    return "".join(out)


def _gemma4(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = expect(text, at, "<|tool_call>call:", final, ws=False)
    name, i = until(text, i, "{", final)
    stop = text.find("<tool_call|>", i)
    if stop < 0:
        raise Invalid if final else Incomplete
    try:
        args = json.loads(_gemma_json("{" + text[i:stop]), strict=False)
    except (ValueError, RecursionError):
        raise Invalid from None
    if not isinstance(args, dict) or not re.match(r"^[A-Za-z0-9_.\-]{1,128}$", name):
        raise Invalid
    return [Call(name, args)], stop + len("<tool_call|>")


_M = "]<]minimax[>["


def _minimax_m3(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """MiniMax M3: every tag behind ``]<]minimax[>[``; a parameter is a tag named after it."""
    i = at + len(_M + "<tool_call>")
    calls: list[Segment] = []
    while True:
        j = _ws(text, i)
        if calls and text.startswith(_M + "</tool_call>", j):
            return calls, j + len(_M + "</tool_call>")
        if not final and ((_M + "</tool_call>").startswith(text[j:]) or (_M + '<invoke name="').startswith(text[j:])):
            raise Incomplete
        i = expect(text, j, _M + '<invoke name="', final)
        name, i = until(text, i, '">', final)
        args: dict[str, object] = {}
        while True:
            j = _ws(text, i)
            if text.startswith(_M + "</invoke>", j):
                i = j + len(_M + "</invoke>")
                break
            if text.startswith(_M + "<", j) and not text.startswith(_M + "</", j):
                key, k = until(text, j + len(_M + "<"), ">", final)
                close = _M + "</" + key + ">"
                stop = text.find(close, k)
                if stop < 0:
                    raise Invalid if final else Incomplete
                args[key] = text[k:stop]
                i = stop + len(close)
                continue
            if not final and (_M + "</invoke>").startswith(text[j:]):
                raise Incomplete
            raise Invalid
        if not name.strip():
            raise Invalid
        calls.append(Call(name.strip(), args, raw=True))


def _ws(text: str, i: int) -> int:
    while i < len(text) and text[i] in " \t\r\n":
        i += 1
    return i


MINIMAX_M3 = Format("minimax-m3", trigger=r"(\]<\]minimax\[>\[<tool_call>)$", json_fallback=True,
                    markers=(_M + "<tool_call>",), block=or_json(_minimax_m3), preserved=(_M, "<tool_call>", "</tool_call>"))
DEEPSEEK_DSML = Format("deepseek-dsml", trigger=r"(<｜DSML｜(?:function|tool)_calls>)$", json_fallback=True,
                       markers=(_D + "function_calls>", _D + "tool_calls>"), block=or_json(_dsml), preserved=("｜DSML｜",))
GEMMA4 = Format("gemma4", trigger=r"(<\|tool_call>)$", json_fallback=True, markers=("<|tool_call>",), block=or_json(_gemma4),
                preserved=("<|channel>", "<channel|>", "<|tool_call>", "<tool_call|>", "<|turn>", _Q))
