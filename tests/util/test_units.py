"""One size parser and formatter: GB = 10⁹, GiB = 2³⁰, both accepted, shown as typed."""

from __future__ import annotations

import json

import pytest

from localllm.errors import UsageError
from localllm.util import fmt, units
from tests.helpers.cli import cli


@pytest.mark.parametrize("text, n, unit", [
    ("4GB", 4 * 10**9, "GB"), ("4GiB", 4 * 2**30, "GiB"), ("4 gib", 4 * 2**30, "GiB"), ("4G", 4 * 10**9, "GB"),
    ("512MB", 512 * 10**6, "MB"), ("512MiB", 512 * 2**20, "MiB"), ("1.5 GiB", int(1.5 * 2**30), "GiB"),
    ("4", 4 * 2**30, "GiB"), ("0.5", 2**29, "GiB"), ("2TB", 2 * 10**12, "TB"), ("100b", 100, "B"), ("64KiB", 2**16, "KiB"),
])
def test_both_kinds_of_unit_are_accepted_and_remembered(text: str, n: int, unit: str) -> None:
    s = units.parse_size(text)
    assert s == n and s.unit == unit


@pytest.mark.parametrize("bad", ["-1", "0", "0GB", "abc", "4XB", "", "4 G B", "1e9", "0.1b"])
def test_nonsense_is_refused_with_the_forms_named(bad: str) -> None:
    with pytest.raises(UsageError, match="size"):
        units.parse_size(bad)


def test_shown_as_typed_or_in_binary_units() -> None:
    assert units.format_size(units.parse_size("6GB")) == "6.00 GB"
    assert units.format_size(units.parse_size("4GiB")) == "4.00 GiB"
    assert units.format_size(units.parse_size("512MB")) == "512.00 MB"
    assert units.format_size(units.parse_size("3145728B")) == "3.00 MiB"  # plain bytes read better scaled
    assert units.format_size(6 * 10**9) == "5.59 GiB"  # an untyped size: binary
    assert units.format_size(3 * 2**20) == "3.00 MiB" and units.format_size(2048) == "2.00 KiB" and units.format_size(5) == "5 B"
    assert units.format_size(4 * 2**30, "GB") == "4.29 GB" and units.format_size(4 * 2**30, digits=0) == "4 GiB"
    assert fmt.size(units.parse_size("6GB")) == "6.00 GB" and fmt.size(4 * 2**30) == "4.00 GiB"
    assert json.dumps({"vram": units.parse_size("6GB")}) == '{"vram": 6000000000}'  # JSON stays bytes


@pytest.mark.slow
def test_vram_is_shown_in_the_unit_typed(synth_model) -> None:
    gb = cli("list", "--vram", "6GB")
    gib = cli("list", "--vram", "6GiB")
    assert gb.returncode == 0 and gib.returncode == 0, gb.stderr + gib.stderr
    assert "FITS (6.00 GB GPU)" in gb.stdout and "FITS (6.00 GiB GPU)" in gib.stdout
    bad = cli("list", "--vram", "6XB")
    assert bad.returncode == 2 and "6GB (6·10⁹ bytes)" in bad.stderr and len(bad.stderr.strip().splitlines()) == 1


@pytest.mark.slow
def test_plan_shows_the_budget_as_typed_and_computes_with_it(synth_model) -> None:
    for typed, shown, n in (("6GB", "GPU budget 6.00 GB (--vram)", 6 * 10**9), ("6GiB", "GPU budget 6.00 GiB (--vram)", 6 * 2**30)):
        text = cli("plan", str(synth_model), "--vram", typed)
        assert text.returncode == 0 and shown in text.stdout, text.stdout + text.stderr
        data = json.loads(cli("plan", str(synth_model), "--vram", typed, "--json").stdout)
        assert data["budget_gpu_bytes"] == n
