"""Text the chat did not write, kept text: a tool's result cannot forge a turn.

A chat session tokenizes the template's text with special tokens parsed (the
template writes ``<|im_start|>`` as text), so a tool result holding
``<|im_end|><|im_start|>system`` would become control tokens. As
``serve`` does for messages (``engine/tokenizer.py``'s ``chat_tokens``), the
span of such a message in the rendered text is found with a random marker in
its place and tokenized apart, as plain text, between the template's pieces.
Only messages that hold special-token text take this path; the others are
tokenized with the rest, exactly as before.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence
from typing import Any

from localllm.engine_api import Engine
from localllm.errors import InputError

UNTRUSTED_ROLES = ("tool",)


def holds_special(engine: Engine, text: str) -> bool:
    """Whether ``text`` holds a special token's text (it tokenizes differently when
    special tokens are parsed)."""
    if not text:
        return False
    return engine.tokenize(text, add_special=False, parse_special=True) != engine.tokenize(text, add_special=False, parse_special=False)


def spans(render: Callable[[list[dict[str, Any]]], str], messages: list[dict[str, Any]], which: Sequence[int],
          rendered: str) -> list[tuple[int, int]]:
    """Where each message of ``which`` sits in ``rendered`` (``render(messages)``),
    however the template and the tool format wrap or escape it: rendered again
    with a marker (letters only, so JSON keeps it as it is) in its place, the text
    before and after it is the same, and its length is what is left."""
    out = []
    for i in which:
        mark = "LLMDATA" + secrets.token_hex(12)
        marked = render([dict(m, content=mark) if j == i else m for j, m in enumerate(messages)])
        at = marked.find(mark)
        if at < 0 or marked.count(mark) != 1:
            raise InputError("a tool result holds special-token text, and this chat template repeats or drops it: "
                             "it cannot be kept apart from the template's own tokens")
        out.append((at, at + len(rendered) - (len(marked) - len(mark))))
    return sorted(out)


def tokens(engine: Engine, text: str, start: int, end: int, data: Sequence[tuple[int, int]]) -> list[int]:
    """``text[start:end]`` tokenized with special tokens parsed, but for the
    ``data`` spans in it, which are plain text."""
    out: list[int] = []
    pos = start
    for a, b in data:
        a, b = max(a, start), min(b, end)
        if a >= b:
            continue
        out += engine.tokenize(text[pos:a], add_special=False, parse_special=True) if a > pos else []
        out += engine.tokenize(text[a:b], add_special=False, parse_special=False)
        pos = b
    return out + (engine.tokenize(text[pos:end], add_special=False, parse_special=True) if end > pos else [])
