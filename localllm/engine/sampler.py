"""llama.cpp's sampler chain for one ``SamplingConfig``.

Its own module because two engines build it (one sequence here, one chain per
sequence in ``batch_engine``) and both must sample the same way, in llama.cpp's
order (common/sampling.cpp): the repeat penalty, then greedy at temperature 0,
else top-k, top-p, min-p, temperature, then a seeded draw.
"""

from __future__ import annotations

import ctypes
from collections.abc import Sequence

import llama_cpp
import numpy as np

from localllm.engine import grammar
from localllm.engine.logprobs import logits_row
from localllm.engine_api import SamplingConfig
from localllm.engine_api.records import PENALTY_LAST_N
from localllm.errors import EngineError


def new_sampler(s: SamplingConfig, n_vocab: int = 0, vocab: object = None, *, grammar_in_chain: bool = True) -> object:
    """A sampler chain the caller frees with ``free_sampler``. Penalties at
    their neutral values (repeat 1.0, presence and frequency 0) add no sampler
    (llama.cpp's default: penalties off). A grammar
    (``s.grammar``, needs the model's ``vocab``) comes first, so every sampler
    after it sees only the tokens it allows; ``grammar_in_chain=False`` leaves
    it out, for a caller that checks the pick against it (checked_sampler)."""
    chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
    if s.logit_bias:
        biases = (llama_cpp.llama_logit_bias * len(s.logit_bias))(*(llama_cpp.llama_logit_bias(t, b) for t, b in s.logit_bias))
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_logit_bias(n_vocab, len(s.logit_bias), biases))
    if s.grammar is not None and grammar_in_chain:
        try:
            llama_cpp.llama_sampler_chain_add(chain, grammar.init(vocab, s.grammar, s.grammar_triggers))
        except BaseException:
            llama_cpp.llama_sampler_free(chain)
            raise
    if s.penalized:
        llama_cpp.llama_sampler_chain_add(
            chain, llama_cpp.llama_sampler_init_penalties(n_vocab, PENALTY_LAST_N, s.repeat_penalty, s.frequency_penalty, s.presence_penalty))
    if s.temperature <= 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_greedy())
        return chain
    seed = llama_cpp.LLAMA_DEFAULT_SEED if s.seed is None else s.seed & 0xFFFFFFFF
    if s.top_k > 0:
        llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_k(s.top_k))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_top_p(s.top_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_min_p(s.min_p, 1))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_temp(s.temperature))
    llama_cpp.llama_sampler_chain_add(chain, llama_cpp.llama_sampler_init_dist(seed))
    return chain


def prime(chain: object, s: SamplingConfig, tokens: Sequence[int], *, grammar_in_chain: bool = True) -> None:
    """Show the chain the prompt's last tokens, as llama-cli and llama-server do,
    so the repeat penalty also covers what the user wrote; a no-op without one."""
    if s.penalized:
        # the penalty sampler alone: a grammar before it must not take the prompt for the reply
        penalties = llama_cpp.llama_sampler_chain_get(chain, int(bool(s.logit_bias)) + int(s.grammar is not None and grammar_in_chain))
        for t in tokens[-PENALTY_LAST_N:]:
            llama_cpp.llama_sampler_accept(penalties, t)


def free_sampler(chain: object) -> None:
    llama_cpp.llama_sampler_free(chain)


def sample(chain: object, ctx: object, i: int = -1) -> int:
    """Sample (and accept) a token from row ``i`` of the last decode's logits."""
    return int(llama_cpp.llama_sampler_sample(chain, ctx, i))


def plain_greedy(s: SamplingConfig) -> bool:
    """Whether ``new_sampler(s)`` would be llama.cpp's greedy sampler alone: no
    logit bias, grammar or penalties before it."""
    return s.temperature <= 0 and not s.logit_bias and s.grammar is None and not s.penalized


def first_max(logits: np.ndarray) -> int | None:
    """llama.cpp's greedy pick over a row of logits in id order: the first
    maximum (``llama_sampler_greedy_apply`` in src/llama-sampler.cpp keeps a
    candidate only when it is strictly greater). None when the row holds a
    NaN, which that loop's comparisons treat in their own way."""
    tok = int(logits.argmax())  # numpy's argmax: the first maximum, or the first NaN
    return None if logits[tok] != logits[tok] else tok


def first_max_rows(ctx: object, entries: Sequence[int], n_vocab: int) -> list[int | None]:
    """``first_max`` of the logits row of each batch entry in ``entries``, from one
    numpy argmax over the block of rows that holds them: llama.cpp keeps a step's
    rows in one buffer, ``n_vocab`` floats apart (``llama_context::get_logits_ith``
    in src/llama-context.cpp returns ``logits.data + j*n_vocab``). serve samples a
    greedy step this way: one call instead of a view and an argmax per row, on the
    engine thread's serial path between two decodes, where Python runs about 3x
    slower than warm (the decode has evicted its caches: 300 against 96 us a step
    of 8 rows here). None for a row with a NaN, as ``first_max``."""
    addrs = []
    for i in entries:
        ptr = llama_cpp.llama_get_logits_ith(ctx, i)
        if not ptr:
            raise EngineError(f"no logits for batch entry {i}")
        addrs.append(ctypes.addressof(ptr.contents))
    stride = 4 * n_vocab
    lo = min(addrs)
    if any((a - lo) % stride for a in addrs):  # not rows of one buffer: never from llama.cpp, but then row by row
        return [first_max(logits_row(ctx, i, n_vocab)) for i in entries]
    rows = [(a - lo) // stride for a in addrs]
    block = np.ctypeslib.as_array(ctypes.cast(lo, ctypes.POINTER(ctypes.c_float)), shape=(max(rows) + 1, n_vocab))
    best = block.argmax(axis=1)  # per row: the first maximum, or the first NaN
    picks: list[int | None] = []
    for r in rows:
        tok = int(best[r])
        value = block[r, tok]
        picks.append(None if value != value else tok)
    return picks


class Greedy:
    """Greedy decoding with nothing else in the chain, as numpy's argmax of the
    logits row: the token llama.cpp's greedy sampler picks (``first_max``),
    without copying the row into a 49,152-entry candidate array first
    (``llama_sampler_sample``): 26 against 57 us a row for SmolLM2 here, on the
    engine thread's serial path between two decodes. A row with a NaN goes to
    llama.cpp's own greedy sampler."""

    def __init__(self, n_vocab: int) -> None:
        self.n_vocab = n_vocab
        self._chain: object = None  # llama.cpp's greedy sampler, made for a row with a NaN

    def sample(self, ctx: object, i: int) -> int:
        tok = first_max(logits_row(ctx, i, self.n_vocab))
        if tok is not None:
            return tok
        if self._chain is None:
            self._chain = llama_cpp.llama_sampler_init_greedy()
        return int(llama_cpp.llama_sampler_sample(self._chain, ctx, i))

    def free(self) -> None:
        if self._chain is not None:
            llama_cpp.llama_sampler_free(self._chain)
            self._chain = None
