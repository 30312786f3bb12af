"""Log-probabilities of the model's distribution at one row of logits.

As llama-server reports them by default (``get_token_probabilities`` in
tools/server/server-common.cpp, ``post_sampling_probs`` off) and as OpenAI
defines ``logprobs``: a log-softmax over the whole vocabulary of the raw
logits, before any sampler (temperature, top-k, penalties, grammar) touches
them, so a value does not depend on the request's sampling settings.
"""

from __future__ import annotations

import llama_cpp
import numpy as np

from localllm.errors import EngineError


def logits_row(ctx: object, i: int, n_vocab: int) -> np.ndarray:
    """Row ``i`` of the last decode's logits (a batch index, as llama_get_logits_ith
    takes) as a float32 view of llama.cpp's buffer, valid until the next decode."""
    ptr = llama_cpp.llama_get_logits_ith(ctx, i)
    if not ptr:
        raise EngineError(f"no logits for batch entry {i}")
    return np.ctypeslib.as_array(ptr, shape=(n_vocab,))


def row_logprobs(ctx: object, i: int, n_vocab: int, token: int, n_top: int) -> tuple[float, list[tuple[int, float]]]:
    """(log p of ``token``, the ``n_top`` most likely tokens with theirs, best first)
    from row ``i`` of the last decode's logits (a batch index, as llama_get_logits_ith takes)."""
    logits = logits_row(ctx, i, n_vocab).astype(np.float64)
    peak = float(logits.max())
    lse = peak + float(np.log(np.exp(logits - peak).sum()))
    top: list[tuple[int, float]] = []
    if n_top > 0:
        k = min(n_top, n_vocab)
        idx = np.argpartition(-logits, k - 1)[:k]
        idx = idx[np.lexsort((idx, -logits[idx]))]  # by logit, ties by id: a stable order
        top = [(int(t), float(logits[t]) - lse) for t in idx]
    return float(logits[token]) - lse, top
