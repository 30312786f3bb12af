"""The one thread that makes every llama.cpp call of the cockpit.

Measured here: decoding on a second thread after llama.cpp computed on another
ran at 33 t/s instead of 93 t/s (its OpenMP thread team belongs to the first
thread). A front end's own threads (Textual's thread workers are new threads
each time) hand their work to this executor and wait.

When llama.cpp aborts (a worker over RPC that stopped answering), the thread
that was running it never comes back: ``lose`` says so to everyone waiting, and
``renew`` starts a new thread for what comes after.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from typing import Any, TypeVar

T = TypeVar("T")


def _executor() -> ThreadPoolExecutor:
    return ThreadPoolExecutor(max_workers=1, thread_name_prefix="llama")


class EngineThread:
    """The single-thread executor, and whether llama.cpp took its thread for good."""

    def __init__(self) -> None:
        self._pool = _executor()
        self._lost: Future[str] = Future()  # set when llama.cpp aborts: its thread then never answers
        self.lost_text = ""  # why, once it has happened (kept after ``renew``)

    def submit(self, fn: Callable[..., T], *args: Any) -> Future[T]:
        """Run ``fn(*args)`` on the engine thread, after what was submitted before."""
        return self._pool.submit(fn, *args)

    def wait(self, fut: Future[T], timeout: float | None = None) -> T | None:
        """The engine thread's answer, or None when llama.cpp aborted meanwhile
        (or ``timeout`` passed): its thread then never answers."""
        either: list[Future[Any]] = [fut, self._lost]
        wait(either, timeout=timeout, return_when=FIRST_COMPLETED)
        return fut.result() if fut.done() else None

    def run(self, fn: Callable[..., T], *args: Any) -> T | None:
        """``fn(*args)`` on the engine thread, waited for (``wait``): call it off the UI thread."""
        return self.wait(self.submit(fn, *args))

    def lose(self, text: str) -> bool:
        """llama.cpp aborted (on its aborting thread): True the first time (several
        workers may stop at once: one event)."""
        if self._lost.done():
            return False
        self._lost.set_result(text)
        return True

    def renew(self, text: str) -> None:
        """A new engine thread after ``lose``: the old one is held by llama.cpp, with its model."""
        old, self._pool = self._pool, _executor()
        old.shutdown(wait=False)
        self._lost = Future()
        self.lost_text = text

    def shutdown(self) -> None:
        """Wait for what was submitted, then end the thread."""
        self._pool.shutdown(wait=True)
