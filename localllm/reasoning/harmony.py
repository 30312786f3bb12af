"""gpt-oss's harmony replies split like the text-marker families: its
``analysis`` channel is the thinking, its ``final`` channel (and a
``commentary`` without a recipient) the answer. A reply is a run of messages,
``<|channel|>NAME [to=RECIPIENT] [<|constrain|>json]<|message|>BODY<|end|>``,
the next one behind ``<|start|>assistant`` (llama.cpp's
common/parsers/gpt-oss.cpp; its thinking tags are ``<|channel|>analysis<|message|>``
and ``<|end|>``).

A message addressed to a function (``to=functions.NAME``) is a tool call,
which the tool-call parser reads (``toolcalls.channels``): it goes on as
answer text, whole and as harmony writes it (its header behind
``<|start|>assistant``, its body ended by ``<|call|>``), so that every route's
split (reasoning_content, Messages' thinking, Responses' reasoning, Ollama's
thinking) leaves the calls to the tool parser, as it does for ``<think>``.

The control tokens are text here only because the tokenizer shows them
(``Tokenizer.shown``: gpt-oss's ``<|channel|>``, ``<|message|>``,
``<|start|>``, ``<|constrain|>``, ``<|end|>``; ``<|call|>`` and ``<|return|>``
end the generation). Streamed in pieces of any size, the parts equal the
whole reply's: a marker cut between pieces is held until it is whole.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

REASONING, CONTENT = "reasoning", "content"
START, CHANNEL, MESSAGE = "<|start|>", "<|channel|>", "<|message|>"
ENDS = ("<|end|>", "<|call|>", "<|return|>")
_HEADS = (START, CHANNEL, " to=", "to=")  # what a message's header begins with
_BODY_ENDS = (*ENDS, START)
_CALL = re.compile(r"to=functions\.[A-Za-z0-9_.\-]")
_ANALYSIS = re.compile(r"<\|channel\|>\s*analysis\b")
MAX_HEADER = 512  # a header longer than this is not one: the text is answer


class Channels:
    """One reply's parts: ``feed(piece)`` returns those sure now, ``finish()``
    the rest. ``started_open``: the prompt ended inside an analysis body."""

    def __init__(self, *, started_open: bool = False) -> None:
        self.held = ""
        self.kind: str | None = REASONING if started_open else None  # the open body's: reasoning, content, call; None: between messages
        self.head = ""  # a call's header, sent with its body
        self.seen = 0  # how much of a held call's body holds no end (each piece is searched once, not the whole body again)

    def feed(self, piece: str) -> list[tuple[str, str]]:
        self.held += piece
        return self._drain(final=False)

    def finish(self) -> list[tuple[str, str]]:
        return self._drain(final=True)

    def _drain(self, *, final: bool) -> list[tuple[str, str]]:
        out: list[tuple[str, str]] = []
        while self.held:
            if self.kind is None and not self._header(final):
                break
            if self.kind is not None and not self._body(final, out):
                break
        return merged(out)

    def _header(self, final: bool) -> bool:
        """Between messages: read a header up to ``<|message|>`` (True: went on)."""
        text = self.held
        for e in ENDS:  # a stray end between messages is nothing
            if text.startswith(e):
                self.held = text[len(e):]
                return True
        lead = text.lstrip()
        if not lead and not final:
            return False  # white space: a header may follow
        if not any(lead.startswith(h) for h in _HEADS):
            if not final and any(h.startswith(lead) for h in _HEADS):
                return False  # half a header
            self.kind = CONTENT  # text outside any message: answer, up to the next message
            return True
        m = text.find(MESSAGE, 0, MAX_HEADER + len(MESSAGE))
        if m < 0:
            if not final and len(text) <= MAX_HEADER:
                return False
            self.kind = CONTENT  # never a header: answer text
            return True
        header = text[:m]
        self.held = text[m + len(MESSAGE):]
        if _CALL.search(header):
            self.kind, self.head = "call", header.lstrip() if header.lstrip().startswith(START) else header
        else:
            self.kind = REASONING if _ANALYSIS.search(header) else CONTENT
        return True

    def _body(self, final: bool, out: list[tuple[str, str]]) -> bool:
        """Inside a body: up to its end (True: the body ended)."""
        text, kind = self.held, self.kind
        assert kind is not None  # inside a body
        end, which = _first(text, _BODY_ENDS, self.seen)
        if end < 0 and not final:
            if kind == "call":
                self.seen = max(0, len(text) - max(len(m) for m in _BODY_ENDS))
                return False  # a call goes on whole
            keep = len(text) - _partial(text, _BODY_ENDS)
            if keep > 0:
                out.append((kind, text[:keep]))
                self.held = text[keep:]
            return False
        body = text if end < 0 else text[:end]
        self.held = "" if end < 0 else text[end + (0 if which == START else len(which)):]
        if kind == "call":
            opened = self.head if self.head.startswith(START) else START + "assistant" + self.head
            out.append((CONTENT, opened + MESSAGE + body + (which if which in ("<|call|>", "<|end|>") else "<|call|>")))
        elif body:
            out.append((kind, body))
        self.kind, self.head, self.seen = None, "", 0
        return True


def _first(text: str, marks: tuple[str, ...], start: int = 0) -> tuple[int, str]:
    best, which = -1, ""
    for m in marks:
        at = text.find(m, start)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, m
    return best, which


def _partial(text: str, marks: tuple[str, ...]) -> int:
    """How many characters at the end of ``text`` could begin one of ``marks``."""
    for n in range(min(max(len(m) for m in marks) - 1, len(text)), 0, -1):
        if any(m.startswith(text[-n:]) for m in marks):
            return n
    return 0


def merged(parts: Iterable[tuple[str, str]]) -> list[tuple[str, str]]:
    """Adjacent parts of one kind joined, empty ones dropped (the split's and the channels' output)."""
    out: list[tuple[str, str]] = []
    for kind, text in parts:
        if out and out[-1][0] == kind:
            out[-1] = (kind, out[-1][1] + text)
        elif text:
            out.append((kind, text))
    return out
