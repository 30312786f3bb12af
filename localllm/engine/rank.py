"""Rerank scores from the model ``serve`` already holds: a llama.cpp context on
the same weights with ``embeddings`` on and pooling RANK (llama-server's
``--rerank``), so the model's classification head runs inside llama.cpp.

Why not serve's embedder (engine/embed.py): that context pools nothing
(pooling NONE, pooled in Python) and never runs a head. With RANK,
``build_pooling`` (src/llama-graph.cpp) takes each sequence's first token (its
last for a causal reranker such as Qwen3-Reranker), runs ``cls`` (dense +
tanh) and ``cls.output``, and ``llama_get_embeddings_seq`` gives
``llama_model_n_cls_out`` floats per sequence. llama-server scores a pair by
the first of them (``send_rerank``); so does serve.

The pair is built as llama-server's ``format_prompt_rerank`` builds it: the
model's ``rerank`` chat template with ``{query}`` and ``{document}`` replaced
(specials parsed), else BOS query EOS SEP document EOS, each special only
where the vocabulary says it is added (EOS falls back to SEP when the model
has none).

As for embeddings, the weights are shared (no second load), the context is
made on first use (or at start: serve ``--rerank`` opens it so a failure shows
then), every decode on serve's engine thread (so one at a time), several
pairs in one ``llama_decode`` while they fit, each its own sequence: a pooled sequence must sit whole in one
ubatch, so a pair is at most ``n_ctx`` tokens (the smallest of serve's --ctx,
--ubatch and the model's trained context: a BERT's learned positions end
there) and a decode holds at most ``n_batch`` tokens (--ubatch) and
``MAX_SEQ`` pairs, as llama-server's batch holds a pair per slot up to its
n_batch (= n_ubatch with --rerank).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import llama_cpp
import numpy as np

from localllm.engine.llamalog import ROUTER
from localllm.errors import EngineError, InputError

MAX_SEQ = 16  # pairs per llama_decode at most
SLICE_S = 0.05  # decodes in one engine-thread call, up to this long (``decode_slice``)

Run = Callable[[Callable[[], Any]], Any]  # makes a call that runs llama.cpp, and returns its result (serve: on its engine thread)


def _here(fn: Callable[[], Any]) -> Any:
    return fn()


class Ranker:
    """Relevance scores of token lists, from ``model`` (a loaded llama_model the caller frees after ``close``)."""

    def __init__(self, model: object, cparams: Any, n_ctx: int, n_batch: int, *, slice_s: float | None = SLICE_S) -> None:
        self.model = model
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.n_cls_out = int(llama_cpp.llama_model_n_cls_out(model))
        if self.n_cls_out < 1:
            raise InputError("the model's classification head has no outputs (n_cls_out 0): it cannot rerank")
        self.n_batch = n_batch  # tokens a decode holds (the context's n_ctx, n_batch and n_ubatch)
        self.slice_s = slice_s  # decodes in one ``run`` call, up to this long; None: all of a request's (no chat to let through)
        self.n_ctx = min(n_ctx, n_batch, int(llama_cpp.llama_model_n_ctx_train(model)) or n_ctx)  # the longest pair, in tokens
        self._cparams = cparams  # the chat context's (threads, cache types, flash attention), copied
        self._ctx: object = None
        self._batch: Any = None
        self._lock = threading.Lock()  # opening and closing the context
        self._template = self._rerank_template()

    def _rerank_template(self) -> str | None:
        raw = llama_cpp.llama_model_chat_template(self.model, b"rerank")
        return raw.decode("utf-8", "replace") if raw else None

    # -- the prompt ------------------------------------------------------------------
    def pair(self, query: str, document: str, tokenize: Callable[..., list[int]]) -> list[int]:
        """The tokens of one (query, document) pair, as llama-server's format_prompt_rerank.
        ``tokenize(text, add_special=, parse_special=)``: the engine's Tokenizer.tokenize."""
        if self._template is not None:
            prompt = self._template.replace("{query}", query).replace("{document}", document)
            return tokenize(prompt, add_special=False, parse_special=True)
        v = self.vocab
        eos = int(llama_cpp.llama_vocab_eos(v))
        if eos == llama_cpp.LLAMA_TOKEN_NULL:
            eos = int(llama_cpp.llama_vocab_sep(v))
        add_eos = bool(llama_cpp.llama_vocab_get_add_eos(v))
        out: list[int] = []
        if llama_cpp.llama_vocab_get_add_bos(v):
            out.append(int(llama_cpp.llama_vocab_bos(v)))
        out += tokenize(query, add_special=False, parse_special=False)
        if add_eos:
            out.append(eos)
        if llama_cpp.llama_vocab_get_add_sep(v):
            out.append(int(llama_cpp.llama_vocab_sep(v)))
        out += tokenize(document, add_special=False, parse_special=False)
        if add_eos:
            out.append(eos)
        return out

    # -- the context -----------------------------------------------------------------
    def _open(self) -> None:
        if self._ctx is not None:  # opened by another call first (both run on one thread)
            return
        p = type(self._cparams).from_buffer_copy(self._cparams)
        # a pooled sequence must sit whole in one ubatch (llama-server sets n_batch = n_ubatch for the same reason)
        p.n_ctx = p.n_batch = p.n_ubatch = self.n_batch
        p.n_seq_max, p.kv_unified = MAX_SEQ, True
        p.n_outputs_max = p.n_outputs_max_per_seq = 0  # llama.cpp's defaults: as many rows as tokens
        p.embeddings, p.pooling_type = True, llama_cpp.LLAMA_POOLING_TYPE_RANK
        p.cb_eval = llama_cpp.ggml_backend_sched_eval_callback(0)
        mark = ROUTER.mark()
        ctx = llama_cpp.llama_init_from_model(self.model, p)
        if not ctx:
            raise EngineError(f"llama.cpp could not create the rerank context: {ROUTER.first_error_since(mark) or 'unknown reason'}")
        self._ctx = ctx
        self._batch = llama_cpp.llama_batch_init(self.n_batch, 0, 1)

    @property
    def is_open(self) -> bool:
        return self._ctx is not None

    def open(self, run: Run = _here) -> None:
        """Make the context now rather than at the first request (serve --rerank: its memory is taken, and a failure shown, at start)."""
        with self._lock:
            if self._ctx is None:
                run(self._open)

    def batches(self, pairs: Sequence[Sequence[int]]) -> list[list[Sequence[int]]]:
        """``pairs`` in order, cut into the batches of one decode each: at most
        ``MAX_SEQ`` pairs and ``n_batch`` tokens (each pair at most ``n_ctx``: the caller checked)."""
        groups: list[list[Sequence[int]]] = []
        n = 0
        for toks in pairs:
            if groups and len(groups[-1]) < MAX_SEQ and n + len(toks) <= self.n_batch:
                groups[-1].append(toks)
                n += len(toks)
            else:
                groups.append([toks])
                n = len(toks)
        return groups

    def rank(self, pairs: Sequence[Sequence[int]], run: Run = _here) -> list[list[float]]:
        """``n_cls_out`` floats per pair (each at most ``n_ctx`` tokens, none empty:
        the caller checked); ``run`` makes each llama.cpp call (``decode_slice``'s)."""
        groups = self.batches(pairs)
        out: list[list[float]] = []
        self.open(run)
        done = 0
        while done < len(groups):
            got = run(functools.partial(self.decode_slice, groups[done:]))
            done += len(got)
            out += [scores for group in got for scores in group]
        return out

    def decode_slice(self, groups: Sequence[Sequence[Sequence[int]]]) -> list[list[list[float]]]:
        """The scores of the first of ``groups`` (``batches``), one decode each, as many
        as ``slice_s`` allows (at least one). Serve calls it on its engine thread
        (``Scheduler.call``): a handoff there and back costs two thread wake-ups, which
        on a loaded machine each wait for a CPU, so a small model's decodes go several
        to a call; chat steps still go on between slices (a large model's one decode
        outlasts the slice anyway)."""
        if self._ctx is None:
            self._open()
        t0 = time.perf_counter()
        out = [self._decode(groups[0])]
        for group in groups[1:]:
            if self.slice_s is not None and time.perf_counter() - t0 >= self.slice_s:
                break
            out.append(self._decode(group))
        return out

    def _decode(self, group: Sequence[Sequence[int]]) -> list[list[float]]:
        b = self._batch
        i = 0
        for s, toks in enumerate(group):
            for pos, t in enumerate(toks):
                b.token[i], b.pos[i], b.n_seq_id[i], b.logits[i] = t, pos, 1, True  # every token an output, as llama-server marks them
                b.seq_id[i][0] = s
                i += 1
        b.n_tokens = i
        mem = llama_cpp.llama_get_memory(self._ctx)  # NULL for an encoder (BERT): nothing to clear
        if mem:
            llama_cpp.llama_memory_clear(mem, True)
        rc = llama_cpp.llama_decode(self._ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed for rerank ({rc}): {ROUTER.last_error() or 'no reason given'}")
        scores = []
        for s in range(len(group)):
            ptr = llama_cpp.llama_get_embeddings_seq(self._ctx, s)
            if not ptr:
                raise EngineError(f"llama.cpp gave no rerank score for sequence {s}")
            scores.append(np.ctypeslib.as_array(ptr, shape=(self.n_cls_out,)).tolist())
        if mem:
            llama_cpp.llama_memory_clear(mem, True)
        return scores

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
