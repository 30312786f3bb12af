"""Sizes in bytes: one parser and one formatter, with explicit units.

Decimal and binary units are both accepted and never confused: ``GB`` is 10⁹
bytes, ``GiB`` is 2³⁰ (likewise kB/KB/KiB, MB/MiB, TB/TiB; a single letter
``k``, ``M``, ``G``, ``T`` is the decimal unit; ``B`` is bytes). A bare number
is GiB, the unit GPU memory is sold and reported in (``--vram 4`` = 4 GiB).
Case does not matter. A size the user typed keeps its unit (``Size.unit``) and
is shown in it; every other size is shown in binary units, as llama.cpp prints
them (KiB, MiB, GiB).
"""

from __future__ import annotations

import re

from localllm.errors import UsageError

KB, MB, GB, TB = 10**3, 10**6, 10**9, 10**12
KiB, MiB, GiB, TiB = 2**10, 2**20, 2**30, 2**40

# spelling -> (bytes, the name shown)
_UNITS: dict[str, tuple[int, str]] = {
    "b": (1, "B"),
    "k": (KB, "kB"), "kb": (KB, "kB"), "kib": (KiB, "KiB"),
    "m": (MB, "MB"), "mb": (MB, "MB"), "mib": (MiB, "MiB"),
    "g": (GB, "GB"), "gb": (GB, "GB"), "gib": (GiB, "GiB"),
    "t": (TB, "TB"), "tb": (TB, "TB"), "tib": (TiB, "TiB"),
}
_BY_NAME = {name: n for n, name in _UNITS.values()}
BARE_UNIT = "GiB"


class Size(int):
    """A number of bytes that remembers the unit it was written in."""

    unit: str

    def __new__(cls, n: int, unit: str = BARE_UNIT) -> Size:
        obj = super().__new__(cls, n)
        obj.unit = unit
        return obj


def parse_size(text: str) -> Size:
    """'4GiB' -> 4·2³⁰, '6GB' -> 6·10⁹, '512MiB', '1.5 GiB', '4' (GiB).
    Raises UsageError, naming the accepted forms, on anything else."""
    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", text)
    key = m.group(2).lower() if m else ""
    if not m or (key and key not in _UNITS):
        raise UsageError(f"'{text}' is not a size: use e.g. 4GiB (4·2³⁰ bytes), 6GB (6·10⁹ bytes) or 512MiB")
    per, unit = _UNITS[key] if key else (GiB, BARE_UNIT)
    value = float(m.group(1)) * per
    if value < 1:
        raise UsageError(f"a size must be more than 0, got '{text}'")
    return Size(int(value), unit)


def format_size(n: float, unit: str | None = None, digits: int = 2) -> str:
    """``n`` bytes in ``unit`` (one of B, kB, KiB, MB, MiB, GB, GiB, TB, TiB);
    without one, in the unit a ``Size`` was typed in (plain bytes excepted),
    else the largest binary unit that keeps the number at 1 or more."""
    if unit is None:
        unit = getattr(n, "unit", None)
        unit = None if unit == "B" else unit  # a count of bytes typed as such reads better scaled
    if unit is None:
        unit = next((u for u, per in (("TiB", TiB), ("GiB", GiB), ("MiB", MiB), ("KiB", KiB)) if abs(n) >= per), "B")
    if unit == "B":
        return f"{int(n)} B"
    return f"{n / _BY_NAME[unit]:.{digits}f} {unit}"
