"""Absurd option values are one-line usage errors, not llama.cpp asserts."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import cli, one_line


@pytest.mark.parametrize(
    "args, needle",
    [
        (["--threads", "100000"], "--threads must be at most"),
        (["--ctx", "99999999999"], "--ctx must be at most"),
        (["--batch", "4294967297"], "--batch must be at most"),
        (["--ngl", "99999999999"], "--ngl must be at most"),
        (["--temp", "inf"], "finite"),
        (["--seed", "99999999999"], "--seed must be at most"),
        (["--draft-k", "100000"], "--draft-k must be at most"),
    ],
)
def test_absurd_options_are_usage_errors(synth_model: Path, args: list[str], needle: str) -> None:
    one_line(cli("run", str(synth_model), "-p", "x", *args), 2, needle)


def test_a_context_past_the_trained_one_is_warned_about(smollm2: Path) -> None:
    r = cli("plan", str(smollm2), "--ctx", "10000", "--no-dry-run")
    assert r.returncode == 0, r.stderr
    assert "--ctx 10,000 is beyond the 8,192 tokens this model was trained on" in r.stderr
    quiet = cli("plan", str(smollm2), "--ctx", "8192", "--no-dry-run")
    assert "trained on" not in quiet.stderr
