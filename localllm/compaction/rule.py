"""When to compact, and how much room a summary gets.

Compaction runs between turns, not in the middle of a reply: at a fraction of
the context (the cockpit's 85% by default) there is still room for the next
message and its reply, so the sliding window is only the net for a reply that
outgrows what is left.
"""

from __future__ import annotations

import math

COCKPIT_AT = 0.85  # the cockpit's default: room left for a message and its reply before the window would slide
KEEP_TURNS = 2  # the last exchanges kept word for word: what the next reply most likely refers to
MIN_SUMMARY, MAX_SUMMARY = 32, 512  # a summary's token bound, whatever the context


def should_compact(used: int, n_ctx: int, threshold: float | None) -> bool:
    """Whether ``used`` tokens of an ``n_ctx`` context reach ``threshold`` (a
    fraction, 0 < t <= 1); None is off, and so is an unknown context (0)."""
    if threshold is None or n_ctx <= 0:
        return False
    return used >= threshold * n_ctx


def summary_tokens(n_ctx: int) -> int:
    """The summary's bound: an eighth of the context (256 tokens of 2,048), so the
    compacted conversation leaves most of the context to what comes next."""
    return max(MIN_SUMMARY, min(MAX_SUMMARY, n_ctx // 8))


def parse_fraction(text: str) -> float | None:
    """A ``--compact-at`` value: a fraction of the context above 0 and at most 1
    (``0.85``), a percentage (``85%``), or ``off`` (None). Raises ValueError with
    the line to show (the flags wrap it for argparse)."""
    t = str(text).strip().lower()
    if t in ("off", "none", "no", "false"):
        return None
    percent = t.endswith("%")
    try:
        value = float(t[:-1] if percent else t)
    except ValueError:
        raise ValueError(f"'{text}' is not a fraction of the context: give e.g. 0.85, 85% or off") from None
    if percent:
        value /= 100
    if not math.isfinite(value) or not 0 < value <= 1:
        raise ValueError(f"the fraction of the context must be above 0 and at most 1 (or 85%, or off), got {text}")
    return value
