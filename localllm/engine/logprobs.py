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


def post_sampling_probs(ctx: object, i: int, n_vocab: int, token: int, n_top: int, s) -> tuple[float, list[tuple[int, float]]]:
    """(p of ``token``, the ``n_top`` likeliest tokens with theirs, best first) of the
    distribution ``s`` (a ``SamplingConfig``) draws from at row ``i``: llama-server's
    ``post_sampling_probs``. Derived by llama.cpp's own rules, in its chain's order
    (engine/sampler.py; src/llama-sampler.cpp): the logit bias, top-k, top-p and
    min-p (each keeping at least one token), the temperature, then the softmax over
    what is left; a token the samplers removed has no probability and is not listed.
    Greedy decoding (temperature 0) keeps the one token it picks, at 1. Penalties and
    grammars change the row by the reply so far, which this does not replay: the
    request's parser refuses them with ``post_sampling_probs``."""
    if s.temperature <= 0:
        return 1.0, ([(token, 1.0)] if n_top > 0 else [])
    logits = logits_row(ctx, i, n_vocab).astype(np.float64)
    for t, bias in s.logit_bias:
        logits[t] += bias
    order = np.argsort(-logits, kind="stable")  # best first, ties by id
    if 0 < s.top_k < n_vocab:
        order = order[: s.top_k]
    kept = logits[order]
    if s.top_p < 1.0:  # the smallest head whose probability reaches top_p (llama_sampler_top_p_apply)
        p = np.exp(kept - kept[0])
        n = max(1, int(np.searchsorted(np.cumsum(p / p.sum()), s.top_p)) + 1)
        order, kept = order[:n], kept[:n]
    if s.min_p > 0.0:  # p >= min_p * p_max, as logits (llama_sampler_min_p_apply)
        keep = kept >= kept[0] + np.log(s.min_p)
        keep[0] = True
        order, kept = order[keep], kept[keep]
    z = kept / s.temperature
    p = np.exp(z - z.max())
    p /= p.sum()
    probs = {int(t): float(v) for t, v in zip(order, p)}
    top = [(int(t), float(v)) for t, v in zip(order[:n_top], p[:n_top]) if v > 0.0]
    return probs.get(token, 0.0), top
