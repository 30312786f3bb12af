"""localllm.measure.quality: the statistics llama-perplexity reports, on llama-perplexity's chunks."""

from __future__ import annotations

import math

import numpy as np
import pytest

from localllm.measure.quality import compare


def _recording(n_vocab: int, seen: list[list[int]]):
    def logits(tokens, first):
        seen.append(list(tokens))
        out = np.zeros((len(tokens) - first, n_vocab), dtype=np.float32)
        for i, t in enumerate(tokens[first:]):
            out[i, (t + 1) % n_vocab] = 4.0  # predicts "the next id"
        return out

    return logits


def test_each_chunk_starts_with_bos_as_llama_perplexity_does() -> None:
    """tools/perplexity/perplexity.cpp puts BOS in place of every chunk's first
    token; scoring without it made Gemma 3's perplexity 3x llama.cpp's."""
    seen: list[list[int]] = []
    tokens = list(range(10, 10 + 64))
    compare(_recording(200, seen), {}, tokens, chunk=16, bos=2)
    assert len(seen) == 4 and all(w[0] == 2 for w in seen)
    assert [w[1:] for w in seen] == [tokens[i * 16 + 1 : (i + 1) * 16] for i in range(4)]
    seen.clear()
    compare(_recording(200, seen), {}, tokens, chunk=16, bos=None)
    assert [w[0] for w in seen] == [10, 26, 42, 58]


def _sure_in_second_half(n_vocab: int, sure: float, unsure: float):
    """A model that predicts "the next id" with logit ``sure`` in the second half
    of its window and ``unsure`` in the first: which half is scored shows in the
    perplexity, not only in the count of positions."""

    def logits(tokens, first):
        """All rows, cut to those asked for: a row before the scored half would show as the wrong count."""
        out = np.zeros((len(tokens), n_vocab), dtype=np.float32)
        for i, t in enumerate(tokens):
            out[i, (t + 1) % n_vocab] = sure if i >= len(tokens) // 2 else unsure
        return out[first:]

    return logits


def test_scores_only_the_second_half_of_each_chunk() -> None:
    # ids count up, so every scored target is the predicted one and the NLL is
    # known in closed form: logit 4 among 200 in the second half, 1 in the first
    tokens = list(range(10, 10 + 32))
    model = _sure_in_second_half(200, 4.0, 1.0)
    (row,) = compare(model, {"same": model}, tokens, chunk=16, bos=None)
    p = math.exp(4) / (math.exp(4) + 199)
    assert row.positions == 2 * (16 - 1 - 8)  # n_ctx - 1 - n_ctx/2 per chunk, as llama-perplexity
    assert row.reference_perplexity == pytest.approx(1 / p) and row.kl_mean == pytest.approx(0, abs=1e-9)
    assert row.top1_agreement == 1.0
