"""The engine refuses options llama.cpp would assert on, from any caller."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers.cli import cli


@pytest.mark.slow
@pytest.mark.parametrize("extra", [["--ctx", "1", "--batch", "1"], ["--batch", "1"], ["--ctx", "1"], ["--batch", "2", "--ubatch", "64"]])
def test_tiny_context_and_batch_do_not_reach_llama_asserts(synth_model: Path, extra: list[str]) -> None:
    """--ctx 1 --batch 1 aborted in GGML_ASSERT(n_tokens_all <= cparams.n_batch):
    the prompt was sent in chunks of 2. Now no chunk is larger than the batch."""
    proc = cli("run", str(synth_model), "--raw", "-p", "the cat sat on the mat", "-n", "3", "--temp", "0", "--json", *extra)
    assert proc.returncode == 0, proc.stderr[-2000:]
    d = json.loads(proc.stdout)
    assert d["generated_tokens"] == 3 and d["prompt_tokens"] > 2


def test_engine_refuses_absurd_configs_from_any_caller(synth_model: Path) -> None:
    from localllm.engine import LlamaCppBackend
    from localllm.engine_api import LoadConfig
    from localllm.errors import UsageError

    for cfg in (LoadConfig(n_ctx=256, n_threads=10**6), LoadConfig(n_ctx=1 << 40), LoadConfig(n_ctx=256, n_batch=0)):
        with LlamaCppBackend() as b, pytest.raises(UsageError):
            b.load(synth_model, cfg)
