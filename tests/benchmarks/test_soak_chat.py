"""scripts/soak_chat.py in its quick mode: 20 turns on a 256-token context with
SmolLM2, through ChatSession on llama.cpp. The context must shift, no turn may
fail, and resident memory must stay within 5% after the warm-up; the full
1,000-turn run's figures are in the closing notes."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO


@pytest.mark.slow
def test_soak_quick_passes_and_reports_memory() -> None:
    r = subprocess.run([sys.executable, "scripts/soak_chat.py", "--quick", "--json", "--threads", "1"],
                       cwd=REPO, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stdout + r.stderr
    out = json.loads(r.stdout.strip().splitlines()[-1])
    assert out["turns"] == 20 and out["failed_turns"] == 0 and out["pass"] is True
    assert out["context_shifts"] > 0 and out["generated_tokens"] > 20
    assert out["rss_after_warmup_bytes"] > 50e6 and abs(out["rss_growth_percent"]) <= 5
    assert out["rss_end_bytes"] == pytest.approx(out["rss_after_warmup_bytes"] * (1 + out["rss_growth_percent"] / 100), rel=1e-3)


def test_soak_refuses_a_warmup_longer_than_the_run() -> None:
    r = subprocess.run([sys.executable, "scripts/soak_chat.py", "--turns", "5", "--warmup", "10"],
                       cwd=REPO, capture_output=True, text=True, timeout=60)
    assert r.returncode == 2 and "--turns must exceed the warm-up (10)" in r.stderr
