"""Which messages a compaction summarizes: all but the system prompt and the
last turns.

A turn starts at a user's message and runs to the next one (the reply, and any
tool calls and results between), so a kept turn is never cut between a tool
call and its result, and the kept part always opens with a user's message,
which every chat template accepts after the system prompt and the summary. An
earlier compaction's summary is no turn: it is folded into the next summary.
"""

from __future__ import annotations

from dataclasses import dataclass

SUMMARY_LABEL = "Summary of the earlier conversation: "  # how a compaction's message starts (request.py reads it back)


def is_summary(message: dict[str, str]) -> bool:
    """A compaction's own message: folded into the next summary, never a turn of its own."""
    return str(message.get("content") or "").startswith(SUMMARY_LABEL)


@dataclass(frozen=True)
class Split:
    """A conversation in three parts: ``head`` (the system prompt, if any),
    ``older`` (summarized) and ``kept`` (the last turns, whole)."""

    head: list[dict[str, str]]
    older: list[dict[str, str]]
    kept: list[dict[str, str]]


def split(messages: list[dict[str, str]], keep_turns: int) -> Split:
    """``messages`` split for a compaction keeping the last ``keep_turns`` turns."""
    head = messages[:1] if messages and messages[0].get("role") == "system" and not is_summary(messages[0]) else []
    rest = messages[len(head):]
    starts = [i for i, m in enumerate(rest) if m.get("role") == "user" and not is_summary(m)]
    # fewer turns than asked for: all of them kept; before the first, only an earlier summary
    cut = starts[-min(keep_turns, len(starts))] if keep_turns > 0 and starts else len(rest)
    return Split(list(head), list(rest[:cut]), list(rest[cut:]))


def compactable(messages: list[dict[str, str]], keep_turns: int) -> bool:
    """Whether there is a turn before the kept ones to summarize (an earlier
    summary alone is not summarized again)."""
    return any(not is_summary(m) for m in split(messages, keep_turns).older)
