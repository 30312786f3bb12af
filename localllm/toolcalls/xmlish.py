"""The families that write arguments as XML-ish parameters, one per tag:
Qwen3-Coder (also Qwen3.5, Nemotron 3 Nano, StepFun 3.5:
``<tool_call>\\n<function=NAME>\\n<parameter=K>\\nV\\n</parameter>\\n</function>\\n</tool_call>``),
Seed-OSS (the same inside ``<seed:tool_call>``), MiniMax M2
(``<minimax:tool_call><invoke name="NAME"><parameter name="K">V</parameter></invoke>``),
MiniCPM 5 (``<function name="NAME"><param name="K">V</param></function>``), and GLM 4.5+
and Ling 3 (``<tool_call>NAME<arg_key>K</arg_key><arg_value>V</arg_value></tool_call>``).

A parameter's value is text; it is read as JSON by the tool's schema
afterwards (``Call.typed``), as llama.cpp's parsers do (``common/chat.cpp``'s
``common_chat_params_init_qwen3_coder``; the autoparser for the others).
These formats have no JSON body a grammar could hold, so a forced call
(tool_choice required or named) is asked as the generic JSON object instead
(``json_fallback``), which the parser reads as well.
"""

from __future__ import annotations

from localllm.toolcalls.base import Call, Format, Incomplete, Invalid, Segment, expect, or_json, until

_WS = " \t\r\n"


def _skip(text: str, i: int) -> int:
    while i < len(text) and text[i] in _WS:
        i += 1
    return i


def _value(text: str, i: int, close: str, final: bool) -> tuple[str, int]:
    end = text.find(close, i)
    if end < 0:
        raise Invalid if final else Incomplete
    v = text[i:end]
    v = v[1:] if v.startswith("\n") else v
    v = v[:-1] if v.endswith("\n") else v
    return v, end + len(close)


def _params(text: str, i: int, final: bool, open_: str, head_end: str, close: str, end: str) -> tuple[dict[str, str], int]:
    """``open_ KEY head_end VALUE close`` repeated, then ``end``."""
    args: dict[str, str] = {}
    while True:
        j = _skip(text, i)
        if text.startswith(end, j):
            return args, j + len(end)
        if text.startswith(open_, j):
            key, k = until(text, j + len(open_), head_end, final)
            args[key.strip()], i = _value(text, k, close, final)
            continue
        rest = text[j:]
        if not final and (end.startswith(rest) or open_.startswith(rest)):
            raise Incomplete
        raise Invalid


def _function(text: str, i: int, final: bool) -> tuple[Call, int]:
    """``<function=NAME>`` parameters ``</function>``."""
    i = expect(text, i, "<function=", final)
    name, i = until(text, i, ">", final)
    args, i = _params(text, i, final, "<parameter=", ">", "</parameter>", "</function>")
    if not name.strip():
        raise Invalid
    return Call(name.strip(), args, raw=True), i


def _optional(text: str, i: int, lit: str, final: bool) -> int:
    """Past ``lit`` if it comes next (after white space), else ``i``; held while it may."""
    j = _skip(text, i)
    if text.startswith(lit, j):
        return j + len(lit)
    if not final and lit.startswith(text[j:]):
        raise Incomplete
    return i


def _qwen3_coder(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """Some models leave out the first ``<tool_call>`` (test-chat.cpp's case): ``<function=`` alone begins a call too."""
    i = at + len("<tool_call>") if text.startswith("<tool_call>", at) else at
    call, i = _function(text, i, final)
    return [call], _optional(text, i, "</tool_call>", final)


def _seed_oss(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = at + len("<seed:tool_call>")
    calls: list[Segment] = []
    while True:
        call, i = _function(text, i, final)
        calls.append(call)
        j = _skip(text, i)
        if text.startswith("</seed:tool_call>", j):
            return calls, j + len("</seed:tool_call>")
        if not final and "</seed:tool_call>".startswith(text[j:]):
            raise Incomplete


def _minimax(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = at + len("<minimax:tool_call>")
    calls: list[Segment] = []
    while True:
        j = _skip(text, i)
        if calls and text.startswith("</minimax:tool_call>", j):
            return calls, j + len("</minimax:tool_call>")
        if not final and ("</minimax:tool_call>".startswith(text[j:]) or '<invoke name="'.startswith(text[j:])):
            raise Incomplete
        i = expect(text, j, '<invoke name="', final)
        name, i = until(text, i, '">', final)
        args, i = _params(text, i, final, '<parameter name="', '">', "</parameter>", "</invoke>")
        if not name.strip():
            raise Invalid
        calls.append(Call(name.strip(), args, raw=True))


def _glm(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = at + len("<tool_call>")
    cut = [text.find(m, i, i + 200) for m in ("<arg_key>", "</tool_call>", "\n")]
    found = [c for c in cut if c >= 0]
    if not found:
        raise Invalid if final or len(text) - i > 200 else Incomplete
    name = text[i:min(found)].strip()
    if not name or "<" in name or "{" in name:
        raise Invalid  # Hermes's JSON inside <tool_call>: not this format
    args: dict[str, str] = {}
    i = min(found)
    while True:
        j = _skip(text, i)
        if text.startswith("</tool_call>", j):
            return [Call(name, args, raw=True)], j + len("</tool_call>")
        if text.startswith("<arg_key>", j):
            key, k = until(text, j + len("<arg_key>"), "</arg_key>", final)
            k = expect(text, k, "<arg_value>", final)
            args[key.strip()], i = _value(text, k, "</arg_value>", final)
            continue
        if not final and ("</tool_call>".startswith(text[j:]) or "<arg_key>".startswith(text[j:])):
            raise Incomplete
        raise Invalid


def _minicpm5(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    """MiniCPM 5: ``<function name="NAME"><param name="K">V</param></function>``."""
    name, i = until(text, at + len('<function name="'), '">', final)
    args, i = _params(text, i, final, '<param name="', '">', "</param>", "</function>")
    if not name.strip():
        raise Invalid
    return [Call(name.strip(), args, raw=True)], i


QWEN3_CODER = Format("qwen3-coder", trigger=r"(<tool_call>|<function=)$", markers=("<tool_call>", "<function="),
                     block=or_json(_qwen3_coder), json_fallback=True, preserved=("<tool_call>", "</tool_call>"))
SEED_OSS = Format("seed-oss", trigger=r"(<seed:tool_call>)$", markers=("<seed:tool_call>",), block=or_json(_seed_oss), json_fallback=True,
                   preserved=("<seed:tool_call>", "</seed:tool_call>"))
MINIMAX = Format("minimax", trigger=r"(<minimax:tool_call>)$", markers=("<minimax:tool_call>",), block=or_json(_minimax), json_fallback=True,
                  preserved=("<minimax:tool_call>", "</minimax:tool_call>"))
MINICPM5 = Format("minicpm5", trigger=r'(<function name=")$', markers=('<function name="',), block=or_json(_minicpm5), json_fallback=True,
                   preserved=("<function", "<param", "</function>", "</param>"))
GLM = Format("glm-4.5", trigger=r"(<tool_call>)$", markers=("<tool_call>",), block=or_json(_glm), json_fallback=True,
             preserved=("<tool_call>", "</tool_call>", "<arg_key>", "</arg_key>", "<arg_value>", "</arg_value>"))
