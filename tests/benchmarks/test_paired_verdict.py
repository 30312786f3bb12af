"""bench_serve's paired verdicts: a target is met only when the 95% interval of
the pairs' geometric mean clears it, so a mean a hair over the target on noisy
pairs reads "not shown" instead of "met"."""

from __future__ import annotations

import math

import pytest

from scripts.paired_runs import interval, verdict_line


def test_the_interval_is_the_geometric_means_from_the_log_ratios() -> None:
    ratios = [1.0, 1.1, 0.95, 1.05]
    logs = [math.log(r) for r in ratios]
    mean = sum(logs) / 4
    sd = math.sqrt(sum((x - mean) ** 2 for x in logs) / 3)
    lo, hi = interval(ratios)
    assert lo == pytest.approx(math.exp(mean - 1.96 * sd / 2))
    assert hi == pytest.approx(math.exp(mean + 1.96 * sd / 2))
    assert interval([1.02]) is None


def test_a_lead_inside_the_noise_is_not_shown() -> None:
    assert verdict_line("x", [1.03, 1.02, 1.04, 1.03], 1.0).endswith("(met)")
    noisy = verdict_line("x", [0.95, 1.10, 0.97, 1.06], 1.0)  # mean 1.018, interval spans 1.0
    assert noisy.startswith("- x: 1.018 [pairs: 0.950, 1.100, 0.970, 1.060] 95% interval ")
    assert noisy.endswith("(not shown: the interval spans the target)")
    assert verdict_line("x", [0.97, 0.98], 1.0).endswith("(NOT met)")
    assert verdict_line("x", [1.01], 1.0) == "- x: 1.010 [pairs: 1.010] (met)"  # one pair: no interval
    assert verdict_line("x", [], 1.0, "llama-server not built") == "- x: n/a (llama-server not built)"
