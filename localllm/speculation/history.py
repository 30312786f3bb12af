"""The replies this model gave before, as a second source of drafts.

llama.cpp's ngram-mod keeps one n-gram pool for all sequences and requests
(``common/speculative.cpp``: "shared across all sequences", reset only when a
quarter full), so a reply written again to the same request (an agent's retry,
a question asked twice, a benchmark's repetitions) is drafted from its first
tokens on. Here the same case is kept without a pool's ambiguity: the recent
replies with the prompt's end they followed; a request that ends the same way
drafts a reply's next tokens for as long as its own reply has been that reply
word for word. One per loaded model (the engine) and one for serve's slots.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

KEEP = 8  # replies remembered
CAP = 4_096  # tokens kept of each
FIRST = 12  # what matching the prompt's end counts for (drafting.RUN_MIN: enough to draft on)
TAIL = 32  # tokens of the prompt's end a reply is filed under (its generation prompt and what came before)


class Replies:
    """The last ``KEEP`` replies, each filed under the ``TAIL`` prompt tokens before it (an exact
    key, not n-grams: a cockpit's regenerate costs at most one short rejected draft)."""

    def __init__(self, keep: int = KEEP) -> None:
        self._items: deque[tuple[tuple[int, ...], list[int]]] = deque(maxlen=keep)

    def add(self, prompt: Sequence[int], reply: Sequence[int]) -> None:
        if reply and len(prompt) >= TAIL:  # a shorter prompt is no key: it would never be looked up
            self._items.appendleft((tuple(prompt[-TAIL:]), list(reply[:CAP])))

    def after(self, prompt: Sequence[int]) -> list[list[int]]:
        """The replies given before to a prompt that ended as ``prompt`` does, newest first."""
        tail = tuple(prompt[-TAIL:])
        return [reply for end, reply in self._items if end == tail] if len(tail) == TAIL else []


class Replay:
    """One request's view: the earlier replies its own reply has matched so far, token for token."""

    def __init__(self, replies: Replies | None, prompt: Sequence[int]) -> None:
        self.replies, self.prompt = replies, list(prompt[-TAIL:])
        self._left = replies.after(prompt) if replies is not None else []
        self.given: list[int] = []

    def seen(self, token: int) -> None:
        n = len(self.given)
        self.given.append(token)
        if self._left:
            self._left = [r for r in self._left if len(r) > n and r[n] == token]

    def run(self) -> int:
        """How far the match goes back, as a quote's run: the reply so far, and the prompt's end counted
        as ``FIRST`` (0: no earlier reply matches). So a repeated request's first draft is ``FIRST``
        tokens, not the longest: a seeded reply sampled again parts from the earlier one somewhere, and
        the draft that meets that place is paid for whole."""
        return FIRST + len(self.given) if self._left else 0

    def draft(self, k: int) -> list[int]:
        n = len(self.given)
        return self._left[0][n:n + k] if self._left else []

    def finish(self) -> None:
        if self.replies is not None:
            self.replies.add(self.prompt, self.given)
