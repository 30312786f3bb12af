"""What ``tune`` tries: one setting at a time, the others at the best so far.

The settings interact little enough that a coordinate search finds what a grid
would (a 3-value grid over four settings is 54 loads; this is 10), with one
rule llama.cpp imposes: a quantized V cache runs only with flash attention, so
the cache stage tries q8_0 and q4_0 with it on whatever the first stage chose.
Threads come last: every other stage runs pinned to the starting count, the
fast cores the adaptive controller starts from (``threads.topology``).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

# config keys, as the flags of run, chat, serve and the cockpit name them (tests/tune checks they exist)
UBATCH, FLASH_ATTN, KV_TYPE, THREADS = "ubatch", "flash-attn", "kv-type", "threads"
ORDER = (FLASH_ATTN, KV_TYPE, UBATCH, THREADS)
UBATCHES = (128, 256, 512)  # llama.cpp's default is 512; smaller ones trade prefill speed for a smaller compute buffer
KV_TYPES = ("f16", "q8_0", "q4_0")


@dataclass(frozen=True)
class Setting:
    """One candidate: every setting ``tune`` chooses."""

    ubatch: int
    flash_attn: str  # "on" or "off"
    kv_type: str  # both caches
    threads: int

    def value(self, key: str) -> Any:
        return {UBATCH: self.ubatch, FLASH_ATTN: self.flash_attn, KV_TYPE: self.kv_type, THREADS: self.threads}[key]

    def with_value(self, key: str, value: Any) -> Setting:
        """This setting with ``key`` changed; a quantized cache turns flash attention on (llama.cpp needs it for the V cache)."""
        if key == KV_TYPE:
            return replace(self, kv_type=value, flash_attn="on" if value != "f16" else self.flash_attn)
        field = {UBATCH: "ubatch", FLASH_ATTN: "flash_attn", THREADS: "threads"}[key]
        return replace(self, **{field: value})

    def load_key(self) -> tuple[int, str, str]:
        """What needs a new load: everything but the thread count, which changes between steps."""
        return self.ubatch, self.flash_attn, self.kv_type

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def ubatch_values(cap: int, quick: bool) -> list[int]:
    """128, 256 and 512, none above ``cap`` (the context, or the logical batch: llama.cpp
    clamps the physical batch to both); quick: the smallest and the largest."""
    vals = sorted({min(u, cap) for u in UBATCHES})
    return [vals[0], vals[-1]] if quick and len(vals) > 2 else vals


def thread_values(start: int, quick: bool) -> list[int]:
    """The starting count and fewer (a busy or slow core makes every op's barrier
    wait; more than the fast cores does not help decode): start, start - 1 and
    half of it; quick: start and one fewer choice."""
    vals = [start, start - 1, start // 2] if not quick else [start, max(1, start // 2) if start > 2 else start - 1]
    out: list[int] = []
    for v in vals:
        if v >= 1 and v not in out:
            out.append(v)
    return out


def values(key: str, *, quick: bool, ubatch_cap: int, start_threads: int) -> list[Any]:
    """The candidate values of ``key``: two of each in quick mode (the suite's)."""
    if key == FLASH_ATTN:
        return ["on", "off"]
    if key == KV_TYPE:
        return list(KV_TYPES[:2] if quick else KV_TYPES)
    if key == UBATCH:
        return ubatch_values(ubatch_cap, quick)
    return thread_values(start_threads, quick)


def stage(key: str, best: Setting, vals: list[Any]) -> list[Setting]:
    """The candidates of one stage: ``best`` with ``key`` at each value, ``best``'s own first
    (the incumbent, which a challenger must beat by the margin), no two alike."""
    out = [best]
    for v in vals:
        s = best.with_value(key, v)
        if s not in out:
            out.append(s)
    return out
