"""Slow to start, or slow to stream? A one-line verdict from one reply's timings.

The seeds' rule: time to first token is prefill (reading the prompt, bound by
compute); the time after it is decode (one token at a time, bound by memory
bandwidth). Whichever takes the larger share of the reply is the bottleneck,
and the line names the figure that decided it.
"""

from __future__ import annotations

from dataclasses import dataclass

from localllm.engine_api import GenerationStats
from localllm.util import fmt


@dataclass(frozen=True)
class Verdict:
    bottleneck: str  # "prefill" or "decode"
    share: float  # of the reply's wall time
    headline: str  # "slow start: prefill-bound"
    detail: str  # the figures that decided it

    @property
    def text(self) -> str:
        return f"{self.headline} ({self.detail})"


def verdict(s: GenerationStats) -> Verdict | None:
    if s.ttft_ms is None:
        return None
    stream_ms = (s.tpot_ms or 0.0) * max(s.generated_tokens - 1, 0)
    total = s.ttft_ms + stream_ms
    if total <= 0:
        return None
    prefill_share = s.ttft_ms / total
    if prefill_share >= 0.5:
        return Verdict(
            "prefill",
            prefill_share,
            "slow start: prefill-bound",
            f"{s.prompt_tokens} prompt tokens at {fmt.num(s.prefill_tokens_per_s, 0)} t/s; TTFT is {100 * prefill_share:.0f}% of the reply",
        )
    return Verdict(
        "decode",
        1 - prefill_share,
        "slow stream: decode-bound",
        f"ITL p50 {fmt.num(s.itl_ms.p50, 1, ' ms')}, {fmt.num(s.decode_tokens_per_s, 1)} t/s; streaming is {100 * (1 - prefill_share):.0f}% of the reply",
    )
