"""``localllm bench`` on real llama.cpp: rows, keys and figures that make sense."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.measure.bench import random_prompt
from tests.helpers.cli import cli


def test_random_prompt_is_seeded() -> None:
    a = random_prompt(50, 1000, bos=1, seed=3)
    assert a == random_prompt(50, 1000, bos=1, seed=3) != random_prompt(50, 1000, bos=1, seed=4)
    assert a[0] == 1 and all(0 <= t < 1000 for t in a)


@pytest.mark.slow
def test_bench_json(synth_model: Path) -> None:
    proc = cli("bench", str(synth_model), "--prompt-tokens", "16,40", "--gen-tokens", "8", "--reps", "2", "--json")
    assert proc.returncode == 0, proc.stderr
    rows = json.loads(proc.stdout)
    assert [r["prompt_tokens"] for r in rows] == [16, 40]
    for r in rows:
        assert r["gen_tokens"] == 8 and r["reps"] == 2
        for key in ("pp_tokens_per_s", "tg_tokens_per_s", "ttft_ms", "itl_p50_ms", "itl_p95_ms"):
            assert r[key] > 0, key
        assert r["itl_p50_ms"] <= r["itl_p95_ms"]
        assert r["pp_std"] >= 0 and r["tg_std"] >= 0


@pytest.mark.slow
def test_missing_figures_are_null_and_na_not_zero(synth_model: Path) -> None:
    """--reps 1 has no spread and --gen-tokens 1 no decode: null in JSON, n/a in
    the table, never 0 (issue 12)."""
    proc = cli("bench", str(synth_model), "--prompt-tokens", "16", "--gen-tokens", "1", "--reps", "1", "--json")
    assert proc.returncode == 0, proc.stderr
    (row,) = json.loads(proc.stdout)
    assert row["pp_std"] is None and row["tg_std"] is None and row["tg_tokens_per_s"] is None
    assert row["itl_p50_ms"] is None and row["pp_tokens_per_s"] > 0
    table = cli("bench", str(synth_model), "--prompt-tokens", "16", "--gen-tokens", "1", "--reps", "1")
    assert table.returncode == 0, table.stderr
    line = next(ln for ln in table.stdout.splitlines() if ln.startswith("| 16 |"))
    assert "± n/a" in line and "n/a ± n/a" in line and "0.00" not in line, line


@pytest.mark.slow
def test_bench_table_on_default_model() -> None:
    proc = cli("bench", "--prompt-tokens", "32", "--gen-tokens", "8", "--reps", "2")
    assert proc.returncode == 0, proc.stderr
    assert "| 32 | 8 |" in proc.stdout and "±" in proc.stdout and "Q4_1" in proc.stdout
    assert "warm-up" in proc.stderr


@pytest.mark.slow
def test_bench_context_too_small(synth_model: Path) -> None:
    proc = cli("bench", str(synth_model), "--prompt-tokens", "600", "--gen-tokens", "8", "--ctx", "256")
    assert proc.returncode == 2 and "exceed --ctx 256" in proc.stderr
