"""What the cockpit's session tells its screen from its own threads.

The engine thread (a reply's tokens, a long prefill's progress, a kept KV cache
loaded), the disk thread (saving failed, or works again) and llama.cpp's aborting
thread (the engine is lost) cannot call the screen: they hand one of these to
the session's ``emit``, which the front end sets (the Textual cockpit posts each
as a message to its UI thread). Plain data, so the session needs no Textual.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.engine_api import GenerationStats, SpecStats


@dataclass(frozen=True)
class Tokens:
    """A batch of a reply's tokens: their text, each one's time, when the reply
    was sent (``start_ns``) and when its first text came (``first_text_ns``)."""

    text: str
    stamps: list[int]
    start_ns: int
    first_text_ns: int | None
    pieces: tuple[str, ...] = ()


@dataclass(frozen=True)
class ReplyEnded:
    """A reply ended: its stats (None after an error), whether it was stopped, the error (one line)."""

    stats: GenerationStats | None
    stopped: bool
    error: str | None
    spec: SpecStats | None = None  # draftless speculation's count (None: it did not run)


@dataclass(frozen=True)
class Progress:
    """The engine read ``done`` of the prompt's ``total`` tokens (at ``t_ns``): a long prefill's progress."""

    done: int
    total: int
    t_ns: int


@dataclass(frozen=True)
class SaveState:
    """The disk thread could not write the session (the reason, one line), or
    (None) it could again after failing."""

    text: str | None


@dataclass(frozen=True)
class Resumed:
    """A reopened conversation's kept KV cache was loaded (``text`` None), or why it was not."""

    text: str | None
    images: int


@dataclass(frozen=True)
class EngineLost:
    """llama.cpp aborted (a worker that stopped answering): the thread that was
    running it is held by llama.cpp for good, and so is the model."""

    text: str
