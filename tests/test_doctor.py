"""``localllm doctor``: measured timings, the roofline, a bottleneck and ranked actions."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from localllm.roofline import measure_bandwidth, roofline
from tests.conftest import run_cli


def test_roofline_arithmetic() -> None:
    r = roofline(50e9, weights_bytes=400_000_000, kv_bytes=100_000_000, measured=60.0)
    assert r.bytes_per_token == 500_000_000 and r.ceiling_tokens_per_s == pytest.approx(100.0)
    assert r.efficiency == pytest.approx(0.6)


def test_bandwidth_is_measured() -> None:
    bw = measure_bandwidth(mib=64, passes=2)
    assert 0.5e9 < bw < 2e12  # a streaming copy: from a slow laptop to an HBM part


def test_prompt_file_errors(tmp_path: Path) -> None:
    proc = run_cli("doctor", "--prompt-file", str(tmp_path / "nope.txt"))
    assert proc.returncode == 1 and "prompt file not found" in proc.stderr and "Traceback" not in proc.stderr


@pytest.mark.slow
def test_doctor_json(tmp_path: Path) -> None:
    prompt = tmp_path / "prompt.txt"
    prompt.write_text("Explain what a KV cache is, in detail. " * 20)
    proc = run_cli("doctor", "--prompt-file", str(prompt), "--gen-tokens", "24", "--json")
    assert proc.returncode == 0, proc.stderr
    d = json.loads(proc.stdout)
    for key in ("bottleneck", "ttft_ms", "itl_p50_ms", "prompt_tokens", "bandwidth_gb_per_s", "decode_ceiling_tokens_per_s", "decode_efficiency", "actions"):
        assert key in d, key
    assert d["bottleneck"] in ("prefill", "decode")
    assert d["prompt_tokens"] > 100 and d["generated_tokens"] == 24
    assert d["decode_ceiling_tokens_per_s"] > 0 and 0 < d["decode_efficiency"] < 5
    assert d["bytes_per_token"] > 60 * 1024 * 1024  # SmolLM2 Q4_1 reads ~90 MiB of weights per token
    assert 1 <= len(d["actions"]) <= 3 and all(a["action"] and a["expected"] for a in d["actions"])
    assert d["kv_q8_0_kl_mean"] is not None and 0 < d["kv_q8_0_kl_mean"] < 0.2
    kv = d["kv_types"]
    assert set(kv) == {"f16", "q8_0", "q4_0"} and kv["q4_0"]["max_ctx"] >= kv["q8_0"]["max_ctx"] >= kv["f16"]["max_ctx"] > 0
    assert 0 < kv["q8_0"]["kl_mean"] < kv["q4_0"]["kl_mean"]  # measured: the smaller cache costs more
    assert d["speculative_gain"] > 0 and 0 <= d["speculative_acceptance"] <= 1
    recommended = any("--speculate" in a["action"] for a in d["actions"])
    assert recommended == (d["bottleneck"] == "decode" and d["speculative_gain"] >= 1.05)
