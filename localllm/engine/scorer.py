"""Scoring: logits at many positions in one batch, for speculative decoding
(is the draft what the model would pick?) and for quality (perplexity, KL).

Generation needs one row of logits per decode; these need a row per position,
which is why they build their own ``llama_batch`` with every position marked.
"""

from __future__ import annotations

from collections.abc import Sequence

import llama_cpp

from localllm.engine.kvcache import KVCache
from localllm.engine.logprobs import logits_row
from localllm.engine.model import ModelHandle
from localllm.engine_api import Verification
from localllm.engine_api.errors import InvalidSetting
from localllm.errors import EngineError


def decode_all(handle: ModelHandle, tokens: Sequence[int], start: int, first: int = 0) -> int:
    """Evaluate ``tokens`` at positions ``start``.. with logits for each from
    index ``first`` on; returns nanoseconds (decode + synchronize)."""
    n = len(tokens)
    batch = llama_cpp.llama_batch_init(n, 0, 1)
    try:
        batch.n_tokens = n
        for i, tok in enumerate(tokens):
            batch.token[i] = tok
            batch.pos[i] = start + i
            batch.n_seq_id[i] = 1
            batch.seq_id[i][0] = 0
            batch.logits[i] = i >= first
        return handle.decode_batch(batch)
    finally:
        llama_cpp.llama_batch_free(batch)


def verify(handle: ModelHandle, cache: KVCache, tokens: Sequence[int]) -> Verification:
    """Evaluate ``tokens`` after the cache in one batch and return, for each
    position, the most likely next token (greedy). Speculative decoding
    checks a draft with this; needs ``n_outputs_max >= len(tokens)``."""
    handle.require()
    n = len(tokens)
    if n > handle.n_outputs_max:
        # llama.cpp asserts (aborts the process) past n_outputs_max: refuse instead.
        raise EngineError(f"verifying {n} tokens needs a context loaded with n_outputs_max >= {n} (it has {handle.n_outputs_max})")
    if n > handle.n_batch:
        raise InvalidSetting(f"verifying {n} tokens at once needs {{n_batch}} {n} or more")
    n_vocab = handle.n_vocab
    ns = decode_all(handle, tokens, cache.pos())
    cache.record(tokens)
    out = []
    for i in range(n):
        out.append(int(logits_row(handle.ctx, i, n_vocab).argmax()))
    return Verification(out, ns)


def logits(handle: ModelHandle, cache: KVCache, tokens: Sequence[int], first: int = 0):
    """Logits at each position of ``tokens`` from index ``first`` on, evaluated
    from an empty cache (a float32 array of shape [len(tokens) - first, n_vocab]).
    Quality scoring reads only a chunk's second half: asking llama.cpp for those
    rows alone skips the output head on the first half (SmolLM2's is a fifth of
    its weights, gemma3-270m's over half). Needs a context loaded with
    ``n_outputs_max=0`` and ``n_batch >= len(tokens)``."""
    import numpy as np

    handle.require()
    n = len(tokens)
    if n > handle.n_batch:
        raise InvalidSetting(f"scoring {n} tokens needs {{n_batch}} {n} or more")
    if not 0 <= first < n:
        raise InvalidSetting(f"scoring from position {first} of {n} tokens: it must be below {n}")
    n_vocab = handle.n_vocab
    cache.reset()
    try:
        decode_all(handle, tokens, 0, first)
        ptr = llama_cpp.llama_get_logits(handle.ctx)  # the output rows, in batch order
        return np.ctypeslib.as_array(ptr, shape=(n - first, n_vocab)).copy()
    finally:
        cache.reset()
