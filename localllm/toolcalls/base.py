"""The parts every tool-call format shares: a call, a format, the scan that
cuts a reply into content, reasoning and calls, and the streaming parser.

A format is read from llama.cpp's ``common/chat.cpp`` (its specialized
parsers and the autoparser's output for the other templates) and
``tests/test-chat.cpp`` (the model outputs each template is tested with).

The scan goes left to right and never looks back: text before ``hold`` is
decided (content, reasoning or a whole call) and stays so however the reply
goes on. That is what lets the streaming parser feed any chunks, down to one
byte, and still end with exactly what the whole reply parses to. A call
that does not parse (invalid JSON, cut short, a stray control token) is
content, never an exception: the model's text is untrusted.
"""

from __future__ import annotations

import json
import secrets
import string
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

_ALNUM = string.ascii_letters + string.digits
_DECODER = json.JSONDecoder(strict=False)  # the grammar's strings, as llama.cpp's converter writes them, allow control characters


@dataclass(frozen=True)
class Call:
    """One parsed call: its name, its arguments (a JSON object), and the id the model wrote, if any."""

    name: str
    arguments: Any
    id: str | None = None
    raw: bool = False  # the arguments are XML-ish parameters' text, not yet typed (``typed``)

    def typed(self, schemas: dict[str, Any] | None = None) -> Call:
        """The call with each parameter's text read as its JSON value, by the
        tool's schema where one is known (a string property stays text)."""
        if not self.raw:
            return self
        props = (schemas or {}).get(self.name, {})
        props = props.get("properties", {}) if isinstance(props, dict) else {}
        props = props if isinstance(props, dict) else {}
        return Call(self.name, {k: scalar(v, props.get(k)) for k, v in self.arguments.items()}, self.id)


class Incomplete(Exception):
    """A block that may still become a call as more text comes."""


class Invalid(Exception):
    """A block that is not a call: its marker is content."""


# ("content" | "reasoning" | "invalid", text) or a call; "invalid": content that looked like a call
Segment = tuple[str, str] | Call
Block = Callable[[str, int, bool], tuple[list[Segment], int]]  # (text, start of the block's marker, final) -> (segments, end)
Scan = Callable[["Format", str, int, bool], tuple[list[Segment], int]]


@dataclass(frozen=True)
class Format:
    """How one template family writes a call.

    For serve's grammar (tool_choice required/named, and the lazy grammar of
    ``auto``): ``root_one``/``root_many`` (GBNF of a reply holding one / one or
    more calls, around rule ``tool-call``), ``trigger`` (a regex ending in $
    over the reply so far; its capture is where the grammar starts),
    ``call_gbnf`` (a call's shape around ``@NAME@`` and ``@ARGS@``; empty: the
    JSON object ``{"name", args_key}``). ``json_fallback``: the format's
    calls are not JSON (XML parameters): a forced call is held to the generic
    JSON object instead, which the parser also reads.

    For parsing: ``markers`` (text where a call block begins, each read by
    ``block``), ``bare`` (the characters a call may begin with at the very
    start of a reply, where the marker is a control token the text lacks),
    ``scan`` (a format that is not marker-driven: gpt-oss, Functionary v3.2).

    ``preserved``: the texts the format's calls are made of that a model's
    vocabulary may hold as control tokens (llama.cpp's ``preserved_tokens``,
    from common/chat.cpp and its parsers). A generated control token is shown
    as empty text unless it is one of these (engine/tokenizer.Tokenizer.shown):
    without them a real model's ``[TOOL_CALLS]`` or ``<|tool_calls_section_begin|>``
    never reaches the parser, and its call is read as content.
    """

    name: str
    args_key: str = "arguments"
    root_one: str = "root ::= tool-call\n"
    root_many: str = "root ::= tool-call\n"
    trigger: str = ""
    id_len: int = 0  # Mistral's templates want 9 alphanumerics as a call id; 0: OpenAI's call_...
    system_role: bool = True  # generic: whether the template takes a system message (Gemma 2's refuses one)
    call_gbnf: str = ""
    json_fallback: bool = False
    parallel: bool = True  # whether the format can write more than one call in a reply
    preserved: tuple[str, ...] = ()
    markers: tuple[str, ...] = ()
    bare: str = ""
    block: Block | None = field(default=None, compare=False, repr=False)
    scan: Scan | None = field(default=None, compare=False, repr=False)
    schemas: Any = field(default=None, compare=False, repr=False)  # {name: parameters schema} of a request's tools, to type XML-ish values

    def call_id(self) -> str:
        if self.id_len:
            return "".join(secrets.choice(_ALNUM) for _ in range(self.id_len))
        return "call_" + secrets.token_hex(12)

    @property
    def native(self) -> bool:
        """Whether the chat template renders the tools itself (else a system message says them)."""
        return self.name != "generic"


# -- the scan ------------------------------------------------------------------------

def scan(fmt: Format, text: str, start: int, final: bool) -> tuple[list[Segment], int]:
    """(segments of ``text[start:hold]``, hold): see the module's docstring."""
    if fmt.scan is not None:
        return fmt.scan(fmt, text, start, final)
    return marker_scan(fmt, text, start, final)


def marker_scan(fmt: Format, text: str, start: int, final: bool) -> tuple[list[Segment], int]:
    segs: list[Segment] = []
    i = start
    while i < len(text):
        if fmt.bare and fmt.block is not None and (i == 0 or text[:i].isspace()):  # the reply's start: a call whose marker is not in the text
            lead = len(text) - len(text[i:].lstrip())
            if lead < len(text) and text[lead] in fmt.bare:
                try:
                    got, end = fmt.block(text, lead, final)
                except Incomplete:
                    if final:
                        return segs + [("invalid", text[i:])], len(text)
                    return segs, i
                except Invalid:  # not a call: its first character is content, and the scan goes on
                    segs.append(("invalid", text[i:lead + 1]))
                    i = lead + 1
                    continue
                segs += [("content", text[i:lead])] + got if lead > i else got
                i = end
                continue
            if lead == len(text) and not final:
                return segs, i  # white space only so far: a bare call may follow
        at, marker = _first(text, i, fmt.markers)
        if at < 0:
            keep = len(text) if final else len(text) - _partial(text, i, fmt.markers)
            if keep > i:
                segs.append(("content", text[i:keep]))
            return segs, keep
        if at > i:
            segs.append(("content", text[i:at]))
        assert fmt.block is not None
        try:
            got, end = fmt.block(text, at, final)
        except Incomplete:
            if final:
                segs.append(("invalid", text[at:]))
                return segs, len(text)
            return segs, at
        except Invalid:
            segs.append(("invalid", marker))
            i = at + len(marker)
            continue
        segs += got
        i = end
    return segs, i


def _first(text: str, i: int, markers: tuple[str, ...]) -> tuple[int, str]:
    best, which = -1, ""
    for m in markers:
        at = text.find(m, i)
        if at >= 0 and (best < 0 or at < best):
            best, which = at, m
    return best, which


def _partial(text: str, i: int, markers: tuple[str, ...]) -> int:
    """How many characters at the end of ``text[i:]`` could begin one of ``markers``."""
    most = 0
    for m in markers:
        for n in range(min(len(m) - 1, len(text) - i), most, -1):
            if m.startswith(text[len(text) - n:]):
                most = n
                break
    return most


# -- JSON pieces ---------------------------------------------------------------------

NAME_KEYS = ("name", "tool_name", "function")
ARGS_KEYS = ("arguments", "parameters")
ID_KEYS = ("id", "tool_call_id")


def read_json(text: str, at: int, final: bool) -> tuple[Any, int]:
    """The JSON value at ``text[at:]`` (white space first skipped) and where it ends."""
    while at < len(text) and text[at] in " \t\r\n":
        at += 1
    if at >= len(text):
        raise Incomplete if not final else Invalid
    if text[at] not in "{[":
        raise Invalid
    try:
        return _DECODER.raw_decode(text, at)
    except ValueError:
        raise (Invalid if final else Incomplete) from None
    except RecursionError:  # hostile nesting
        raise Invalid from None


def call_object(obj: Any) -> Call:
    """A call written as one JSON object: ``{"name", "arguments"}``, or with
    Llama 3's ``parameters``, Command R7B's ``tool_name``, an ``id``; nothing else."""
    if not isinstance(obj, dict):
        raise Invalid
    names = [k for k in NAME_KEYS if k in obj]
    args = [k for k in ARGS_KEYS if k in obj]
    ids = [k for k in ID_KEYS if k in obj]
    if len(names) != 1 or len(args) > 1 or len(obj) != len(names) + len(args) + len(ids):
        raise Invalid
    name, arguments = obj[names[0]], obj[args[0]] if args else {}
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments, strict=False)
        except ValueError:
            raise Invalid from None
    cid = obj[ids[0]] if ids else None
    if not isinstance(name, str) or not name or not isinstance(arguments, dict):
        raise Invalid
    return Call(name, arguments, str(cid) if isinstance(cid, (str, int)) and not isinstance(cid, bool) else None)


def call_list(obj: Any) -> list[Segment]:
    """A JSON array of call objects, or one object."""
    items = obj if isinstance(obj, list) else [obj]
    if not items:
        raise Invalid
    return [call_object(it) for it in items]


def or_json(block: Block) -> Block:
    """``block``, and a bare JSON call object where the format's marker would
    be: how a forced call of a format with no grammar here is written (serve's
    ``json_fallback``: the generic object)."""

    def either(text: str, at: int, final: bool) -> tuple[list[Segment], int]:
        if text.startswith("{", at):
            obj, j = read_json(text, at, final)
            return [call_object(obj)], j
        return block(text, at, final)

    return either


def expect(text: str, at: int, lit: str, final: bool, *, ws: bool = True) -> int:
    """Where ``lit`` ends if it is at ``text[at:]`` (after white space if ``ws``)."""
    if ws:
        while at < len(text) and text[at] in " \t\r\n":
            at += 1
    if text.startswith(lit, at):
        return at + len(lit)
    if not final and lit.startswith(text[at:]):
        raise Incomplete
    raise Invalid


def until(text: str, at: int, lit: str, final: bool, limit: int = 256) -> tuple[str, int]:
    """(text up to ``lit``, where ``lit`` ends); a name longer than ``limit`` is not a name."""
    end = text.find(lit, at, at + limit + len(lit))
    if end < 0:
        if final or len(text) - at > limit + len(lit):
            raise Invalid
        raise Incomplete
    return text[at:end], end + len(lit)


def scalar(value: str, schema: Any = None) -> Any:
    """An XML-ish parameter's text as its JSON value: a string where the
    schema says string (or the text is not JSON), else the JSON it spells."""
    kind = schema.get("type") if isinstance(schema, dict) else None
    if kind == "string":
        return value
    try:
        return json.loads(value, strict=False)
    except ValueError:
        return value
