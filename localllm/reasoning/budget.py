"""A thinking budget: after N tokens of thinking, the end-of-thinking marker is
forced and the answer follows (llama.cpp's ``--reasoning-budget N``).

The rules are llama.cpp's (common/reasoning-budget.cpp, its sampler of the same
name): idle until the start marker's tokens have gone by (in the prompt's tail,
where the template opened the thinking, or in the reply); then each token counts
down the budget, and the end marker's tokens end it naturally; at zero the
tokens that complete a character are let through (a budget never cuts a UTF-8
sequence), then the forced tokens (an optional message, then the end marker)
are forced one by one; after them the budget is done, until a new start marker
arms it again (some models think in several blocks). A budget of 0 forces the
end as soon as the thinking opens; -1 (unlimited) makes no budget at all.

Pure Python over the reply's bytes, so every generation loop (one sequence in
``engine.generator``, many in serve's scheduler) uses the same machine and a
test drives it in microseconds; the engine gives the forced tokens' ids.
"""

from __future__ import annotations

from collections.abc import Sequence

IDLE, COUNTING, WAITING_UTF8, FORCING, DONE = "idle", "counting", "waiting_utf8", "forcing", "done"


class _Matcher:
    """Whether the reply's bytes so far hold one of ``markers`` since the last
    reset. llama.cpp matches token sequences (its token_matcher); bytes are
    matched here, so a marker the model writes in other tokens than the
    tokenizer's own (``<`` ``think`` ``>`` for ``<th`` ``ink>``) counts too."""

    def __init__(self, markers: Sequence[bytes]) -> None:
        self.markers = [m for m in markers if m]
        self._keep = max((len(m) for m in self.markers), default=1) - 1
        self._tail = b""

    def advance(self, piece: bytes) -> bool:
        seen = self._tail + piece
        if any(m in seen for m in self.markers):
            self._tail = b""
            return True
        self._tail = seen[-self._keep:] if self._keep else b""
        return False

    def reset(self) -> None:
        self._tail = b""


class Budget:
    """One reply's thinking budget between the ``start`` and ``end`` markers.
    ``forced()``: the token the next step must take (None: sample freely);
    ``accept(piece)`` after every token of the reply, with the token's bytes."""

    def __init__(self, limit: int, start: bytes, end: bytes, forced: Sequence[int]) -> None:
        if limit < 0:
            raise ValueError("an unlimited budget is no budget: make none")
        self.limit = limit
        self.remaining = limit
        self.state = IDLE
        self.forced_tokens = tuple(forced)
        self._pos = 0
        self._start = _Matcher([start])
        self._end = _Matcher([end])
        self.thought = 0  # tokens inside thinking blocks so far (forced ones included)
        self.forced_count = 0  # how many times the end was forced

    def prime(self, pieces: Sequence[bytes]) -> None:
        """Show it the bytes of the prompt's last tokens: a generation prompt that opens the
        thinking (DeepSeek R1's ``<think>\\n``) arms it, as llama.cpp feeds its
        generation prompt to the sampler; a closed block there leaves it done."""
        for piece in pieces:
            self._accept(piece, counted=False)

    def forced(self) -> int | None:
        if self.state == FORCING and self._pos < len(self.forced_tokens):
            return self.forced_tokens[self._pos]
        return None

    def accept(self, piece: bytes) -> None:
        self._accept(piece, counted=True)

    def _accept(self, piece: bytes, *, counted: bool) -> None:
        if self.state in (IDLE, DONE):
            if self._start.advance(piece):
                self._arm()
            return
        if not counted and self.state == FORCING:
            return  # the prompt's rest after an opening that spent the budget: the forced tokens all go in the reply
        if counted:
            self.thought += 1
        if self.state == FORCING:
            self._pos += 1
            if self._pos >= len(self.forced_tokens):
                self._done()
            return
        if self._end.advance(piece):
            self._done()
            return
        if self.state == WAITING_UTF8:
            if utf8_complete(piece):
                self._force()
            return
        self.remaining -= 1
        if self.remaining <= 0:
            if utf8_complete(piece):
                self._force()
            else:
                self.state = WAITING_UTF8

    def _arm(self) -> None:
        self.remaining = self.limit
        self._end.reset()
        self.state = COUNTING
        if self.remaining <= 0:
            self._force()

    def _force(self) -> None:
        self.state, self._pos = FORCING, 0
        self.forced_count += 1
        if not self.forced_tokens:
            self._done()

    def _done(self) -> None:
        self.state = DONE
        self._start.reset()


def utf8_complete(piece: bytes) -> bool:
    """Whether ``piece`` does not end inside a UTF-8 character (llama.cpp's common_utf8_is_complete)."""
    for back in range(1, min(4, len(piece)) + 1):
        b = piece[-back]
        if b & 0xC0 != 0x80:  # a lead byte (or ASCII): how long its character is
            need = 1 if b < 0x80 else 2 if b >> 5 == 0b110 else 3 if b >> 4 == 0b1110 else 4 if b >> 3 == 0b11110 else 1
            return back >= need
    return True  # continuation bytes only: not ours to wait on


# What OpenAI's reasoning_effort, Responses' reasoning.effort and Ollama's think words mean
# as a budget here: a small model's thinking in tokens (none: thinking off, through the template)
EFFORT_BUDGETS = {"minimal": 256, "low": 1024, "medium": 4096, "high": -1}
