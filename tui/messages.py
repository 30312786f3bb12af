"""The cockpit's messages: what its threads tell the UI thread.

The session's own threads speak in plain events (``localllm.cockpit.events``);
``poster`` makes each the message of its kind here, posted to the app, whose
handlers draw it. The workers of the app post the others (a load's result, a
count, a file read) with what the session answered them.
"""

from __future__ import annotations

from collections.abc import Callable

from textual.message import Message

from localllm.cockpit import events
from localllm.cockpit.attachments import Count, Pending
from localllm.cockpit.loading import LoadResult


class SessionEvent(Message):
    """An event of the session's threads, as a message (``event``)."""

    def __init__(self, event: object) -> None:
        super().__init__()
        self.event = event


class TokenBatch(SessionEvent):
    """A batch of the reply's tokens (``events.Tokens``)."""

    event: events.Tokens


class ReplyDone(SessionEvent):
    """The engine thread's last word on a reply (``events.ReplyEnded``)."""

    event: events.ReplyEnded


class PrefillProgress(SessionEvent):
    """A long prefill's progress (``events.Progress``)."""

    event: events.Progress


class SaveFailed(SessionEvent):
    """Saving failed, or works again (``events.SaveState``)."""

    event: events.SaveState


class Resumed(SessionEvent):
    """A kept KV cache loaded, or why not (``events.Resumed``)."""

    event: events.Resumed


class EngineLost(SessionEvent):
    """llama.cpp aborted: the engine thread and its model are gone (``events.EngineLost``)."""

    event: events.EngineLost


KINDS: dict[type, type[SessionEvent]] = {events.Tokens: TokenBatch, events.ReplyEnded: ReplyDone, events.Progress: PrefillProgress,
                                  events.SaveState: SaveFailed, events.Resumed: Resumed, events.EngineLost: EngineLost}


def poster(post: Callable[[Message], object]) -> Callable[[object], None]:
    """The session's ``emit`` for an app: each event posted (``post``, thread-safe) as its message."""

    def emit(event: object) -> None:
        post(KINDS[type(event)](event))

    return emit


class ModelLoaded(Message):
    """The engine thread's answer to a load request (``LoadResult``)."""

    def __init__(self, result: LoadResult) -> None:
        super().__init__()
        self.result = result


class StarvedAdvice(Message):
    """Decode was starved of CPU: the line that says so, with the fix."""

    def __init__(self, text: str) -> None:
        super().__init__()
        self.text = text


class AttachRead(Message):
    """A file read to attach (off the UI thread), its tokens counted or not yet; or the line refusing it."""

    def __init__(self, pending: Pending | None, error: str | None = None) -> None:
        super().__init__()
        self.pending, self.error = pending, error


class Counted(Message):
    """The next message's tokens, counted on the engine thread (None: the count failed)."""

    def __init__(self, count: Count | None, key: tuple) -> None:
        super().__init__()
        self.count, self.key = count, key
