"""Whether a prompt fits the context, and what would: before it is sent.

The prompt's new tokens, what the cache already holds (the history) and the
room left for the reply must fit ``n_ctx``; llama.cpp would otherwise refuse the
batch (``llama_decode`` returns 1, "failed to find a memory slot", ``src/llama-context.cpp``) or a chat would shift its history
out. When they do not fit, the advice is the planner's own: the largest context
that fits this device for each KV cache type (``fitting.Fit.max_ctx_by_kv_type``,
searched by ``planner.largest_ctx``), best quality first (``planner.KV_LADDER``),
with the context rounded up to the planner's step (``planner.CTX_PAD``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from localllm.plan import planner


@dataclass(frozen=True)
class Room:
    new_tokens: int  # this message's tokens (typed text, files, the template's wrapping)
    history: int  # tokens the context holds already (kept when this message is added)
    reply: int  # tokens kept free for the reply
    n_ctx: int

    @property
    def needed(self) -> int:
        return self.new_tokens + self.history + self.reply

    @property
    def fits(self) -> bool:
        return self.needed <= self.n_ctx

    def sentence(self) -> str:
        hist = f" + {self.history:,} in the context already" if self.history else ""
        return (f"{self.new_tokens:,} tokens{hist} + {self.reply:,} for the reply need {self.needed:,}; "
                f"the context holds {self.n_ctx:,}")


def suggestion(needed: int, max_ctx_by_kv_type: Mapping[str, int], *, trained_ctx: int | None = None) -> tuple[int, str] | None:
    """The context (rounded up to the planner's step) and the KV cache type, best
    quality first, that hold ``needed`` tokens on this device; None when none does
    (or ``needed`` is past what the model was trained on). What ``advice`` says,
    for a front end that offers to reload with it (the cockpit)."""
    ctx = -(-needed // planner.CTX_PAD) * planner.CTX_PAD
    if trained_ctx and needed > trained_ctx:
        return None
    for kv in _order(max_ctx_by_kv_type):
        if max_ctx_by_kv_type[kv] >= ctx:
            return ctx, kv
    return None


def _order(table: Mapping[str, int]) -> list[str]:
    return [kv for kv in planner.KV_LADDER if kv in table] + [kv for kv in table if kv not in planner.KV_LADDER]


def advice(needed: int, max_ctx_by_kv_type: Mapping[str, int], *, trained_ctx: int | None = None) -> str:
    """The ``--ctx`` and KV cache type that hold ``needed`` tokens on this device,
    best quality first; or why none does."""
    ctx = -(-needed // planner.CTX_PAD) * planner.CTX_PAD
    if trained_ctx and needed > trained_ctx:
        return f"that is past the {trained_ctx:,} tokens this model was trained on: shorten the prompt"
    table = {kv: n for kv, n in max_ctx_by_kv_type.items()}
    found = suggestion(needed, table)
    if found is not None:
        return f"load with --ctx {found[0]} --kv-type {found[1]} (fits this device)"
    if not table:
        return f"load with --ctx {ctx} or more"
    order = _order(table)
    best = max(order, key=lambda k: table[k])
    return (f"no KV cache type holds {ctx:,} tokens on this device (the most: {table[best]:,} with --kv-type {best}): "
            "shorten the prompt")


def check(room: Room, max_ctx_by_kv_type: Mapping[str, int], *, trained_ctx: int | None = None, what: str = "the prompt") -> str | None:
    """None when ``room`` fits; else the one line to refuse with."""
    if room.fits:
        return None
    return f"{what} does not fit the context: {room.sentence()}: {advice(room.needed, max_ctx_by_kv_type, trained_ctx=trained_ctx)}"
