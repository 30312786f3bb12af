"""The TTFT forecast: from measured prefills only (n/a before any), the
attention term fitted when the prompt lengths differ, and fast enough for
every keystroke."""

from __future__ import annotations

import time

import pytest

from localllm.engine_api.stats import compute_stats
from localllm.forecast import Forecaster, Room, advice, check
from localllm.forecast.model import fit, prefill_ms


def cpu_like(n: int, prefix: int = 0) -> float:
    """A prefill that slows with context: 1 ms per token plus attention."""
    return 1.0 * n + 2e-4 * n * (prefix + n / 2)


def test_nothing_measured_is_na_never_a_guess() -> None:
    f = Forecaster().predict(3120)
    assert (f.ttft_ms, f.rate, f.basis) == (None, None, "n/a")
    assert f.line() == "≈ 3,120 new tokens · TTFT n/a (nothing measured yet this session)"


def test_a_prior_rate_is_labelled_an_estimate() -> None:
    f = Forecaster(prior_rate=240, prior_source="last bench").predict(3120)
    assert f.basis == "estimate" and f.line() == "≈ 3,120 new tokens · TTFT ≈ 13 s (estimate) at 240 t/s"


def test_one_point_is_linear_at_its_rate() -> None:
    fc = Forecaster()
    fc.observe(1000, 4000.0, ttft_ms=4100.0)
    f = fc.predict(3120)
    assert f.prefill_ms == pytest.approx(12480) and f.ttft_ms == pytest.approx(12580)
    assert f.line() == "≈ 3,120 new tokens · TTFT ≈ 13 s at 250 t/s"
    assert "linear (one prompt length so far)" in f.source


def test_the_attention_term_is_recovered_from_two_lengths() -> None:
    fc = Forecaster()
    for n in (512, 2048):
        fc.observe(n, cpu_like(n))
    a, b = fc.coefficients() or (0, 0)
    assert a == pytest.approx(1.0) and b == pytest.approx(2e-4)
    # extrapolated to 4,096 and after a cached prefix, exact for this shape
    assert fc.predict(4096).prefill_ms == pytest.approx(cpu_like(4096))
    assert fc.predict(300, prefix=3000).prefill_ms == pytest.approx(cpu_like(300, 3000))
    # a linear model would be 20% off at 4,096 from these two points
    assert prefill_ms((2048 / cpu_like(2048), 0), 4096) < 0.85 * cpu_like(4096)


def test_noise_and_odd_points_keep_the_fit_sane() -> None:
    assert fit([]) is None
    fc = Forecaster()
    fc.observe(0, 10.0)  # all from the cache: not a rate
    fc.observe(100, 0.0)
    assert fc.points == []
    # a longer prompt measured faster (noise): no negative attention term
    fc.observe(512, 600.0)
    fc.observe(1024, 1000.0)
    a, b = fc.coefficients() or (0, -1)
    assert a > 0 and b == 0


def test_stats_give_the_prefix_and_the_overhead() -> None:
    s = compute_stats(start_ns=0, token_ns=[150_000_000, 160_000_000], prompt_tokens=100, prefill_ns=120_000_000, decode_ns=10_000_000,
                      decode_evals=1, load_ms=0, end_ns=170_000_000, stop_reason="length", n_ctx=4096, context_used=601)
    fc = Forecaster()
    fc.observe_stats(s)
    assert fc.points[0].prefix == 500 and fc.points[0].overhead_ms == pytest.approx(30.0)


def test_progress_says_time_left() -> None:
    fc = Forecaster()
    assert fc.progress(0, 4096, 0).left_ms is None
    assert fc.progress(1024, 4096, 1000).left_ms == pytest.approx(3000)  # its own rate so far
    for n in (512, 2048):
        fc.observe(n, cpu_like(n))
    p = fc.progress(1024, 4096, cpu_like(1024))
    assert p.left_ms == pytest.approx(cpu_like(4096) - cpu_like(1024))
    assert p.line().startswith("prefill 1,024 / 4,096 tokens · ≈ ")
    # running twice as slow as forecast: twice the time left
    assert fc.progress(1024, 4096, 2 * cpu_like(1024)).left_ms == pytest.approx(2 * p.left_ms)


def test_a_forecast_takes_microseconds() -> None:
    fc = Forecaster()
    for n in range(100, 3300, 100):
        fc.observe(n, cpu_like(n), ttft_ms=cpu_like(n) + 5)
    t0 = time.perf_counter()
    for i in range(1000):
        fc.predict(i * 7)
    assert (time.perf_counter() - t0) / 1000 < 1e-3


def test_room_and_the_advice_name_ctx_and_kv_type() -> None:
    table = {"f16": 4096, "q8_0": 7680, "q4_0": 13824}
    assert check(Room(3000, 0, 1024, 4096), table) is None
    line = check(Room(5000, 120, 1024, 4096), table, what="the message with notes.md")
    assert line == ("the message with notes.md does not fit the context: 5,000 tokens + 120 in the context already + 1,024 for the reply "
                    "need 6,144; the context holds 4,096: load with --ctx 6144 --kv-type q8_0 (fits this device)")
    assert advice(9000, table) == "load with --ctx 9216 --kv-type q4_0 (fits this device)"
    assert advice(20000, table) == "no KV cache type holds 20,224 tokens on this device (the most: 13,824 with --kv-type q4_0): shorten the prompt"
    assert advice(40000, table, trained_ctx=32768).startswith("that is past the 32,768 tokens this model was trained on")


def test_images_add_their_measured_encode_or_make_ttft_na() -> None:
    fc = Forecaster()
    fc.observe(1000, 1000.0, ttft_ms=1050.0)
    assert fc.predict(1256, images=1).ttft_ms is None
    assert fc.predict(1256, images=1).source == "no image encode measured yet this session"
    fc.observe_encode(2, 900.0)
    f = fc.predict(1256, images=2)
    assert f.ttft_ms == pytest.approx(1256 + 50 + 900) and "2 image(s) ≈ 900 ms to encode" in f.source


def test_audio_chunks_add_their_own_measured_encode_apart_from_images() -> None:
    from types import SimpleNamespace

    fc = Forecaster()
    fc.observe(1000, 1000.0, ttft_ms=1050.0)
    fc.observe_encode(1, 300.0)  # a picture's encode says nothing about a clip's
    assert fc.predict(1125, audio_chunks=1).ttft_ms is None
    assert fc.predict(1125, audio_chunks=1).source == "no audio encode measured yet this session"
    stats = SimpleNamespace(images=2, encode_ms=800.0, ttft_ms=None, prefill_ms=0.0, prompt_tokens=0, context_used=0, decode_evals=0,
                            context_shifts=[])
    fc.observe_stats(stats, audio=True)  # type: ignore[arg-type]
    f = fc.predict(1125, audio_chunks=1, images=1)
    assert f.ttft_ms == pytest.approx(1125 + 50 + 400 + 300) and "1 audio chunk(s) of 30 s ≈ 400 ms to encode" in f.source
    fc.observe_stats(SimpleNamespace(**{**stats.__dict__, "encode_ms": 9000.0}), audio=None)  # type: ignore[arg-type]
    assert fc.encode_ms_per_chunk == [400.0] and fc.encode_ms_per_image == [300.0]  # both kinds in one encode: neither learns
