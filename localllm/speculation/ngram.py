"""The n-gram drafter: where the last few tokens occurred before, what followed.

An index from each n-gram (n in ``SIZES``) to where it last
ended, kept up to date a token at a time (a dict update per n), so a draft
costs a few lookups however long the conversation is; the longest n-gram of
the tail seen before wins, and its continuation is the draft (llama.cpp's
prompt-lookup and ngram-mod drafters do the same over token ids).
"""

from __future__ import annotations

from collections.abc import Sequence

# Short n-grams find a quote soon after it starts; long ones tell apart the places a short one
# recurs (text that repeats phrases: "a batch of rows costs more ..., a batch of rows costs less ...",
# where the last "a batch of rows" is the wrong one to follow). llama.cpp's ngram-mod matches 24.
SIZES = (2, 3, 4, 8, 16)


class NgramIndex:
    """The tokens so far (the prompt, then the reply) and their n-grams."""

    def __init__(self, tokens: Sequence[int] = (), *, sizes: Sequence[int] = SIZES) -> None:
        self.sizes = tuple(sorted(sizes))
        self._longest_first = self.sizes[::-1]
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
        for n in self.sizes:
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
        for n in self._longest_first:
            at = self._prev.get(n)
            if at is not None:
                # what followed, and where that runs into the tail itself (a loop of period p: the
                # tail's match ends p tokens back), the same rule drafting on: the tokens cycle
                period = len(self.tokens) - 1 - at
                return [self.tokens[at + 1 + i % period] for i in range(k)] if at + 1 + k > len(self.tokens) else self.tokens[at + 1: at + 1 + k]
        return []

    def find(self, tail: Sequence[int]) -> int | None:
        """Where the longest n-gram that ends ``tail`` (another text's) last ended here; None: nowhere."""
        for n in self._longest_first:
            if len(tail) >= n:
                at = self._last.get(tuple(tail[len(tail) - n:]))
                if at is not None:
                    return at
        return None

    def run(self, cap: int) -> int:
        """How many tokens, up to ``cap``, the tail has in common with what came before the
        longest earlier n-gram match of it, read backwards: how long the quote being followed has
        gone on (0: no match). A quote that has run n tokens is likely to run on further, which is
        why a long run earns a long draft at once instead of a ramp."""
        at = next((self._prev[n] for n in self._longest_first if n in self._prev), None)
        if at is None:
            return 0
        j, k = len(self.tokens) - 1, 0
        while k < cap and at - k >= 0 and self.tokens[at - k] == self.tokens[j - k]:
            k += 1
        return k

    def truncate(self, n: int) -> None:
        """Forget all but the first ``n`` tokens (a conversation rewound): rebuilt, rare."""
        if n < len(self.tokens):
            kept = self.tokens[:n]
            self.tokens, self._last, self._prev = [], {}, {}
            self.extend(kept)
