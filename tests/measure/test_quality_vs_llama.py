"""``quantize --compare`` against llama-perplexity on a real pair: SmolLM2 made
F16 and then Q4_0 by localllm's quantizer, where KL divergence is far from 0 and
top-1 agreement below 100%, so agreement between the two tools means something
(a model against itself gives KL 0 by construction). This is also
scripts/quality_vs_llama.py's quick mode (the pair is what ``--quick`` makes), so
one run checks the script cannot rot and that both tools agree."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from tests.helpers.paths import REPO


@pytest.mark.slow
def test_kl_and_top1_agree_with_llama_perplexity_on_f16_to_q4_0() -> None:
    out = subprocess.run([sys.executable, "-m", "scripts.quality_vs_llama", "--quick"],
                         capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert out.returncode == 0, out.stdout + out.stderr  # every figure within its target
    assert "Traceback" not in out.stderr
    assert "smollm2-F16.gguf -> smollm2-Q4_0.gguf" in out.stdout
    ppl = re.search(r"reference perplexity\s+([\d.]+)\s+([\d.]+)", out.stdout)
    kl = re.search(r"mean KL divergence\s+([\d.]+)\s+([\d.]+)", out.stdout)
    top = re.search(r"same top \(%\)\s+([\d.]+)\s+([\d.]+)", out.stdout)
    assert ppl and kl and top, out.stdout
    assert float(kl.group(1)) > 0.01 and float(kl.group(2)) > 0.01, out.stdout  # a real loss, measured by both
    assert float(top.group(1)) < 99.0 and float(top.group(2)) < 99.0, out.stdout
