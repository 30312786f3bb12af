"""Ollama's ``keep_alive`` values: numbers are seconds, strings Go durations, negative is never."""

from __future__ import annotations

import pytest

from localllm.router import durations


@pytest.mark.parametrize(("value", "seconds"), [
    (0, 0.0), ("0", 0.0), (30, 30.0), (2.5, 2.5), ("300", 300.0), ("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0),
    ("1.5h", 5400.0), ("300ms", 0.3), ("0s", 0.0), (" 5m ", 300.0),
])
def test_durations_read_as_ollama_reads_them(value: object, seconds: float) -> None:
    assert durations.parse(value) == pytest.approx(seconds)


@pytest.mark.parametrize("value", [-1, "-1", "-5m", -0.5, 1e12, "100000h"])
def test_negative_or_huge_means_never(value: object) -> None:
    assert durations.parse(value) is None


@pytest.mark.parametrize("value", ["soon", "5 m", "m", "", "5mm", "1h-5m", "nan", True, None, [1], {"s": 1}, "9" * 100])
def test_anything_else_is_refused_with_the_forms_it_takes(value: object) -> None:
    with pytest.raises(durations.BadDuration):
        durations.parse(value)


def test_nan_is_refused() -> None:
    with pytest.raises(durations.BadDuration):
        durations.parse(float("nan"))


def test_shown() -> None:
    assert [durations.shown(s) for s in (None, 0, 90, 300, 7200)] == ["never", "0 s", "90 s", "5 min", "2.0 h"]
