"""The garbage collector's generations, settled after each model load.

Measured while a reply streamed: a full collection took 75 ms on the UI thread,
holding the GIL while the engine thread waited to sample the next token. After
a load, every object alive (the screen's widgets, the model's vocabulary and chat
template, ...) is taken out of the collector's generations (``gc.freeze``), after
one collection so that no garbage is kept; collections then only walk what the
reply allocates. Before the next load they are given back (``thaw``).
"""

from __future__ import annotations

import gc


class Heap:
    """Whether this program froze the heap, so that only its own freeze is undone."""

    def __init__(self) -> None:
        self.frozen = False  # settle froze the heap, and nothing has unfrozen it since

    def settle(self) -> None:
        gc.collect()
        gc.freeze()
        self.frozen = True

    def thaw(self) -> None:
        """Undo ``settle``, if it ran: ``gc.unfreeze`` is the whole process's, and a
        heap this program never froze (a program embedding it froze its own) stays as it is."""
        if self.frozen:
            gc.unfreeze()
            self.frozen = False
