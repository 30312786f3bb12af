"""Idle sequences' prompts kept in RAM instead of in the KV cache (llama-server's
``--cache-ram``, tools/server/server-context.cpp).

A finished request's cells stay in the KV cache so that its next turn skips
the prompt. But every cell in use widens what each decode attends over
(llama.cpp attends over the used range, padded to 256: ``get_n_kv`` in
src/llama-kv-cache.cpp): after 8 clients, 8 idle prefixes made one client's
tokens 9% slower here (ITL 6.4 -> 7.0 ms, SmolLM2, 1 thread). llama-server
saves idle slots to RAM when a new task starts and clears them; so does the
scheduler, with this store: each entry is a prompt's tokens and llama.cpp's
sequence state for them; a new request whose prompt shares a longer prefix
with an entry than with any sequence in the cache gets that entry's state put
back.

Bounded as llama-server bounds its cache: by bytes (``--cache-ram`` MiB) and
by tokens (the KV pool's cells, so it never holds more than one cache's worth);
least recently stored goes first. Pure Python: the state is opaque bytes.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass


@dataclass(frozen=True)
class Entry:
    tokens: tuple[int, ...]
    state: bytes | bytearray


def common_prefix(a: tuple[int, ...] | list[int], b: tuple[int, ...] | list[int]) -> int:
    n = min(len(a), len(b))
    i = 0
    while i < n and a[i] == b[i]:
        i += 1
    return i


class PromptCache:
    """Entries in store order; ``max_bytes`` None: no byte limit."""

    def __init__(self, *, max_bytes: int | None, max_tokens: int) -> None:
        self.max_bytes, self.max_tokens = max_bytes, max_tokens
        self._entries: OrderedDict[tuple[int, ...], Entry] = OrderedDict()
        self.n_bytes = 0
        self.n_tokens = 0

    def __len__(self) -> int:
        return len(self._entries)

    def put(self, tokens: list[int], state: bytes | bytearray) -> bool:
        """Store ``state`` for ``tokens``; False when it is empty (llama.cpp could not
        save it), alone over a limit, or an entry already holds ``tokens`` as its
        prefix (it would never be the best)."""
        key = tuple(tokens)
        if not key or not state or len(key) > self.max_tokens or (self.max_bytes is not None and len(state) > self.max_bytes):
            return False
        if any(common_prefix(k, key) == len(key) for k in self._entries):
            return False
        for k in [k for k in self._entries if common_prefix(k, key) == len(k)]:  # entries that are prefixes of this one
            self._drop(k)
        while self._entries and (self.n_tokens + len(key) > self.max_tokens
                                 or (self.max_bytes is not None and self.n_bytes + len(state) > self.max_bytes)):
            self._drop(next(iter(self._entries)))
        self._entries[key] = Entry(key, state)
        self.n_bytes += len(state)
        self.n_tokens += len(key)
        return True

    def best(self, tokens: list[int]) -> tuple[Entry | None, int]:
        """The entry sharing the longest prefix with ``tokens``, and that length (0: none)."""
        found, n = None, 0
        for e in self._entries.values():
            m = common_prefix(e.tokens, tokens)
            if m > n:
                found, n = e, m
        return found, n

    def take(self, entry: Entry) -> None:
        """Remove ``entry`` (its state went back into the KV cache)."""
        self._drop(entry.tokens)

    def _drop(self, key: tuple[int, ...]) -> None:
        e = self._entries.pop(key)
        self.n_bytes -= len(e.state)
        self.n_tokens -= len(e.tokens)
