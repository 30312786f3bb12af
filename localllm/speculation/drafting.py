"""One sequence's draftless speculation: the n-gram index over what its context
holds and its reply so far, and the controller that says when to draft. The
engine's generation loop (one sequence) and serve's scheduler (one per slot)
each hold one per reply."""

from __future__ import annotations

from collections.abc import Sequence

from localllm.speculation.control import K_START, Controller
from localllm.speculation.ngram import NgramIndex


class Drafting:
    def __init__(self, seen: Sequence[int], mode: str, k_max: int) -> None:
        self.index = NgramIndex(seen)
        self.ctl = Controller(mode, k_max=k_max)

    def seen(self, token: int) -> None:
        """A token of the reply, as it is given."""
        self.index.add(token)
        self.ctl.observed(token)

    def draft(self, *limits: int | None) -> list[int]:
        """The tokens to verify with the next one (none: decode it alone), at most each of
        ``limits`` (None: no limit): the reply's room, the cache's free cells, a step's rows."""
        want = self.ctl.wants()
        if not want:
            self.ctl.shadow(self.index.draft(K_START))
            return []
        return self.index.draft(min([want, *(x for x in limits if x is not None)]))
