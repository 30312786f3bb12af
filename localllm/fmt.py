"""Human-readable numbers for the CLI and the TUI, and names made safe to print."""

from __future__ import annotations

import json
import sys
from typing import Any, Sequence

from localllm.units import format_size


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


def table(head: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    """Left-aligned columns two spaces apart; the last column is not padded
    (it may be a long path)."""
    all_rows = [[safe(c) for c in head], *[[safe(c) for c in r] for r in rows]]
    widths = [max(len(r[i]) for r in all_rows) for i in range(len(head) - 1)]
    return "\n".join(("  ".join(c.ljust(w) for c, w in zip(r[:-1], widths)) + "  " + r[-1]).rstrip() for r in all_rows)


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, indent=2, default=str)
    sys.stdout.write("\n")
