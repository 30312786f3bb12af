"""Embeddings from the model ``serve`` already holds: a second llama.cpp
context on the same weights, with ``embeddings`` on and a pooling type.

Why a second context: the chat context keeps its sequences' KV cells for
prefix reuse and outputs logits; an embedding context pools the hidden states
of a whole input per sequence (``llama_get_embeddings_seq``) and is cleared
after every batch. The weights are shared (no second load); the context is
made on first use, so a server that never embeds pays nothing. One batch at a
time (a lock): several inputs, each its own sequence, go into one
``llama_decode`` while they fit ``n_batch``.

Pooling: what the GGUF declares (``<arch>.pooling_type``), else mean pooling
(a chat model declares none); ``pooling`` overrides both, as llama-server's
``--pooling`` does. Vectors are L2-normalized, as llama-server's default
(``embd_normalize`` 2).
"""

from __future__ import annotations

import ctypes
import threading
from collections.abc import Sequence
from typing import Any

import llama_cpp
import numpy as np

from localllm.engine.llamalog import ROUTER
from localllm.errors import EngineError

POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
MAX_SEQ = 16  # inputs per llama_decode at most


def _meta(model: object, key: str) -> str | None:
    buf = ctypes.create_string_buffer(64)
    n = llama_cpp.llama_model_meta_val_str(model, key.encode(), buf, len(buf))
    return buf.value.decode("utf-8", "replace") if n >= 0 else None


def declared_pooling(model: object) -> str | None:
    """The pooling the GGUF declares (``<arch>.pooling_type``): mean, cls or last; None when none (or one we do not serve)."""
    arch = _meta(model, "general.architecture")
    value = _meta(model, f"{arch}.pooling_type") if arch else None
    names = {v: k for k, v in POOLING.items()}
    return names.get(int(value)) if value is not None and value.isdigit() else None


class Embedder:
    """Pooled, normalized embeddings of token lists, from ``model`` (a loaded llama_model the caller frees after ``close``)."""

    def __init__(self, model: object, cparams: Any, n_ctx: int, pooling: str | None) -> None:
        if pooling is not None and pooling not in POOLING:
            raise EngineError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
        self.model = model
        self.pooling = pooling or declared_pooling(model) or "mean"
        self.n_ctx = n_ctx  # the longest input, in tokens
        self.n_embd = int(llama_cpp.llama_model_n_embd(model))
        self._cparams = cparams  # the chat context's (threads, cache types, flash attention), copied
        self._ctx: object = None
        self._batch: Any = None
        self._lock = threading.Lock()

    def _open(self) -> None:
        p = type(self._cparams).from_buffer_copy(self._cparams)
        # a pooled sequence must sit whole in one ubatch
        p.n_ctx = p.n_batch = p.n_ubatch = self.n_ctx
        p.n_seq_max, p.kv_unified = MAX_SEQ, True
        p.n_outputs_max = p.n_outputs_max_per_seq = 0  # as many rows as tokens: llama.cpp's defaults
        p.embeddings, p.pooling_type = True, POOLING[self.pooling]
        mark = ROUTER.mark()
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            raise EngineError(f"llama.cpp could not create the embedding context: {ROUTER.first_error_since(mark) or 'unknown reason'}")
        self._ctx = ctx
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)

    @property
    def is_open(self) -> bool:
        return self._ctx is not None

    def open(self) -> None:
        """Make the embedding context now rather than at the first request (serve
        --embeddings): its memory is taken, and a failure shown, at start."""
        with self._lock:
            if self._ctx is None:
                self._open()

    def embed(self, inputs: Sequence[Sequence[int]]) -> list[list[float]]:
        """One normalized vector per input (each at most ``n_ctx`` tokens, none empty: the caller checked)."""
        out: list[list[float]] = []
        with self._lock:
            if self._ctx is None:
                self._open()
            group: list[Sequence[int]] = []
            for toks in inputs:
                if group and (len(group) == MAX_SEQ or sum(map(len, group)) + len(toks) > self.n_ctx):
                    out += self._decode(group)
                    group = []
                group.append(toks)
            if group:
                out += self._decode(group)
        return out

    def _decode(self, group: list[Sequence[int]]) -> list[list[float]]:
        b = self._batch
        i = 0
        for s, toks in enumerate(group):
            for pos, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, True
                b.seq_id[i][0] = s
                i += 1
        b.n_tokens = i
        mem = llama_cpp.llama_get_memory(self._ctx)
        llama_cpp.llama_memory_clear(mem, True)
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed for embeddings ({rc}): {ROUTER.last_error() or 'no reason given'}")
        vecs = []
        for s in range(len(group)):
            v = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings_seq(self._ctx, s), shape=(self.n_embd,)).astype(np.float64)
            norm = float(np.linalg.norm(v))
            vecs.append((v / norm if norm > 0 else v).tolist())
        llama_cpp.llama_memory_clear(mem, True)
        return vecs

    def close(self) -> None:
        with self._lock:
            if self._batch is not None:
                llama_cpp.llama_batch_free(self._batch)
                self._batch = None
            if self._ctx:
                llama_cpp.llama_free(self._ctx)
                self._ctx = None
