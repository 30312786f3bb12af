"""Compaction: a long conversation's older turns replaced by a summary that the
loaded model writes itself, as an alternative to the sliding window.

The sliding window (``chat.session``) drops the oldest turns when the context
fills, and with them whatever was said there. Compaction keeps the system
prompt and the last turns whole and puts, in place of the turns before them,
one message holding a summary written by the same model through its own chat
template. ``rule`` says when (a fraction of the context), ``split`` which
messages, ``request`` how the summary is asked for, and ``conversation`` does
it to a ``ChatSession`` and measures it. Pure Python over the ``Engine``
protocol: the scripted fake drives it in the tests as llama.cpp does in the
product. This module re-exports the light parts only (the flags read ``rule``
at start-up); the chat's is ``localllm.compaction.conversation``.
"""

from localllm.compaction.rule import COCKPIT_AT, KEEP_TURNS, parse_fraction, should_compact, summary_tokens
from localllm.compaction.split import Split, compactable, split

__all__ = ["COCKPIT_AT", "KEEP_TURNS", "Split", "compactable", "parse_fraction", "should_compact", "split", "summary_tokens"]
