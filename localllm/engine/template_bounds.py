"""The limits a chat template renders under: time, size and memory.

A template is code from a downloaded file. Jinja's sandbox keeps it from ``os``
but not from asking for a 4 GB string in one step (``s ~ s`` doubled 32 times,
``'{:>999999999}'.format(1)``, ``s.replace('x', s)``) or from building a list of
40 million items, so each such step is checked here *before* it runs, against
the size of what it would make, and the render as a whole is stopped once the
process has grown by more than its memory allowance (measured, every
millisecond of rendering, as the resident set size's growth):

- a string may not grow past ``max_chars`` (the output limit), a list or other
  collection past ``max_items``;
- powers are bounded, so ``10 ** 10 ** 10`` is refused before it is computed;
- the process may not grow by more than ``max_bytes`` while rendering.

An in-process address-space limit (``RLIMIT_AS``) would fail llama.cpp's and
every other thread's allocations too, so the checks are on the template's own
operations.
"""

from __future__ import annotations

import re
import string
import time
from collections.abc import Sized
from typing import Any

import psutil

MAX_ITEMS = 1_000_000  # elements of a list, tuple, dict or set a template makes
MIN_MEMORY_BYTES = 64 * 1024 * 1024  # growth allowed while rendering; more for longer messages
_MAX_INT_BITS = 64
_MEMORY_CHECK_S = 0.001
_PERCENT_FIELD = re.compile(r"%(?:\([^)]*\))?[-+ #0]*(\*|\d+)?(?:\.(\*|\d+))?")
_NUMBERS = re.compile(r"\d+")
_LIST_MAKERS = frozenset({"list", "batch", "slice", "map", "select", "reject", "selectattr", "rejectattr", "unique",
                          "sort", "reverse", "groupby", "dictsort", "items", "join", "sum"})


class Limit(Exception):
    """Raised inside the template when it goes past a limit."""


class Limits:
    def __init__(self, seconds: float, max_chars: int, max_bytes: int = MIN_MEMORY_BYTES) -> None:
        self.seconds = seconds
        self.max_chars = max_chars
        self.max_items = MAX_ITEMS
        self.max_bytes = max_bytes
        self._process = psutil.Process()
        self.start(seconds, max_chars, max_bytes)

    def start(self, seconds: float, max_chars: int, max_bytes: int) -> None:
        """A new render: its clock, output limit and memory allowance start now."""
        self.seconds, self.max_chars, self.max_bytes = seconds, max_chars, max_bytes
        now = time.monotonic()
        self.deadline = now + seconds
        self._rss0 = self._process.memory_info().rss
        self._next_memory_check = now + _MEMORY_CHECK_S

    def tick(self) -> None:
        now = time.monotonic()
        if now > self.deadline:
            raise Limit(f"it ran for more than {self.seconds:g} s")
        if now >= self._next_memory_check:
            self._next_memory_check = now + _MEMORY_CHECK_S
            grown = self._process.memory_info().rss - self._rss0
            if grown > self.max_bytes:
                raise Limit(f"it took more than {self.max_bytes // 2**20} MiB of memory")

    def size(self, n: int, what: str) -> None:
        if n > self.max_chars:
            raise Limit(f"{what} would make {n:,} characters (the limit is {self.max_chars:,})")

    def items(self, n: int, what: str) -> None:
        if n > self.max_items:
            raise Limit(f"{what} would make {n:,} items (the limit is {self.max_items:,})")

    def ints(self, args: Any, kwargs: dict[str, Any]) -> None:
        for v in (*args, *kwargs.values()):
            if isinstance(v, int) and not isinstance(v, bool) and abs(v) > self.max_chars:
                raise Limit(f"an argument of {v} is past the output limit")

    def result(self, out: Any, what: str) -> None:
        if isinstance(out, str):
            self.size(len(out), what)
        elif isinstance(out, (list, tuple, dict, set)):
            self.items(len(out), what)

    # -- operators ----------------------------------------------------------------------
    def binop(self, operator: str, left: Any, right: Any) -> None:
        """Refuse ``left operator right`` before it runs if it would be too large."""
        if operator == "**" and isinstance(left, int) and isinstance(right, int):
            if right > 0 and abs(left) > 1 and right * max(abs(left).bit_length(), 1) > _MAX_INT_BITS:
                raise Limit(f"the power {left} ** {right} is too large")
        if operator == "*":
            for seq, n in ((left, right), (right, left)):
                if isinstance(seq, (str, list, tuple)) and isinstance(n, int):
                    self._grow(seq, len(seq) * max(n, 0), "repeating a string or list")
        if operator == "+" and isinstance(left, (str, list, tuple)) and isinstance(right, (str, list, tuple)):
            self._grow(left, len(left) + len(right), "a concatenation")
        if operator == "%" and isinstance(left, str):
            self.size(len(left) + _percent_width(left, right) + _text_size(right), "% formatting")

    def concat(self, parts: tuple[Any, ...]) -> str:
        """Jinja's ``~``: the joined length is checked before it is made."""
        texts = [p if isinstance(p, str) else str(p) for p in parts]
        self.size(sum(len(t) for t in texts), "a ~ concatenation")
        return "".join(texts)

    def _grow(self, seq: Any, n: int, what: str) -> None:
        if isinstance(seq, str):
            self.size(n, what)
        else:
            self.items(n, what)

    # -- calls and filters --------------------------------------------------------------
    def call(self, obj: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A string method whose result may be far larger than its inputs; a list grown past ``max_items``."""
        obj = getattr(obj, "__wrapped__", obj)  # the sandbox wraps str.format
        owner = getattr(obj, "__self__", None)
        if isinstance(owner, list) and getattr(obj, "__name__", "") == "append":
            self.items(len(owner) + 1, "list.append")
        if isinstance(owner, str):
            self._str_method(owner, getattr(obj, "__name__", ""), args, kwargs)

    def _str_method(self, s: str, name: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            self.size(_replaced(s, args[0], args[1], args[2] if len(args) > 2 else -1), "str.replace")
        elif name == "join" and args:
            self.size(_joined(s, args[0]), "str.join")
        elif name in ("format", "format_map"):
            self.size(len(s) + _format_width(s) + _text_size(args) + _text_size(kwargs), "str.format")
        elif name == "expandtabs":
            tab = args[0] if args else kwargs.get("tabsize", 8)
            if isinstance(tab, int):
                self.size(len(s) + s.count("\t") * max(tab, 0), "str.expandtabs")

    def filter(self, name: str, value: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
        """A filter whose result may be far larger than its inputs, or a list too long."""
        if name in _LIST_MAKERS and isinstance(value, Sized) and not (isinstance(value, str) and name in ("reverse", "join")):
            self.items(len(value), f"the filter {name}")
        if not isinstance(value, str):
            if name == "join" and isinstance(value, Sized):
                sep = args[0] if args else kwargs.get("d", "")
                if isinstance(sep, str):
                    self.size(len(sep) * len(value), "the filter join")
            if name == "sum" and not isinstance(args[1] if len(args) > 1 else kwargs.get("start", 0), (int, float)):
                raise Limit("the filter sum may only add numbers here")
            if name == "tojson":
                indent = args[0] if args else kwargs.get("indent")
                if isinstance(indent, int) and indent > 16:
                    raise Limit(f"tojson's indent {indent} is past 16")
            return
        if name == "replace" and len(args) >= 2 and isinstance(args[0], str) and isinstance(args[1], str):
            self.size(_replaced(value, args[0], args[1], args[2] if len(args) > 2 else -1), "the filter replace")
        elif name == "indent":
            width = args[0] if args else kwargs.get("width", 4)
            per_line = len(width) if isinstance(width, str) else width if isinstance(width, int) else 0
            self.size(len(value) + (value.count("\n") + 1) * max(per_line, 0), "the filter indent")
        elif name == "wordwrap":
            width = args[0] if args else kwargs.get("width", 79)
            wrap = args[2] if len(args) > 2 else kwargs.get("wrapstring")
            if isinstance(width, int) and isinstance(wrap, str):
                self.size(len(value) + (len(value) // max(width, 1) + 1) * len(wrap), "the filter wordwrap")
        elif name == "format":
            self.size(len(value) + _percent_width(value, args or kwargs) + _text_size(args) + _text_size(kwargs), "the filter format")


def _replaced(s: str, old: str, new: str, count: Any) -> int:
    n = s.count(old) if old else len(s) + 1
    if isinstance(count, int) and count >= 0:
        n = min(n, count)
    return len(s) + n * max(len(new) - len(old), 0)


def _joined(sep: str, items: Any) -> int:
    if not isinstance(items, Sized):
        return len(sep)  # an iterator: its items are checked as they are made
    return len(sep) * max(len(items) - 1, 0) + _text_size(items)


def _text_size(x: Any) -> int:
    """The characters of the strings in ``x`` (one level deep)."""
    if isinstance(x, str):
        return len(x)
    if isinstance(x, dict):
        x = x.values()
    if isinstance(x, (list, tuple, type({}.values()))):
        return sum(len(v) for v in x if isinstance(v, str))
    return 0


def _percent_width(fmt: str, args: Any) -> int:
    """The widths and precisions ``fmt % args`` asks for; a ``*`` takes them from the arguments."""
    values = list(args) if isinstance(args, tuple) else [args]
    total = 0
    for width, precision in _PERCENT_FIELD.findall(fmt):
        for part in (width, precision):
            if part == "*":
                total += abs(values[0]) if values and isinstance(values[0], int) else 0
                values = values[1:]
            elif part:
                total += int(part)
    return total


def _format_width(fmt: str) -> int:
    """The widths and precisions in ``fmt``'s replacement fields (str.format)."""
    total = 0
    try:
        fields = list(string.Formatter().parse(fmt))
    except ValueError:
        return 0  # str.format refuses it too
    for _, _, spec, _ in fields:
        if spec:
            if "{" in spec:
                raise Limit("a nested replacement field in str.format")
            total += sum(int(n) for n in _NUMBERS.findall(spec))
    return total
