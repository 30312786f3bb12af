"""Human-readable numbers for the CLI and the TUI, and names made safe to print."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterable, Sequence
from typing import Any

from localllm.util.units import format_size


def safe(text: object) -> str:
    """``text`` with every non-printable character escaped (``\\n``, ``\\x1b``,
    ``\\u202e``, ...): names, paths and metadata come from files and servers, and
    a raw newline or escape sequence in one could forge or hide a line on the
    user's terminal. Undecodable bytes of a file name (surrogates) are escaped too."""
    s = str(text)
    if s.isprintable():
        return s
    out = []
    for ch in s:
        if ch.isprintable():
            out.append(ch)
        elif ch in _NAMED:
            out.append(_NAMED[ch])
        else:
            o = ord(ch)
            out.append(f"\\x{o:02x}" if o < 0x100 else f"\\u{o:04x}" if o < 0x10000 else f"\\U{o:08x}")
    return "".join(out)


_NAMED = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def size(n: float) -> str:
    """Bytes in binary units, as llama.cpp prints them (MiB, GiB), or in the
    unit the user typed (``units.Size``): ``units.format_size``."""
    return format_size(n)


def count(n: float) -> str:
    for unit, div in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if n >= div:
            return f"{n / div:.2f}{unit}"
    return str(int(n))


NA = "n/a"


def ms(x: float | None) -> str:
    """Milliseconds; "n/a" for a figure that was not measured."""
    if x is None:
        return NA
    return f"{x / 1000:.2f} s" if x >= 10_000 else f"{x:.2f} ms"


def num(x: float | None, digits: int = 2, unit: str = "") -> str:
    """A number with ``digits`` decimals and a unit; "n/a" when not measured."""
    return NA if x is None else f"{x:.{digits}f}{unit}"


def mean_pm(m: float | None, s: float | None, digits: int = 2) -> str:
    """``m ± s`` as llama-bench prints it; the spread of one run is "n/a"."""
    return f"{num(m, digits)} ± {num(s, digits)}"


def table(head: Sequence[str], rows: Sequence[Sequence[str]], right: Iterable[int] = ()) -> str:
    """Columns two spaces apart, laid out by rich, which measures terminal cells:
    a CJK name (two cells a character) or a combining accent (none) keeps the
    columns aligned, where ``len()`` padding did not. Columns listed in
    ``right`` are right-aligned; the last column is not padded (it may be a long
    path). Plain text, no colour: it goes to pipes and files as it is."""
    from io import StringIO

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    right = set(right)
    t = Table(box=None, show_edge=False, pad_edge=False, padding=(0, 1), header_style="")
    for i in range(len(head)):
        t.add_column(Text(safe(head[i])), justify="right" if i in right else "left", no_wrap=True)
    for r in rows:
        t.add_row(*(Text(safe(c)) for c in r))
    out = StringIO()
    Console(file=out, width=1_000_000, color_system=None, highlight=False, emoji=False, markup=False, legacy_windows=False).print(t)
    return "\n".join(line.rstrip() for line in out.getvalue().splitlines())


def short_path(path: str, width: int) -> str:
    """``path`` in at most ``width`` characters: the home folder as ``~``, then an
    ellipsis in place of the start, so the file name stays whole."""
    import os

    home = os.path.expanduser("~")
    if home not in ("~", "/") and (path == home or path.startswith(home + os.sep)):
        path = "~" + path[len(home):]
    if len(path) <= width:
        return path
    return "…" + path[-(max(width, 2) - 1):]


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
