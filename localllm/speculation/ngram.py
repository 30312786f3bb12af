"""The n-gram drafter: where the last few tokens occurred before, what followed.

An index from each n-gram (n in ``SIZES``) to where it last
ended, kept up to date a token at a time (a dict update per n), so a draft
costs a few lookups however long the conversation is; the longest n-gram of
the tail seen before wins, and its continuation is the draft (llama.cpp's
prompt-lookup and ngram-mod drafters do the same over token ids).

An n-gram is keyed by a 64-bit polynomial hash of its tokens, not a tuple of
them: a prompt is indexed in bulk with numpy, and a token added rolls each hash
on (a 13,319-token Claude Code request: 50.3 ms as tuples, 10.6 ms hashed,
docs/benchmarks.md; paid before each request's first token, on serve's scheduler
thread). Two n-grams that share a hash (about one chance in 2**64 a pair) only
make a wrong draft, which verification rejects.
"""

from __future__ import annotations

from collections.abc import Sequence

# Short n-grams find a quote soon after it starts; long ones tell apart the places a short one
# recurs (text that repeats phrases: "a batch of rows costs more ..., a batch of rows costs less ...",
# where the last "a batch of rows" is the wrong one to follow). llama.cpp's ngram-mod matches 24.
SIZES = (2, 3, 4, 8, 16)


_MASK = (1 << 64) - 1
_BASE = 0x100000001B3  # FNV-1's 64-bit prime: odd, so no power of it wipes a token out mod 2**64
BULK = 256  # tokens from which numpy indexes faster than the loop (its set-up is ~0.1 ms)


class NgramIndex:
    """The tokens so far (the prompt, then the reply) and their n-grams."""

    def __init__(self, tokens: Sequence[int] = (), *, sizes: Sequence[int] = SIZES) -> None:
        self.sizes = tuple(sorted(sizes))
        self._longest_first = self.sizes[::-1]
        self.tokens: list[int] = []
        self._last: dict[int, dict[int, int]] = {n: {} for n in self.sizes}  # n -> n-gram's hash -> where it last ended
        self._prev: dict[int, int] = {}  # n -> where the tail's n-gram ended before now (absent: never)
        self._tail = dict.fromkeys(self.sizes, 0)  # n -> the hash of the last n tokens (of all, while fewer), rolled on
        self._drop = {n: pow(_BASE, n, 1 << 64) for n in self.sizes}  # what the token n back weighs, to roll it off
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        if len(tokens) >= BULK:
            self._bulk(tokens[:-1])
            tokens = tokens[-1:]  # the last one as a token given: where the tail's n-grams ended before
        for t in tokens:
            self.add(t)

    def _bulk(self, tokens: Sequence[int]) -> None:
        """Index ``tokens`` after those already here, all at once: each n-gram's hash
        for every end position in a few array operations, then one dict update per n
        (a later end overwrites an earlier one, as ``add`` does)."""
        import numpy as np  # lazy: 0.09-0.11 s measured, and --help imports this package (the commands name its modes)

        start = len(self.tokens)
        self.tokens.extend(tokens)
        longest = self.sizes[-1]
        ids = np.asarray(self.tokens[max(0, start - longest + 1):], dtype=np.uint64)
        offset = len(self.tokens) - len(ids)  # where ids begins in the tokens
        with np.errstate(over="ignore"):  # the hash is taken mod 2**64: wrapping is the point
            h = np.zeros(len(ids), dtype=np.uint64)  # h[e]: the hash of the n tokens ending at e, n growing
            grown = 0
            for n in self.sizes:
                for j in range(grown, n):  # add the token j back from each end, times BASE**j
                    h[j:] += ids[: len(ids) - j] * np.uint64(pow(_BASE, j, 1 << 64))
                grown = n
                self._tail[n] = int(h[-1])
                first = max(n - 1, start - offset)  # ends already indexed are left as they are
                if first < len(ids):
                    self._last[n].update(zip(h[first:].tolist(), range(offset + first, offset + len(ids))))
        self._prev.clear()

    def add(self, token: int) -> None:
        j = len(self.tokens)
        self.tokens.append(token)
        self._prev.clear()
        for n in self.sizes:
            key = (self._tail[n] * _BASE + token - (self.tokens[j - n] * self._drop[n] if j >= n else 0)) & _MASK
            self._tail[n] = key
            if j + 1 < n:
                continue
            last = self._last[n]
            before = last.get(key)
            if before is not None:
                self._prev[n] = before
            last[key] = j

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
            self.tokens, self._last, self._prev = [], {k: {} for k in self.sizes}, {}
            self._tail = dict.fromkeys(self.sizes, 0)
            self.extend(kept)
