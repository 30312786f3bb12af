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

The lm_head is skipped where the model runs on the CPU. In embedding mode
llama.cpp still runs the vocabulary projection for every token of a decoder
model (every architecture but ``llama-embed``: ``if constexpr (!embed)`` in
src/models/llama.cpp) and throws the logits away (llama.cpp issue #24713).
The context therefore pools nothing itself (pooling NONE: each token's final
hidden state is an output, named ``result_embd_pooled`` by ``build_pooling``
in src/llama-graph.cpp, just before the lm_head's ``result_output``), an eval
callback ends the graph's split once that node is computed
(``ggml_backend_sched_compute_splits``), and the pooling is done here (mean,
first or last row: what llama.cpp's MEAN, CLS and LAST compute). SmolLM2's
lm_head is 49,152 x 576 against a body of about 106M weights; Gemma 3 270M's
is 262,144 x 640. When the context opens, a probe of two short inputs is run
both ways, and the whole graph is kept unless the graph did end there, some
nodes did follow it, and the vectors agree (a model whose graph does other
work after that node, such as sentence-transformers' dense layers, would not).

Only on the CPU: the callback is Python, called once per graph node (about
1,100 for SmolLM2), so it costs a few microseconds a node against a CPU
decode of seconds, but would outweigh a GPU's whole batch; and with layers on
other devices the lm_head can sit in a later split, which the callback cannot
end. Measured here (2 cores, 470 tokens): SmolLM2 3.3 s -> 3.1 s a decode,
also with a chat engine decoding in another thread of the process; Gemma 3
3.0 s -> 1.3 s.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp
import numpy as np

from localllm.engine.llamalog import ROUTER
from localllm.engine.native import tensor_name_fn
from localllm.errors import EngineError

POOLING = {"mean": llama_cpp.LLAMA_POOLING_TYPE_MEAN, "cls": llama_cpp.LLAMA_POOLING_TYPE_CLS, "last": llama_cpp.LLAMA_POOLING_TYPE_LAST}
MAX_SEQ = 16  # inputs per llama_decode at most
STOP_AT = b"result_embd_pooled"  # the final hidden states, with pooling NONE (src/llama-graph.cpp, build_pooling)
PROBE_AGREE = 1e-4  # largest difference, per component of the normalized vectors, between the two ways

Run = Callable[[Callable[[], Any]], Any]  # makes a call that runs llama.cpp, and returns its result (serve: on its engine thread)


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


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

    def __init__(self, model: object, cparams: Any, n_ctx: int, pooling: str | None, *, on_cpu: bool) -> None:
        self.decodes = 0  # llama_decode calls made, for serve's /metrics
        if pooling is not None and pooling not in POOLING:
            raise EngineError(f"pooling must be one of {', '.join(POOLING)}, got {pooling!r}")
        self.model = model
        self.pooling = pooling or declared_pooling(model) or "mean"
        self.n_ctx = n_ctx  # the longest input, in tokens
        self.n_embd = int(llama_cpp.llama_model_n_embd_out(model))  # a vector's length (llama.cpp's n_embd_out)
        self.lm_head_skipped = False  # the probe agreed when the context opened: decodes end before the lm_head
        self.graphs_ended = 0  # decodes the eval callback ended at STOP_AT
        self.nodes_asked = 0  # graph nodes the eval callback was called for
        self._cparams = cparams  # the chat context's (threads, cache types, flash attention), copied
        self._ctx: object = None
        self._batch: Any = None
        self._lock = threading.Lock()
        self._name = tensor_name_fn() if on_cpu else None  # None: no callback, the whole graph (the module's docstring)
        self._skip = False  # the eval callback ends the graph at STOP_AT
        self._after = -1  # while the probe reads the whole graph: nodes asked after STOP_AT (-1: not reached)
        self._callback = llama_cpp.ggml_backend_sched_eval_callback(self._eval)  # kept: llama.cpp holds only the pointer

    def _eval(self, tensor: int, ask: bool, _user: object) -> bool:
        """llama.cpp's eval callback, once per graph node (ask) and after a node
        it asked for is computed: False then ends the rest of the graph's split."""
        if ask:
            self.nodes_asked += 1
            if self._after >= 0:
                self._after += 1
            elif self._name is not None and self._name(tensor) == STOP_AT:
                if not self._skip:
                    self._after = 0  # the probe's whole decode: count what follows
                return self._skip
            return False
        self.graphs_ended += 1
        return False

    def _open(self) -> None:
        p = type(self._cparams).from_buffer_copy(self._cparams)
        # a pooled sequence must sit whole in one ubatch
        p.n_ctx = p.n_batch = p.n_ubatch = self.n_ctx
        p.n_seq_max, p.kv_unified = MAX_SEQ, True
        p.n_outputs_max = p.n_outputs_max_per_seq = 0  # as many rows as tokens: llama.cpp's defaults
        p.embeddings, p.pooling_type = True, llama_cpp.LLAMA_POOLING_TYPE_NONE  # every token's row; pooled here
        if self._name is not None:
            p.cb_eval = self._callback
            self._init(p)
            try:
                self.lm_head_skipped = self._skip = self._probe()
            except BaseException:
                self.close_context()  # not left open unprobed
                raise
            if self.lm_head_skipped:
                return
            self.close_context()  # no gain, or the probe disagreed: a context without the callback (it would run for every node)
            p.cb_eval = llama_cpp.ggml_backend_sched_eval_callback(0)
        self._init(p)

    def _init(self, p: Any) -> None:
        mark = ROUTER.mark()
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            raise EngineError(f"llama.cpp could not create the embedding context: {ROUTER.first_error_since(mark) or 'unknown reason'}")
        self._ctx = ctx
        self._batch = llama_cpp.llama_batch_init(self.n_ctx, 0, 1)

    def _probe(self) -> bool:
        """The same two inputs (one batch: the rows' order counts too) with the
        graph ended at STOP_AT and then whole: True when the graph did end there
        and the vectors agree. The ended decode goes first, on a context that
        has computed nothing: a node it skipped cannot hold the whole graph's
        values from a decode before it (llama.cpp reuses the compute buffer)."""
        n_vocab = int(llama_cpp.llama_vocab_n_tokens(llama_cpp.llama_model_get_vocab(self.model)))
        group = [[(7 * i + 3) % n_vocab for i in range(6)], [(11 * i + 5) % n_vocab for i in range(3)]]
        if self.n_ctx < sum(map(len, group)):
            return False
        self._skip, before = True, self.graphs_ended
        try:
            ended = np.array(self._decode(group))
        finally:
            self._skip = False
        try:
            whole = np.array(self._decode(group))
            after = self._after
        finally:
            self._after = -1
        ok = bool(np.isfinite(ended).all() and np.abs(whole - ended).max() <= PROBE_AGREE)
        return self.graphs_ended > before and after > 0 and ok  # it ended there, something was left out, and agrees

    @property
    def is_open(self) -> bool:
        return self._ctx is not None

    def open(self, run: Run = _here) -> None:
        """Make the embedding context now rather than at the first request (serve
        --embeddings): its memory is taken, and a failure shown, at start.
        ``run``: as for ``embed``."""
        with self._lock:
            if self._ctx is None:
                run(self._open)

    def embed(self, inputs: Sequence[Sequence[int]], run: Run = _here) -> list[list[float]]:
        """One normalized vector per input (each at most ``n_ctx`` tokens, none empty: the caller checked).
        ``run`` makes each llama.cpp call (opening the context, each batch's decode):
        serve passes its engine thread's (``Scheduler.run``), so that one thread
        runs all of the process's decodes and chat steps go on between batches."""
        out: list[list[float]] = []
        with self._lock:
            if self._ctx is None:
                run(self._open)
            group: list[Sequence[int]] = []
            for toks in inputs:
                if group and (len(group) == MAX_SEQ or sum(map(len, group)) + len(toks) > self.n_ctx):
                    out += run(functools.partial(self._decode, group))
                    group = []
                group.append(toks)
            if group:
                out += run(functools.partial(self._decode, group))
        return out

    def _decode(self, group: Sequence[Sequence[int]]) -> list[list[float]]:
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
        self.decodes += 1  # llama-server's n_decode_total counts these too (serve's /metrics)
        rows = np.ctypeslib.as_array(llama_cpp.llama_get_embeddings(self._ctx), shape=(i, self.n_embd))  # batch order
        vecs = []
        k = 0
        for toks in group:
            seq = rows[k:k + len(toks)]
            k += len(toks)
            v = seq.mean(axis=0, dtype=np.float64) if self.pooling == "mean" else seq[0 if self.pooling == "cls" else -1].astype(np.float64)
            norm = float(np.linalg.norm(v))
            vecs.append((v / norm if norm > 0 else v).tolist())
        llama_cpp.llama_memory_clear(mem, True)
        return vecs

    def close_context(self) -> None:
        """Free the context and its batch (the caller holds the lock, or is the only user)."""
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self._ctx:
            llama_cpp.llama_free(self._ctx)
            self._ctx = None

    def close(self) -> None:
        with self._lock:
            self.close_context()
