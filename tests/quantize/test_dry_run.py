"""``quantize --dry-run`` predicts the file llama.cpp writes: tensor data, the
metadata and tensor table, and alignment padding (issue 12: 3.5% short before,
on small files where the header weighs most)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from scripts.synth_gguf import SynthSpec, write_llama_gguf
from tests.helpers.cli import cli


@pytest.fixture(scope="module")
def f16_source(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # rows of 256 values, so the k-quants apply to every matrix
    return write_llama_gguf(tmp_path_factory.mktemp("qsize") / "synth-F16.gguf", SynthSpec(n_layer=2, n_embd=256, n_head=4, n_head_kv=2, n_ff=512, dtype="f16"))


@pytest.mark.slow
@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_0", "Q4_K_M"])
def test_dry_run_size_is_the_file_size(f16_source: Path, tmp_path: Path, qtype: str) -> None:
    out = tmp_path / f"synth-{qtype}.gguf"
    dry = cli("quantize", str(f16_source), str(out), "--type", qtype, "--dry-run", "--json")
    assert dry.returncode == 0, dry.stderr
    assert not out.exists()
    predicted = json.loads(dry.stdout)["output_bytes"]
    real = cli("quantize", str(f16_source), str(out), "--type", qtype, "--json")
    assert real.returncode == 0, real.stderr
    written = out.stat().st_size
    assert json.loads(real.stdout)["output_bytes"] == written
    assert abs(predicted - written) <= 0.02 * written, (predicted, written)
    assert predicted == written  # the layout is rebuilt exactly, not estimated
