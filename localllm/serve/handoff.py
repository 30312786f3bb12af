"""The engine thread's hand-off to the event loop: one wake-up per burst, not per token.

The scheduler emits each sequence's text as it samples it, from its own
thread; ``loop.call_soon_threadsafe`` per emit writes the loop's self-pipe and
wakes it once for every token of every sequence (8 wake-ups per step at 8
clients). The outbox queues the items and wakes the loop only when none is
pending: the emits of one step (and any made while the loop was busy) are
delivered by one callback, in order. The loop's thread shares the cores with
llama.cpp's decode threads, so what it saves goes to decode.
"""

from __future__ import annotations

import asyncio
import threading
import weakref

_OUTBOXES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, Outbox] = weakref.WeakKeyDictionary()
_LOCK = threading.Lock()
_HELD: set[int] = set()  # threads whose posts wait for ``flush`` (the engine thread: ENGINE.engine_thread)


class Outbox:
    """Items for asyncio queues of one loop, posted from any thread."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self._loop = weakref.ref(loop)  # not a strong one: the table of outboxes is keyed weakly by the loop
        self._items: list[tuple[asyncio.Queue, object]] = []
        self._lock = threading.Lock()
        self._pending = False  # a drain is scheduled and has not taken the items yet

    def post(self, queue: asyncio.Queue, item: object) -> None:
        with self._lock:
            self._items.append((queue, item))
            if self._pending or threading.get_ident() in _HELD:
                return
            self._pending = True
        self._wake()

    def flush(self) -> None:
        """Wake the loop for what was posted and is not yet on its way."""
        with self._lock:
            if self._pending or not self._items:
                return
            self._pending = True
        self._wake()

    def _wake(self) -> None:
        loop = self._loop()
        try:
            if loop is not None:
                loop.call_soon_threadsafe(self._drain)
        except RuntimeError:  # the loop is closed: the server is gone
            pass

    def _drain(self) -> None:
        with self._lock:
            items, self._items, self._pending = self._items, [], False
        for queue, item in items:
            queue.put_nowait(item)


def outbox(loop: asyncio.AbstractEventLoop) -> Outbox:
    """The loop's outbox (one per loop, made on first use)."""
    with _LOCK:
        box = _OUTBOXES.get(loop)
        if box is None:
            box = _OUTBOXES[loop] = Outbox(loop)
        return box


class _Engine:
    """The scheduler's ``Handoff``: the engine thread's posts are held, then let go
    just before each ``llama_decode`` (which runs without the GIL for the whole
    step) and when the engine idles. Woken at each post, the event loop took the
    GIL in the engine's gap between decodes instead: py-spy found the engine
    waiting for it 3.6% of its time at 8 clients on 2 threads."""

    def engine_thread(self, on: bool) -> None:
        """Hold (``on``) or stop holding the calling thread's posts."""
        (_HELD.add if on else _HELD.discard)(threading.get_ident())

    def flush(self) -> None:
        with _LOCK:
            boxes = list(_OUTBOXES.values())
        for box in boxes:
            box.flush()


ENGINE = _Engine()
