"""LFM2's calls, written as a Python list of calls:
``<|tool_call_start|>[get_time(city="Paris"), now()]<|tool_call_end|>``
(llama.cpp's ``common/chat.cpp``, ``common_chat_params_init_lfm2``). The
list is read with Python's own parser, as literals only: nothing is
evaluated, and anything but a call with literal keyword arguments is not a call."""

from __future__ import annotations

import ast

from localllm.toolcalls.base import Call, Format, Incomplete, Invalid, Segment, or_json

_START, _END = "<|tool_call_start|>", "<|tool_call_end|>"
_MAX = 1 << 20  # a call list longer than this is not parsed (ast's recursion and memory)


def _lfm2(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
    i = at + len(_START)
    end = text.find(_END, i)
    if end < 0:
        raise Invalid if final else Incomplete
    body = text[i:end].strip()
    if len(body) > _MAX:
        raise Invalid
    try:
        tree = ast.parse(body, mode="eval").body
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        raise Invalid from None
    items = tree.elts if isinstance(tree, ast.List) else [tree]
    calls: list[Segment] = []
    for it in items:
        if not isinstance(it, ast.Call) or it.args or not isinstance(it.func, (ast.Name, ast.Attribute)):
            raise Invalid
        name = ast.unparse(it.func)
        try:
            args = {kw.arg: ast.literal_eval(kw.value) for kw in it.keywords if kw.arg is not None}
        except (ValueError, TypeError, SyntaxError, RecursionError, MemoryError):
            raise Invalid from None
        if len(args) != len(it.keywords):
            raise Invalid
        calls.append(Call(name, args))
    if not calls:
        raise Invalid
    return calls, end + len(_END)


LFM2 = Format("lfm2", trigger=r"(<\|tool_call_start\|>)$", markers=(_START,), block=or_json(_lfm2), json_fallback=True,
              preserved=(_START, _END, "<|tool_list_start|>", "<|tool_list_end|>"))
