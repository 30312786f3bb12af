"""Prefill time as a function of the prompt, fitted to this session's measurements.

A prefill of ``n`` new tokens after ``p`` tokens already in the cache costs the
weights' matrix products, linear in ``n``, and attention, where the token at
position ``i`` reads ``i`` keys: summed over the new tokens, ``n·p + n²/2``
key reads. So ``t(n, p) = a·n + b·n·(p + n/2)``: on a CPU the second term is why
the rate falls as the context grows (llama.cpp's attention, ``src/llama-graph.cpp``
``build_attn_mha``, multiplies Q by every cached K). ``a`` and ``b`` are fitted by
least squares on the relative error (a 4k-token prefill must not drown a
512-token one); with one prompt length measured the attention term cannot be
told apart and the model is linear (``rate`` at that length), said in ``source``.
TTFT adds what the measured turns spent outside prefill (template, tokenizing,
sampling the first token): their median.
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from typing import Any

from localllm.engine_api.stats import GenerationStats

NA = "n/a"


@dataclass(frozen=True)
class Point:
    """One measured prefill."""

    new_tokens: int
    prefill_ms: float
    prefix: int = 0  # tokens already in the cache when it started
    overhead_ms: float | None = None  # TTFT minus prefill; None: TTFT not measured


@dataclass(frozen=True)
class Forecast:
    new_tokens: int
    prefill_ms: float | None  # None: nothing to forecast from
    ttft_ms: float | None
    rate: float | None  # tokens/s this prefill is forecast to run at
    basis: str  # "measured" (a fit of this session's prefills), "estimate" (a prior, labelled) or "n/a"
    source: str  # how, for people

    def line(self) -> str:
        return format_line(self)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class Progress:
    """A running prefill: tokens done of total, time spent and (forecast) left."""

    done: int
    total: int
    elapsed_ms: float
    left_ms: float | None  # None: nothing to forecast from yet (no token done, no measurement)

    def line(self) -> str:
        left = f" · ≈ {_dur(self.left_ms)} left" if self.left_ms is not None else ""
        return f"prefill {self.done:,} / {self.total:,} tokens{left}"


def _dur(ms: float | None) -> str:
    if ms is None:
        return NA
    if ms < 1000:
        return f"{ms:.0f} ms"
    if ms < 10_000:
        return f"{ms / 1000:.1f} s"
    return f"{ms / 1000:.0f} s"


def format_line(f: Forecast) -> str:
    """``≈ 3,120 new tokens · TTFT ≈ 13 s at 240 t/s`` (the issue's words); n/a said as such."""
    head = f"≈ {f.new_tokens:,} new tokens"
    if f.new_tokens == 0:
        return f"{head} · all in the cache"
    if f.ttft_ms is None:
        return f"{head} · TTFT {NA} ({f.source})"
    est = " (estimate)" if f.basis == "estimate" else ""
    rate = f" at {f.rate:,.0f} t/s" if f.rate is not None else ""
    return f"{head} · TTFT ≈ {_dur(f.ttft_ms)}{est}{rate}"


class Forecaster:
    """This session's prefill measurements and the forecasts made from them.
    ``window``: the most recent points kept (the machine's speed drifts: other
    load, thermal limits). ``prior_rate``: a tokens/s figure from elsewhere (a
    benchmark record) used, labelled an estimate, until something is measured."""

    def __init__(self, *, window: int = 32, prior_rate: float | None = None, prior_source: str = "") -> None:
        self.window = window
        self.points: list[Point] = []
        self.prior_rate = prior_rate
        self.prior_source = prior_source
        self.encode_ms_per_image: list[float] = []  # a vision model's image encodes (TTFT's third phase)
        # an audio model's encodes, per 30 s chunk: libmtmd pads a clip to whole chunks and encodes each whole,
        # so a chunk costs the same however much of it is sound (audio.projector's ``chunks``)
        self.encode_ms_per_chunk: list[float] = []

    def observe(self, new_tokens: int, prefill_ms: float, *, prefix: int = 0, ttft_ms: float | None = None) -> None:
        """A prefill that ran: ``new_tokens`` evaluated in ``prefill_ms`` after ``prefix`` cached tokens."""
        if new_tokens <= 0 or prefill_ms <= 0:
            return  # all from the cache: nothing about the rate was measured
        overhead = ttft_ms - prefill_ms if ttft_ms is not None and ttft_ms >= prefill_ms else None
        self.points.append(Point(new_tokens, prefill_ms, max(prefix, 0), overhead))
        del self.points[: -self.window]

    def observe_stats(self, stats: GenerationStats, *, prefix: int | None = None, audio: bool | None = False) -> None:
        """A generation's stats: its prompt tokens and prefill time; the prefix is
        what the cache held before (derived from the context used at the end when
        no shift blurred it, else unknown and taken as 0). ``audio``: the chunks
        encoded were sound (True), pictures (False), or both (None: the encode
        time cannot be split between them, so neither learns from it)."""
        if prefix is None:
            prefix = 0 if stats.context_shifts else max(stats.context_used - stats.prompt_tokens - stats.decode_evals, 0)
        images, encode_ms = getattr(stats, "images", 0), getattr(stats, "encode_ms", None)
        if images and encode_ms and audio is not None:
            self.observe_encode(images, encode_ms, audio=audio)
        ttft = stats.ttft_ms - encode_ms if stats.ttft_ms is not None and encode_ms else stats.ttft_ms
        self.observe(stats.prompt_tokens, stats.prefill_ms, prefix=prefix, ttft_ms=ttft)

    def observe_encode(self, images: int, encode_ms: float, *, audio: bool = False) -> None:
        """Images (``audio``: 30 s chunks of sound) encoded in ``encode_ms`` (their tokens' decode is prefill)."""
        if images > 0 and encode_ms > 0:
            kept = self.encode_ms_per_chunk if audio else self.encode_ms_per_image
            kept.append(encode_ms / images)
            del kept[: -self.window]

    def coefficients(self) -> tuple[float, float] | None:
        """``(a, b)`` of ``t = a·n + b·n·(p + n/2)`` in ms, or None with nothing measured."""
        return fit(self.points)

    def overhead_ms(self) -> float | None:
        xs = [p.overhead_ms for p in self.points[-8:] if p.overhead_ms is not None]
        return statistics.median(xs) if xs else None

    def predict(self, new_tokens: int, *, prefix: int = 0, images: int = 0, audio_chunks: int = 0) -> Forecast:
        """The forecast for ``new_tokens`` not in the cache (image and audio
        tokens included), after ``prefix`` that are; ``images`` and 30 s
        ``audio_chunks`` not yet encoded add their measured encode time, or make
        TTFT n/a while none of their kind was measured."""
        n = max(new_tokens, 0)
        if n == 0:
            return Forecast(0, 0.0, None, None, "measured" if self.points else NA, "nothing new to read")
        f = self._predict_text(n, prefix)
        for count, kept, what in ((images, self.encode_ms_per_image, "image"), (audio_chunks, self.encode_ms_per_chunk, "audio")):
            if count <= 0 or f.ttft_ms is None:
                continue
            if not kept:
                return replace(f, ttft_ms=None, basis=NA, source=f"no {what} encode measured yet this session")
            enc = count * statistics.median(kept[-8:])
            said = f"{count} image(s)" if what == "image" else f"{count} audio chunk(s) of 30 s"
            f = replace(f, ttft_ms=f.ttft_ms + enc, source=f"{f.source}; {said} ≈ {_dur(enc)} to encode")
        return f

    def _predict_text(self, n: int, prefix: int) -> Forecast:
        ab = self.coefficients()
        if ab is not None:
            prefill = prefill_ms(ab, n, prefix)
            over = self.overhead_ms()
            distinct = len({p.new_tokens + p.prefix for p in self.points})
            how = (f"fit of {len(self.points)} measured prefill(s)" if ab[1] > 0 else
                   f"{len(self.points)} measured prefill(s), linear" + (" (one prompt length so far)" if distinct < 2 else ""))
            return Forecast(n, prefill, prefill + (over or 0.0), n / prefill * 1000 if prefill > 0 else None, "measured",
                            how + ("" if over is not None else "; TTFT's overhead not measured"))
        if self.prior_rate:
            prefill = n / self.prior_rate * 1000
            return Forecast(n, prefill, prefill, self.prior_rate, "estimate", self.prior_source or "a prior rate")
        return Forecast(n, None, None, None, NA, "nothing measured yet this session")

    def progress(self, done: int, total: int, elapsed_ms: float, *, prefix: int = 0) -> Progress:
        """A prefill of ``total`` tokens, ``done`` of them evaluated in ``elapsed_ms``:
        the time left from the model's shape, scaled by how this prefill is going
        against its forecast; with no model, by its own rate so far."""
        done = min(max(done, 0), total)
        ab = self.coefficients()
        if done >= total:
            return Progress(done, total, elapsed_ms, 0.0)
        if ab is not None:
            t_done, t_all = prefill_ms(ab, done, prefix), prefill_ms(ab, total, prefix)
            scale = elapsed_ms / t_done if done > 0 and t_done > 0 and elapsed_ms > 0 else 1.0
            left = max(t_all - t_done, 0.0) * scale
            return Progress(done, total, elapsed_ms, left)
        if done > 0 and elapsed_ms > 0:
            return Progress(done, total, elapsed_ms, elapsed_ms / done * (total - done))
        return Progress(done, total, elapsed_ms, None)


def prefill_ms(ab: tuple[float, float], n: int, prefix: int = 0) -> float:
    a, b = ab
    return a * n + b * n * (prefix + n / 2)


def fit(points: Sequence[Point]) -> tuple[float, float] | None:
    """Least squares on the relative error, ``a`` and ``b`` non-negative: both
    terms when the points span more than one context length and the attention
    term comes out positive, else the linear term alone."""
    pts = [p for p in points if p.new_tokens > 0 and p.prefill_ms > 0]
    if not pts:
        return None
    # each row divided by t: minimise sum((a*x1 + b*x2)/t - 1)^2
    rows = [(p.new_tokens / p.prefill_ms, p.new_tokens * (p.prefix + p.new_tokens / 2) / p.prefill_ms) for p in pts]
    s11 = sum(x1 * x1 for x1, _ in rows)
    s12 = sum(x1 * x2 for x1, x2 in rows)
    s22 = sum(x2 * x2 for _, x2 in rows)
    r1 = sum(x1 for x1, _ in rows)
    r2 = sum(x2 for _, x2 in rows)
    linear = (r1 / s11, 0.0)
    spans = len({p.new_tokens + p.prefix for p in pts}) >= 2
    det = s11 * s22 - s12 * s12
    if not spans or det <= 1e-9 * s11 * s22:
        return linear
    a = (r1 * s22 - r2 * s12) / det
    b = (r2 * s11 - r1 * s12) / det
    if a <= 0 or b < 0:
        return linear
    return (a, b)
