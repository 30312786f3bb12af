"""Scoring logits (engine.scorer): quality reads only each chunk's second half,
and asks llama.cpp for those rows alone. The rows it gets are the same numbers
as the same positions of a full scoring: only the output head's work is saved."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from localllm.engine_api import LoadConfig
from localllm.engine_api.errors import InvalidSetting


@pytest.mark.slow
def test_rows_from_a_position_are_the_full_scorings_rows(smollm2: Path) -> None:
    from localllm.engine import LlamaCppBackend

    with LlamaCppBackend() as be:
        be.load(smollm2, LoadConfig(n_ctx=64, n_batch=64, n_ubatch=64, n_outputs_max=0, n_threads=1))
        toks = be.tokenize("The quick brown fox jumps over the lazy dog, and then it sleeps in the sun.")
        assert len(toks) > 16
        full = be.logits(toks)
        assert full.shape[0] == len(toks) and full.shape[1] > 40_000  # 49,152 ids
        half = be.logits(toks, len(toks) // 2)
        assert half.shape == (len(toks) - len(toks) // 2, full.shape[1])
        assert np.array_equal(half, full[len(toks) // 2:])  # the same numbers, not just close
        assert np.array_equal(be.logits(toks, len(toks) - 1), full[-1:])
        for bad in (-1, len(toks)):
            with pytest.raises(InvalidSetting, match="scoring from position"):
                be.logits(toks, bad)
