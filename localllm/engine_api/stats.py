"""Latency statistics from per-token timestamps. Pure Python, no model.

Definitions (the seeds' vocabulary, and what llama.cpp's perf counters count):

- TTFT: from the moment the user's message is submitted (``run`` hands over
  the prompt, Enter in the cockpit, a line in ``chat``) to the first token
  that prints text; everything between counts: chat template, tokenizing,
  prompt-cache reuse or load, prefill, sampling. One clock everywhere. Bound
  by prefill (reading the prompt), which is compute-bound; the prefill time
  is shown on its own as well.
- ITL: the gaps between consecutive tokens' timestamps, as the user sees them
  (decode + sampling + detokenization). Bound by memory bandwidth.
- TPOT: (last - first) / (generated - 1), the mean of the ITL gaps.
- prefill rate: prompt tokens / time llama.cpp spent evaluating the prompt
  (llama_perf_context's t_p_eval_ms).
- decode rate: single-token evaluations / the time they took (t_eval_ms). The
  last sampled token is never evaluated, so there is one fewer than generated.

A figure that was not measured (no gap between tokens after one token, no
decode after ``-n 1``, a standard deviation of one repetition) is None, shown
as "n/a" and written as null: never 0, which reads as a measurement.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any


def percentile(values: Sequence[float], q: float) -> float:
    """Linear-interpolated percentile (numpy's default method), q in [0, 100]."""
    if not values:
        return 0.0
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * q / 100.0
    lo = math.floor(pos)
    hi = min(lo + 1, len(xs) - 1)
    return float(xs[lo] + (xs[hi] - xs[lo]) * (pos - lo))


def mean_std(values: Sequence[float | None]) -> tuple[float | None, float | None]:
    """Mean and sample standard deviation (llama-bench reports avg ± stddev).
    None where not measured: no values (or any missing), or one value's spread."""
    if not values or any(v is None for v in values):
        return None, None
    xs = [float(v) for v in values if v is not None]
    m = sum(xs) / len(xs)
    if len(xs) < 2:
        return m, None
    var = sum((v - m) ** 2 for v in xs) / (len(xs) - 1)
    return m, math.sqrt(var)


@dataclass(frozen=True)
class ITL:
    p50: float | None  # None: fewer than two tokens, no gap to measure
    p95: float | None
    max: float | None

    @classmethod
    def from_gaps(cls, gaps_ms: Sequence[float]) -> ITL:
        if not gaps_ms:
            return cls(None, None, None)
        return cls(percentile(gaps_ms, 50), percentile(gaps_ms, 95), float(max(gaps_ms)))


@dataclass(frozen=True)
class ShiftRecord:
    """One context shift: when (cache length), how many tokens were dropped and
    kept, how long it took, and how (``shift`` in place or ``reprocess``)."""

    at_token: int
    dropped: int
    kept: int
    ms: float
    method: str


@dataclass
class GenerationStats:
    """Timings of one generation. All times in milliseconds."""

    prompt_tokens: int
    generated_tokens: int
    load_ms: float
    ttft_ms: float | None  # None: no token came
    itl_ms: ITL
    tpot_ms: float | None  # None: fewer than two tokens
    prefill_ms: float
    decode_ms: float
    decode_evals: int
    prefill_tokens_per_s: float | None  # None: no prompt was evaluated (all of it came from the cache)
    decode_tokens_per_s: float | None  # None: no single-token evaluation (-n 1)
    total_ms: float
    stop_reason: str = "length"
    n_ctx: int = 0
    context_used: int = 0  # tokens in the KV cache when the generation ended
    context_shifts: list[ShiftRecord] = field(default_factory=list)
    token_times_ms: list[float] = field(default_factory=list, repr=False)
    # The decode thread counts and why (localllm.threads: ThreadController.report):
    # mode, start, the count per kind of step now, the changes during this
    # generation. None: the engine chose none (the scripted fake).
    threads: dict[str, Any] | None = None
    # Images in the prompt (a vision model, engine.mtmd): TTFT's third phase. encode_ms is the vision
    # encoder alone (the embeddings' decode counts in prefill_ms); None when no image was encoded.
    images: int = 0
    encode_ms: float | None = None
    images_per_s: float | None = None

    def to_dict(self, with_token_times: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_token_times:
            d.pop("token_times_ms")
        return d


def compute_stats(
    *,
    start_ns: int,
    token_ns: Sequence[int],
    prompt_tokens: int,
    prefill_ns: int,
    decode_ns: int,
    decode_evals: int,
    load_ms: float,
    end_ns: int,
    stop_reason: str,
    n_ctx: int = 0,
    context_used: int = 0,
    shifts: Sequence[ShiftRecord] = (),
    first_text_ns: int | None = None,
    threads: dict[str, Any] | None = None,
    images: int = 0,
    encode_ns: int | None = None,
) -> GenerationStats:
    """Build the stats from raw monotonic stamps (``time.perf_counter_ns``).
    ``first_text_ns``: when the first token that prints text came (a token that
    is half a character prints nothing yet); by default the first token's."""
    times_ms = [(t - start_ns) / 1e6 for t in token_ns]
    if first_text_ns is None and token_ns:
        first_text_ns = token_ns[0]
    gaps = [b - a for a, b in zip(times_ms, times_ms[1:])]
    n = len(times_ms)
    prefill_ms = prefill_ns / 1e6
    decode_ms = decode_ns / 1e6
    return GenerationStats(
        prompt_tokens=prompt_tokens,
        generated_tokens=n,
        load_ms=load_ms,
        ttft_ms=(first_text_ns - start_ns) / 1e6 if first_text_ns is not None else None,
        itl_ms=ITL.from_gaps(gaps),
        tpot_ms=(times_ms[-1] - times_ms[0]) / (n - 1) if n > 1 else None,
        prefill_ms=prefill_ms,
        decode_ms=decode_ms,
        decode_evals=decode_evals,
        prefill_tokens_per_s=prompt_tokens / prefill_ms * 1000 if prefill_ms > 0 and prompt_tokens else None,
        decode_tokens_per_s=decode_evals / decode_ms * 1000 if decode_ms > 0 and decode_evals else None,
        total_ms=(end_ns - start_ns) / 1e6,
        stop_reason=stop_reason,
        n_ctx=n_ctx,
        context_used=context_used,
        context_shifts=list(shifts),
        token_times_ms=times_ms,
        threads=threads,
        images=images,
        encode_ms=encode_ns / 1e6 if images and encode_ns is not None else None,
        images_per_s=images / encode_ns * 1e9 if images and encode_ns else None,
    )
