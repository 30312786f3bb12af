"""Slow to start, or slow to stream? A one-line verdict from one reply's timings.

Time to first token is prefill (reading the prompt, bound by compute); the
time after it is decode (one token at a time, bound by memory bandwidth).
Which of the two takes the larger share of the reply is what *dominates* it;
that is not the same as slow. A reply is called slow only when a rate is
below reading speed (the reader waits for the text) or the decode is far
below this machine's roofline (the hardware could do much better); the line
names the figure that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.engine_api import GenerationStats
from localllm.util import fmt

READING_TOKENS_PER_S = 10.0
"""A fast reader's pace in tokens: about 450 words a minute (7.5 words/s, a
skimming reader; careful silent reading is about 250), at about 1.3 tokens per
English word (BPE vocabularies of 32k-150k entries). A stream at least this
fast outruns its reader, so it is not called slow, whatever dominates the
reply; a prompt read at least this fast is read faster than its author could
read it."""

FAR_BELOW_ROOFLINE = 1 / 3
"""Decode below this share of the roofline (the bandwidth ceiling) is "far
below": llama.cpp's decode reaches 50-90% of it on an idle machine, so a third
means the hardware is losing most of its speed (other programs on the cores,
too many threads, memory swapped out)."""


@dataclass(frozen=True)
class Verdict:
    bottleneck: str  # "prefill" or "decode": what the verdict is about
    share: float  # of the reply's wall time, taken by the bottleneck
    headline: str  # "slow stream: ..." only when slow; otherwise what dominates
    detail: str  # the figures that decided it
    slow: bool = False

    @property
    def text(self) -> str:
        return f"{self.headline} ({self.detail})"


def _below_reading(rate: float | None) -> bool:
    return rate is not None and rate < READING_TOKENS_PER_S


def verdict(s: GenerationStats, ceiling_tps: float | None = None) -> Verdict | None:
    """The verdict on one reply. ``ceiling_tps``: this machine's decode roofline
    for this model (None: unknown, and decode is then judged on reading speed
    alone). The stream's rate is what the reader sees (one token per TPOT, on
    the wall clock); the roofline is compared with the rate inside llama.cpp
    (``decode_tokens_per_s``), the figure the latency panel puts against it."""
    if s.ttft_ms is None:
        return None
    stream_ms = (s.tpot_ms or 0.0) * max(s.generated_tokens - 1, 0)
    total = s.ttft_ms + stream_ms
    if total <= 0:
        return None
    prefill_share = s.ttft_ms / total
    decode_share = 1 - prefill_share
    stream_tps = 1000 / s.tpot_ms if s.tpot_ms else None
    itl = f"ITL p50 {fmt.num(s.itl_ms.p50, 1, ' ms')}"
    streaming = f"streaming is {100 * decode_share:.0f}% of the reply"
    ttft = f"TTFT is {100 * prefill_share:.0f}% of the reply"
    prompt = f"{s.prompt_tokens} prompt tokens at {fmt.num(s.prefill_tokens_per_s, 0)} t/s"
    decode_slow = _below_reading(stream_tps) or bool(
        ceiling_tps and s.decode_tokens_per_s and s.decode_tokens_per_s < FAR_BELOW_ROOFLINE * ceiling_tps)
    prefill_slow = _below_reading(s.prefill_tokens_per_s)
    reading = f"under reading speed (~{READING_TOKENS_PER_S:.0f} t/s)"
    # Both slow: the one that takes more of the reply is the one to fix first.
    if decode_slow and (not prefill_slow or decode_share >= prefill_share):
        if _below_reading(stream_tps):
            return Verdict("decode", decode_share, f"slow stream: {stream_tps:.1f} t/s", f"{reading}; {itl}; {streaming}", slow=True)
        assert ceiling_tps and s.decode_tokens_per_s
        return Verdict("decode", decode_share, f"slow stream: decode at {100 * s.decode_tokens_per_s / ceiling_tps:.0f}% of roofline",
                       f"{s.decode_tokens_per_s:.1f} of {ceiling_tps:.0f} t/s possible here; {itl}; {streaming}", slow=True)
    if prefill_slow:
        return Verdict("prefill", prefill_share, f"slow start: prompt read at {s.prefill_tokens_per_s:.1f} t/s",
                       f"{reading}; {s.prompt_tokens} prompt tokens; {ttft}", slow=True)
    if prefill_share >= 0.5:
        return Verdict("prefill", prefill_share, ttft, prompt)
    return Verdict("decode", decode_share, streaming, f"{itl}, {fmt.num(stream_tps, 1)} t/s: faster than reading")
