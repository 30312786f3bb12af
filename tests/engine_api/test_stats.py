"""Latency arithmetic, checked against numpy and statistics (no model)."""

from __future__ import annotations

import statistics

import numpy as np
import pytest

from localllm.engine_api.stats import ITL, compute_stats, mean_std, percentile


@pytest.mark.parametrize("values", [[5.0], [1.0, 2.0], [3.0, 1.0, 2.0, 10.0, 7.5], list(np.random.default_rng(1).random(101))])
@pytest.mark.parametrize("q", [0, 50, 95, 100])
def test_percentile_matches_numpy(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))


def test_mean_std_matches_statistics() -> None:
    xs = [10.0, 12.0, 9.5, 11.25]
    m, s = mean_std(xs)
    assert m == pytest.approx(statistics.mean(xs))
    assert s == pytest.approx(statistics.stdev(xs))
    assert mean_std([4.0]) == (4.0, None)  # one value has no spread: not measured


def test_compute_stats_from_stamps() -> None:
    ms = 1_000_000
    start = 1_000 * ms
    tokens = [start + 100 * ms, start + 110 * ms, start + 125 * ms, start + 130 * ms]
    s = compute_stats(
        start_ns=start,
        token_ns=tokens,
        prompt_tokens=50,
        prefill_ns=95 * ms,
        decode_ns=27 * ms,
        decode_evals=3,
        load_ms=12.0,
        end_ns=start + 131 * ms,
        stop_reason="length",
    )
    assert s.ttft_ms == pytest.approx(100.0)
    assert s.generated_tokens == 4
    assert s.itl_ms == ITL(p50=10.0, p95=pytest.approx(14.5), max=15.0)
    assert s.tpot_ms == pytest.approx(10.0)
    assert s.prefill_tokens_per_s == pytest.approx(50 / 0.095)
    assert s.decode_tokens_per_s == pytest.approx(3 / 0.027)
    assert s.total_ms == pytest.approx(131.0)
    assert "token_times_ms" not in s.to_dict()
    assert s.to_dict()["itl_ms"] == {"p50": 10.0, "p95": pytest.approx(14.5), "max": 15.0}


def test_no_tokens() -> None:
    s = compute_stats(start_ns=0, token_ns=[], prompt_tokens=3, prefill_ns=0, decode_ns=0, decode_evals=0, load_ms=0, end_ns=5, stop_reason="stop")
    # nothing was measured: None (null, "n/a"), never a 0 that reads as a measurement
    assert s.generated_tokens == 0 and s.ttft_ms is None and s.decode_tokens_per_s is None and s.tpot_ms is None
    assert s.prefill_tokens_per_s is None and s.itl_ms == ITL(None, None, None)
    d = s.to_dict()
    assert d["ttft_ms"] is None and d["itl_ms"] == {"p50": None, "p95": None, "max": None}


def test_one_repetition_has_no_spread() -> None:
    from localllm.engine_api.stats import mean_std

    assert mean_std([12.0]) == (12.0, None)
    assert mean_std([10.0, None]) == (None, None)
    m, s = mean_std([10.0, 14.0])
    assert m == 12.0 and s == pytest.approx(2 ** 0.5 * 2)
