"""The n-gram drafter: where the last few tokens occurred before, what followed.

An index from each n-gram (n from ``n_min`` to ``n_max``) to where it last
ended, kept up to date a token at a time (a dict update per n), so a draft
costs a few lookups however long the conversation is; the longest n-gram of
the tail seen before wins, and its continuation is the draft (llama.cpp's
prompt-lookup and ngram-mod drafters do the same over token ids).
"""

from __future__ import annotations

from collections.abc import Sequence


class NgramIndex:
    """The tokens so far (the prompt, then the reply) and their n-grams."""

    def __init__(self, tokens: Sequence[int] = (), *, n_min: int = 2, n_max: int = 4) -> None:
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self._last: dict[tuple[int, ...], int] = {}  # n-gram -> the index of its last token, where it last ended
        self._prev: dict[int, int] = {}  # n -> where the tail's n-gram ended before now (absent: never)
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for t in tokens:
            self.add(t)

    def add(self, token: int) -> None:
        self.tokens.append(token)
        j = len(self.tokens) - 1
        self._prev.clear()
        for n in range(self.n_min, self.n_max + 1):
            if j + 1 < n:
                break
            key = tuple(self.tokens[j - n + 1: j + 1])
            before = self._last.get(key)
            if before is not None:
                self._prev[n] = before
            self._last[key] = j

    def draft(self, k: int) -> list[int]:
        """Up to ``k`` tokens that followed the longest earlier occurrence of the tail."""
        if k <= 0:
            return []
        for n in range(self.n_max, self.n_min - 1, -1):
            at = self._prev.get(n)
            if at is not None:
                # what followed, and where that runs into the tail itself (a loop of period p: the
                # tail's match ends p tokens back), the same rule drafting on: the tokens cycle
                period = len(self.tokens) - 1 - at
                return [self.tokens[at + 1 + i % period] for i in range(k)] if at + 1 + k > len(self.tokens) else self.tokens[at + 1: at + 1 + k]
        return []

    def truncate(self, n: int) -> None:
        """Forget all but the first ``n`` tokens (a conversation rewound): rebuilt, rare."""
        if n < len(self.tokens):
            kept = self.tokens[:n]
            self.tokens, self._last, self._prev = [], {}, {}
            self.extend(kept)
