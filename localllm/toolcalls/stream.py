"""A reply parsed as it streams, or whole: its reasoning (through
``localllm.reasoning``'s split, the same as every route uses), its content
and its calls.

Content is sent as soon as it cannot be the start of a call; from a
format's marker on (or half of one at the end of a chunk) the text is held
until the call is whole, or shown not to be one. White space around calls
is neither: the white space before a reply's first call and between calls
goes nowhere, as llama.cpp's parsers skip it.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from localllm.reasoning import Markers, Splitter
from localllm.toolcalls.base import Call, Format, Segment, scan


@dataclass
class Parsed:
    """A whole reply: its thinking (None: none), its content, its calls;
    ``broken``: some text looked like a call and was not one (it is in the content)."""

    reasoning: str | None
    content: str
    calls: list[Call] = field(default_factory=list)
    broken: bool = False


class Stream:
    """Feed a reply in chunks of any size; each ``feed`` returns what is sure
    now, in order: ("reasoning", text), ("content", text) and whole ``Call``s;
    ``finish`` returns the rest."""

    def __init__(self, fmt: Format, marks: Markers | None = None, *, started_open: bool = False) -> None:
        self.fmt = fmt
        self.think = Splitter(marks, started_open=started_open) if marks is not None else None
        self.text = ""  # the content stream the tool scan reads (the thinking is not in it)
        self.pos = 0  # where the undecided text begins
        self.ws = ""  # white space held: dropped if a call follows
        self.clean = True  # at the reply's start or just after a call
        self.called = False
        self.broken = False

    def feed(self, piece: str) -> list[Segment]:
        parts = self.think.feed(piece) if self.think is not None else [("content", piece)]
        return self._parts(parts, final=False)

    def finish(self) -> list[Segment]:
        parts = self.think.finish() if self.think is not None else []
        return self._parts(parts, final=True)

    def _parts(self, parts: list[tuple[str, str]], *, final: bool) -> list[Segment]:
        out: list[Segment] = []
        for kind, text in parts:
            if kind == "reasoning":
                out.append(("reasoning", text))
            else:
                self.text += text
        if final or any(kind != "reasoning" for kind, _ in parts):
            segs, self.pos = scan(self.fmt, self.text, self.pos, final)
            out += self._emit(segs)
        if final and self.ws and not self.called:
            out.append(("content", self.ws))
            self.ws = ""
        return _merged(out)

    def _emit(self, segs: list[Segment]) -> list[Segment]:
        out: list[Segment] = []
        for s in segs:
            if isinstance(s, Call):
                self.ws, self.clean, self.called = "", True, True
                out.append(s.typed(self.fmt.schemas))
                continue
            kind, text = s
            if kind == "reasoning":
                out.append(s)
                continue
            self.broken = self.broken or kind == "invalid"
            if self.clean:
                text = self.ws + text
                if not text.strip():
                    self.ws = text
                    continue
                self.ws, self.clean = "", False
            out.append(("content", text))
        return out


def parse(text: str, fmt: Format, marks: Markers | None = None, *, started_open: bool = False) -> Parsed:
    """A whole reply (the same parts a stream of it gives)."""
    s = Stream(fmt, marks, started_open=started_open)
    return collect(s.feed(text) + s.finish(), broken_from=s)


def collect(parts: list[Segment], broken_from: Stream | None = None) -> Parsed:
    """The parts of a stream put together."""
    reasoning = "".join(p[1] for p in parts if not isinstance(p, Call) and p[0] == "reasoning")
    content = "".join(p[1] for p in parts if not isinstance(p, Call) and p[0] == "content")
    return Parsed(reasoning or None, content, [p for p in parts if isinstance(p, Call)],
                  broken=broken_from.broken if broken_from is not None else False)


def _merged(parts: list[Segment]) -> list[Segment]:
    out: list[Segment] = []
    for p in parts:
        if isinstance(p, Call):
            out.append(p)
            continue
        if not p[1]:
            continue
        last = out[-1] if out else None
        if last is not None and not isinstance(last, Call) and last[0] == p[0]:
            out[-1] = (p[0], last[1] + p[1])
        else:
            out.append(p)
    return out
