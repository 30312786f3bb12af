"""A context's thread counts, set before each decode from a ``ThreadController``
(``localllm.threads``): the engine's one ``llama_set_n_threads`` call.

llama.cpp runs a ubatch of one token on ``n_threads`` and any larger one on
``n_threads_batch`` (llama-context.cpp, ``graph_compute``), so a one-token step
sets the first and a batch step (prefill, serve's multi-sequence steps) the
second; the call only stores the two counts in the context's params, and is made
only when one changes. Without ``--threads`` the counts are chosen as the decode
goes; with it, they stay fixed.
"""

from __future__ import annotations

import llama_cpp

from localllm.engine_api import LoadConfig
from localllm.threads import ThreadController, start_threads
from localllm.threads.others import other_cores


def controller_for(config: LoadConfig) -> ThreadController:
    """Fixed at ``config.n_threads`` when set; else adaptive from this machine's
    fast cores (``threads.topology``), told when other programs free a core
    (``threads.others.other_cores``)."""
    start = start_threads()
    if config.n_threads:
        return ThreadController(config.n_threads, hi=max(config.n_threads, start.ceiling), fixed=True, why="fixed by the caller")
    return ThreadController(start.threads, hi=start.ceiling, why=start.why + (f"; {start.note}" if start.note else ""), others=other_cores())


def start_count(config: LoadConfig) -> int:
    """The count a context is created with: ``--threads`` or the topology's start."""
    return config.n_threads or start_threads().threads


class Steered:
    """The thread counts of one context, steered step by step (one engine thread calls it)."""

    def __init__(self, ctx: object, controller: ThreadController, n_threads: int, n_threads_batch: int) -> None:
        self.ctx = ctx
        self.controller = controller
        self._set = (n_threads, n_threads_batch)

    def before(self, kind: str, size: int) -> int:
        """Set the count for a step of ``kind`` with ``size`` tokens; returns it."""
        n = self.controller.choose(kind, size)
        want = (n, self._set[1]) if size <= 1 else (self._set[0], n)
        if want != self._set:
            llama_cpp.llama_set_n_threads(self.ctx, want[0], want[1])
            self._set = want
        return n

    def after(self, kind: str, size: int, n: int, ns: int) -> None:
        self.controller.observe(kind, size, n, ns)
