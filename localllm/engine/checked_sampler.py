"""Grammar-constrained sampling, "sample then check" (llama.cpp common/sampling.cpp).

llama.cpp's grammar sampler costs in proportion to the tokens it is shown: run
first on the whole vocabulary (SmolLM2's 49,152 tokens) it took 14.6 ms a
token here, more than the 135M model's decode. llama-server shows it only the
token the rest of the chain picked: one token to check, and only when the
grammar refuses that one does it filter the whole vocabulary and sample again.
The reply is drawn from the same distribution as with the grammar first (a
refused token is never emitted; a resample sees the grammar's filter), and is
identical under greedy decoding.

The chain here is everything but the grammar (logit bias, penalties, top-k ...,
the draw), the grammar a sampler of its own; both accept each token. The
candidates live in one numpy array per sequence, refilled from the logits row
at each step (the samplers sort and cut it in place).
"""

from __future__ import annotations

import ctypes
import math
import time

import llama_cpp
import numpy as np

from localllm.engine import grammar as _grammar
from localllm.engine.logprobs import logits_row
from localllm.errors import EngineError, InputError

TOKEN_DATA = _grammar.TOKEN_DATA


class GrammarTooSlow(InputError):
    """A grammar's filter of the vocabulary took longer than ``grammar.MAX_STEP_SECONDS``."""


class CheckedSampler:
    """A sampler chain without the grammar, and the grammar checking its pick."""

    def __init__(self, chain: object, grammar: object, n_vocab: int) -> None:
        assert TOKEN_DATA.itemsize == ctypes.sizeof(llama_cpp.llama_token_data)
        self.chain, self.grammar, self.n_vocab = chain, grammar, n_vocab
        self.failed = ""  # why the request ended here (GrammarTooSlow's message), read by serve's scheduler
        self._ids = np.arange(n_vocab, dtype=np.int32)
        self._cur = np.zeros(n_vocab, dtype=TOKEN_DATA)
        self._data = self._cur.ctypes.data_as(ctypes.POINTER(llama_cpp.llama_token_data))
        self._one = llama_cpp.llama_token_data(0, 1.0, 0.0)
        self._one_arr = llama_cpp.llama_token_data_array(ctypes.pointer(self._one), 1, -1, False)

    def _candidates(self, ctx: object, i: int) -> llama_cpp.llama_token_data_array:
        self._cur["id"] = self._ids
        self._cur["logit"] = logits_row(ctx, i, self.n_vocab)
        self._cur["p"] = 0.0
        return llama_cpp.llama_token_data_array(self._data, self.n_vocab, -1, False)

    def _pick(self, ctx: object, i: int, *, grammar_first: bool) -> int:
        cur = self._candidates(ctx, i)
        if grammar_first:
            t0 = time.thread_time()  # this thread's CPU: the grammar's own cost, not a busy machine's wait
            llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(cur))
            took = time.thread_time() - t0
            if took > _grammar.MAX_STEP_SECONDS:  # ends this request (serve: this slot only), not the next token's wait
                self.failed = _grammar.too_slow(took)
                raise GrammarTooSlow(self.failed)
        llama_cpp.llama_sampler_apply(self.chain, ctypes.byref(cur))
        if not 0 <= cur.selected < cur.size:
            raise EngineError("the sampler chain selected no token")
        return int(cur.data[cur.selected].id)

    def allows(self, token: int) -> bool:
        """Whether the grammar, in its current state, takes ``token`` next."""
        self._one.id, self._one.logit, self._one.p = token, 1.0, 0.0  # type: ignore[assignment]  # ctypes converts
        self._one_arr.size, self._one_arr.selected, self._one_arr.sorted = 1, -1, False
        llama_cpp.llama_sampler_apply(self.grammar, ctypes.byref(self._one_arr))
        return not math.isinf(self._one.logit)

    def sample(self, ctx: object, i: int) -> int:
        """Sample (and accept) a token from row ``i`` of the last decode's logits."""
        token = self._pick(ctx, i, grammar_first=False)
        if not self.allows(token):
            token = self._pick(ctx, i, grammar_first=True)
        llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)
        return token

    def accept(self, token: int) -> None:
        """``token`` taken without sampling (a thinking budget forced it): the chain
        sees it, and the grammar where it takes it (a lazy grammar not yet started
        takes anything; an end of thinking it does not know leaves it as it was)."""
        if self.allows(token):
            llama_cpp.llama_sampler_accept(self.grammar, token)
        llama_cpp.llama_sampler_accept(self.chain, token)

    def free(self) -> None:
        llama_cpp.llama_sampler_free(self.chain)
        llama_cpp.llama_sampler_free(self.grammar)
