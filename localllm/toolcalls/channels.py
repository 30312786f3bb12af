"""The families that write a reply as addressed messages rather than text
with calls in it: gpt-oss's harmony (``<|channel|>analysis<|message|>...<|end|>
<|start|>assistant<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{...}<|call|>``)
and Functionary v3.2 (``all\\ntext>>>NAME\\n{...}``: the prompt ends with ``>>>``).

Read from llama.cpp's ``common/chat.cpp`` (``common_chat_params_init_gpt_oss``,
``..._functionary_v3_2``) and the outputs ``tests/test-chat.cpp`` parses:
harmony's ``analysis`` channel is the reasoning, ``final`` and
``commentary`` without a recipient the content, a ``functions.NAME``
recipient (in the role's header or the channel's) a call.
"""

from __future__ import annotations

import re

from localllm.toolcalls.base import Call, Format, Incomplete, Invalid, Segment, read_json

_ENDS = ("<|end|>", "<|call|>", "<|return|>", "<|start|>")
_HEADS = ("<|start|>", "<|channel|>", " to=", "to=", "<|constrain|>")
_RECIPIENT = re.compile(r"to=functions\.([A-Za-z0-9_.\-]{1,128})")
_CHANNEL = re.compile(r"<\|channel\|>\s*(\w+)")


def _kind(header: str) -> tuple[str, str]:
    """("call", name), ("reasoning", "") or ("content", "") of a message by its header."""
    m = _RECIPIENT.search(header)
    if m:
        return "call", m.group(1)
    ch = _CHANNEL.search(header)
    return ("reasoning", "") if ch and ch.group(1) == "analysis" else ("content", "")


def _body_end(text: str, i: int) -> tuple[int, int]:
    """(where the body from ``i`` ends, where the next message starts); (-1, -1): not yet."""
    best, nxt = -1, -1
    for e in _ENDS:
        at = text.find(e, i)
        if at >= 0 and (best < 0 or at < best):
            best, nxt = at, at if e == "<|start|>" else at + len(e)
    return best, nxt


def _partial_end(text: str, i: int) -> int:
    for n in range(min(max(len(e) for e in _ENDS) - 1, len(text) - i), 0, -1):
        if any(e.startswith(text[len(text) - n:]) for e in _ENDS):
            return n
    return 0


def _open_body(text: str, start: int) -> str | None:
    """The header of the message whose body ``start`` is inside (a held stream resumes there), else None."""
    m = text.rfind("<|message|>", 0, start)
    if m < 0 or any(text.find(e, m, start) >= 0 for e in _ENDS):
        return None
    begin = max([text.rfind(e, 0, m) + len(e) for e in _ENDS if text.rfind(e, 0, m) >= 0] + [0])
    return text[begin:m]


def harmony_scan(fmt: Format, text: str, start: int, final: bool) -> tuple[list[Segment], int]:
    segs: list[Segment] = []
    i = start
    header = _open_body(text, i) if i > 0 else None
    if header is not None:  # resume inside a body
        kind, _ = _kind(header)
        end, nxt = _body_end(text, i)
        if end < 0:
            return _body(text, i, kind, final, segs)
        segs.append((kind, text[i:end]))
        i = nxt
    while i < len(text):
        rest = text[i:]
        if not any(rest.startswith(h) or (not final and h.startswith(rest)) for h in _HEADS):
            if i == 0 or text[:i].isspace():
                if not rest.strip() and not final:
                    return segs, i
            end, nxt = _body_end(text, i)  # text without a header: content up to the next message
            if end < 0:
                return _body(text, i, "content", final, segs)
            segs.append(("content", text[i:end]))
            i = nxt
            continue
        m = text.find("<|message|>", i)
        if m < 0 or m - i > 512:
            if not final and m < 0 and len(rest) <= 512:
                return segs, i
            segs.append(("invalid", rest))
            return segs, len(text)
        kind, name = _kind(text[i:m])
        body = m + len("<|message|>")
        if kind != "call":
            end, nxt = _body_end(text, body)
            if end < 0:
                return _body(text, body, kind, final, segs)
            segs.append((kind, text[body:end]))
            i = nxt
            continue
        end, nxt = _body_end(text, body)
        if end < 0 and not final:
            return segs, i
        stop = end if end >= 0 else len(text)
        try:
            args, j = read_json(text[:stop], body, True)
            if not isinstance(args, dict) or text[j:stop].strip():
                raise Invalid
        except (Invalid, Incomplete):
            segs.append(("invalid", text[i:stop]))
        else:
            segs.append(Call(name, args))
        i = nxt if end >= 0 else len(text)
    return segs, i


def _body(text: str, i: int, kind: str, final: bool, segs: list[Segment]) -> tuple[list[Segment], int]:
    """An open body: all of it when final, else up to half an end marker."""
    keep = len(text) if final else len(text) - _partial_end(text, i)
    if keep > i:
        segs.append((kind, text[i:keep]))
    return segs, max(keep, i)


def functionary_v3_2_scan(fmt: Format, text: str, start: int, final: bool) -> tuple[list[Segment], int]:
    """Messages after ``>>>`` (the first after the prompt's): a recipient line,
    then ``all``'s text or a call's JSON. Text that is not such is content.
    The scan holds at a message's ``>>>`` (or the reply's start) until the
    message is whole."""
    segs: list[Segment] = []
    i = start
    while i < len(text):
        hold = i
        if i > 0:  # after a message: the next one's >>>, or the rest is content
            k = i
            while k < len(text) and text[k] in " \t\r\n":
                k += 1
            if not text.startswith(">>>", k):
                if not final and ">>>".startswith(text[k:]):
                    return segs, hold
                segs.append(("content", text[i:]))
                return segs, len(text)
            i = k + 3
        nl = text.find("\n", i, i + 130)
        if nl < 0:
            if not final and len(text) - i < 130:
                return segs, hold
            segs.append(("invalid", text[hold:]))
            return segs, len(text)
        name = text[i:nl].strip()
        if name == "all":
            end = text.find(">>>", nl + 1)
            if end < 0:
                if not final:
                    return segs, hold
                segs.append(("content", text[nl + 1:]))
                return segs, len(text)
            segs.append(("content", text[nl + 1:end]))
            i = end
            continue
        if not re.match(r"^[A-Za-z0-9_.\-]{1,128}$", name):
            segs.append(("invalid", text[hold:]))
            return segs, len(text)
        try:
            args, j = read_json(text, nl + 1, final)
            if not isinstance(args, dict):
                raise Invalid
        except Incomplete:
            return segs, hold
        except Invalid:
            segs.append(("invalid", text[hold:]))
            return segs, len(text)
        segs.append(Call(name, args))
        i = j
    return segs, i


HARMONY = Format("gpt-oss", trigger=r"(<\|channel\|>commentary to=functions\.|<\|start\|>assistant to=functions\.| to=functions\.)$",
                 call_gbnf='"<|channel|>commentary to=functions.@NAME@ <|constrain|>json<|message|>" @ARGS@',
                 root_many='root ::= tool-call ("<|call|>" "<|start|>assistant" tool-call)*\n', scan=harmony_scan,
                 preserved=("<|channel|>", "<|constrain|>", "<|message|>", "<|start|>", "<|end|>"))
FUNCTIONARY_V3_2 = Format("functionary-v3.2", call_gbnf='"@NAME@\\n" @ARGS@', root_many='root ::= tool-call (">>>" tool-call)*\n',
                          scan=functionary_v3_2_scan, preserved=(">>>all", ">>>"))
