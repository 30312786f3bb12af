"""Ollama's ``keep_alive``: how long a model stays loaded after a request.

Ollama reads a number as seconds and a string as Go's ``time.ParseDuration``
(``"5m"``, ``"1h30m"``, ``"300ms"``); a negative value means "never unload" and
zero "unload right after the reply". Clients also send numbers as strings
(``"0"``, ``"-1"``), which Go would refuse; they are read as seconds here
rather than answered with a 400 that would only surprise the user.

``None`` stands for "never" throughout the router: no expiry.
"""

from __future__ import annotations

import math
import re

_UNIT_S = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "μs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|μs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?(\d+(?:\.\d*)?|\.\d+)")
MAX_S = 10 * 365 * 24 * 3600.0  # ten years: longer is "never" in practice, and keeps every sum finite


class BadDuration(ValueError):
    """A ``keep_alive`` that is neither a number nor a Go duration."""


def parse(value: object) -> float | None:
    """Seconds to stay loaded (0: unload now), or None for never. Raises
    ``BadDuration`` naming what was expected."""
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise BadDuration(f"a duration is a number of seconds or a string such as \"5m\", not {type(value).__name__}")
    if isinstance(value, (int, float)):
        seconds = float(value)
    else:
        seconds = _from_text(value.strip())
    if math.isnan(seconds):
        raise BadDuration("a duration cannot be NaN")
    if seconds < 0 or seconds > MAX_S:
        return None
    return seconds


def _from_text(text: str) -> float:
    if len(text) > 64:
        raise BadDuration("a duration has at most 64 characters")
    if _NUMBER.fullmatch(text):
        return float(text)
    sign = -1.0 if text.startswith("-") else 1.0
    body = text.lstrip("+-")
    pos, total = 0, 0.0
    for m in _PART.finditer(body):
        if m.start() != pos:
            break
        total += float(m.group(1)) * _UNIT_S[m.group(2)]
        pos = m.end()
    if not body or pos != len(body):
        raise BadDuration(f"'{text[:64]}' is not a duration: use seconds (300), or e.g. \"30s\", \"5m\", \"1h30m\"; -1 never unloads")
    return sign * total


def shown(seconds: float | None) -> str:
    """A duration for the log: ``never``, ``0 s``, ``90 s``, ``5 min``, ``2.0 h``."""
    if seconds is None:
        return "never"
    if seconds < 120:
        return f"{seconds:g} s"
    if seconds < 7200:
        return f"{seconds / 60:g} min"
    return f"{seconds / 3600:.1f} h"
