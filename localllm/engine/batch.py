"""The llama.cpp adapter for batched decoding: one context, several sequences.

This module imports ``llama_cpp`` (like ``localllm.engine``, it is an engine
adapter; nothing else in ``localllm.serve`` does). ``localllm serve`` drives it
from a single engine thread: each step fills one ``llama_batch`` with tokens of
several sequences (each token tagged with its ``seq_id`` and position), calls
``llama_decode`` once, and samples each sequence's next token from its own row
of logits with its own sampler chain.

The context is created with ``n_seq_max`` = the number of parallel sequences
and a *unified* KV cache (``kv_unified``): llama.cpp then keeps one pool of
``n_ctx`` cells shared by every sequence (``cparams.n_ctx_seq = cparams.n_ctx``
in src/llama-context.cpp), so no sequence reserves a whole context up front,
and ``llama_memory_seq_cp`` shares a prefix's cells between sequences without
copying them (a cell carries a set of seq ids, src/llama-kv-cells.h).

Text <-> tokens and the chat template come from ``engine.Tokenizer`` and the
sampler chain from ``engine.sampler``, on the model loaded here, so ``serve``
tokenizes and samples exactly as ``run`` does.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import llama_cpp

from localllm.audio.sound import AudioClip
from localllm.engine import grammar
from localllm.engine.budgeted import Budgeted
from localllm.engine.checked_sampler import CheckedSampler, GrammarTooSlow
from localllm.engine.embed import Embedder
from localllm.engine.llamalog import ROUTER
from localllm.engine.logprobs import post_sampling_probs, row_logprobs
from localllm.engine.lora import Adapters, AdapterSpec
from localllm.engine.model import ModelHandle, llama_params, load_model_and_context
from localllm.engine.native import gpu_offload_supported, install_log_router
from localllm.engine.rank import SLICE_S, Ranker
from localllm.engine.sampler import Greedy, first_max_rows, free_sampler, new_sampler, plain_greedy, prime, sample
from localllm.engine.threadctl import Steered, controller_for
from localllm.engine.tokenizer import Tokenizer
from localllm.engine_api import LoadConfig, SamplingConfig
from localllm.errors import EngineError
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.modelfile.model_info import describe
from localllm.threads import ThreadController
from localllm.vision.image import RGBImage
from localllm.vision.projector import ProjectorInfo

if TYPE_CHECKING:
    from localllm.engine.mtmd import MediaPrompt, Piece, Projector


@dataclass(frozen=True)
class BatchLoadInfo:
    path: Path
    load_ms: float
    n_ctx: int  # cells in the shared pool, as llama.cpp sized it (padded to 256)
    n_seq: int
    n_batch: int
    n_threads: int
    type_k: str
    type_v: str
    n_vocab: int
    prefix_reuse: bool  # whether a cached prefix can be kept or copied (not recurrent; with a sliding window, see n_swa)
    n_swa: int = 0  # the sliding window of a cache that keeps only the window's cells (0: none): a prefix is kept only while they are there
    rows_per_seq: int = 1  # rows of logits a step may give each sequence (n_outputs_max / n_seq): above 1, room for draft tokens


class BatchModel:
    """A model and one multi-sequence context; every method is called from one thread."""

    def __init__(self) -> None:
        self.tok = Tokenizer(None, None)  # tokenizer, chat template, token pieces (once loaded)
        self.model: object = None
        self.ctx: object = None
        self.mem = None
        self._batch = None
        self._cap = 0
        self.info: BatchLoadInfo | None = None
        self._cparams = None
        self._embedder: Embedder | None = None
        self._ranker: Ranker | None = None
        self._on_cpu = True
        self._adapters: Adapters | None = None  # serve --lora (load_adapters)
        self.steer: Steered | None = None  # the thread counts, chosen per kind of step (engine.threadctl)
        self._projector: Projector | None = None  # a vision model's mmproj (load_projector)

    def load(self, path: Path, config: LoadConfig, n_seq: int, header: GGUFHeader | None = None) -> BatchLoadInfo:
        """Load ``path`` with a unified KV cache of ``config.n_ctx`` cells for ``n_seq`` sequences
        (``header``: read already by the load path)."""
        header = ModelHandle.check(path, config, header)  # the same checks as the single-sequence engine
        shape = describe(header)
        install_log_router()
        self.close()
        mparams, cparams, keep = llama_params(config)  # noqa: F841  (keep: arrays that must outlive the load)
        cparams.n_seq_max = n_seq
        cparams.kv_unified = True
        # One row of logits per sequence per step (a prompt chunk outputs only its last
        # token's), or more where the load asks for draft rows (draftless speculation)
        cparams.n_outputs_max = max(n_seq, config.n_outputs_max)
        cparams.no_perf = True
        model, ctx, load_ms = load_model_and_context(path, config, mparams, cparams)
        self.steer = Steered(ctx, controller_for(config), cparams.n_threads, cparams.n_threads_batch)
        self.model, self.ctx = model, ctx
        self._cparams = cparams
        # every layer on this machine's CPU: the embedder's eval callback pays there (engine/embed.py)
        self._on_cpu = not config.rpc_servers and (config.n_gpu_layers == 0 or not gpu_offload_supported())
        self.tok = Tokenizer(llama_cpp.llama_model_get_vocab(model), header)
        self.mem = llama_cpp.llama_get_memory(ctx)
        self._cap = int(llama_cpp.llama_n_batch(ctx))
        self._batch = llama_cpp.llama_batch_init(self._cap, 0, 1)
        # M-RoPE caches cannot shift (llama-kv-cache.cpp get_can_shift), yet keep or drop a prefix as any other
        mrope = llama_cpp.llama_model_rope_type(model) in (llama_cpp.LLAMA_ROPE_TYPE_MROPE, llama_cpp.LLAMA_ROPE_TYPE_IMROPE)
        # A sliding-window cache cannot shift either, yet keeps a prefix while its window's cells are still there:
        # the scheduler checks that per request (``seq_pos_min``, llama-server's rule)
        swa = int(llama_cpp.llama_model_n_swa(model)) if shape.swa_layers and not config.swa_full else 0
        reuse = mrope or bool(swa) or bool(llama_cpp.llama_memory_can_shift(self.mem))
        self.info = BatchLoadInfo(
            path=Path(path),
            load_ms=load_ms,
            n_ctx=int(llama_cpp.llama_n_ctx(ctx)),
            n_seq=n_seq,
            n_batch=self._cap,
            n_threads=cparams.n_threads,
            type_k=config.type_k,
            type_v=config.type_v,
            n_vocab=self.tok.n_vocab,
            prefix_reuse=reuse,
            n_swa=swa,
            # a cache whose last cells can be dropped again: rejected draft tokens (not a recurrent state)
            rows_per_seq=int(cparams.n_outputs_max) // n_seq if reuse else 1,
        )
        return self.info

    def embedder(self, n_ctx: int, pooling: str | None) -> Embedder:
        """Embeddings on this model's weights (a context of its own, made on first use; ``close`` frees it).
        An input must fit one ubatch (llama.cpp pools a sequence only whole, and
        computes a row of logits per token: n_ubatch x n_vocab floats of compute
        buffer), so at most ``n_ctx`` and the physical batch, as llama-server limits it."""
        if self._embedder is None:
            assert self._cparams is not None  # loaded
            self._embedder = Embedder(self.model, self._cparams, min(n_ctx, int(self._cparams.n_ubatch)), pooling, on_cpu=self._on_cpu)
        return self._embedder

    def ranker(self, n_ctx: int) -> Ranker:
        """Rerank scores on this model's weights (serve --rerank; a context of its own, made on first use; ``close`` frees it).
        A pair must fit one ubatch, as an embedding input (``embedder``); a decode takes up to a ubatch of pairs."""
        if self._ranker is None:
            assert self._cparams is not None  # loaded
            # a model that cannot generate has no chat steps to let through between batches
            self._ranker = Ranker(self.model, self._cparams, n_ctx, int(self._cparams.n_ubatch), slice_s=SLICE_S if self.can_generate else None)
        return self._ranker

    @property
    def can_generate(self) -> bool:
        """False for a model whose context has no memory (an encoder such as BERT):
        llama.cpp computes no logits for it, and a decode asking for them aborts
        the process (GGML_ASSERT in llama-context.cpp; llama-server refuses such
        a request with "the current context does not support logits computation")."""
        return bool(self.mem)

    def load_adapters(self, specs: Sequence[AdapterSpec]) -> list[tuple[str, float]]:
        """serve's ``--lora``/``--lora-scaled``: load the adapters for this model,
        each file checked against its header first (``engine.lora``: one line
        naming the cause). Returns (path, scale) by id, for the scheduler and
        GET /lora-adapters; the scheduler sets them per step (``set_lora``)."""
        assert self.model and self.tok.header is not None, "loaded"
        if self._adapters is not None:
            self._adapters.free()
            self._adapters = None
        if specs:
            self._adapters = Adapters(self.model, self.tok.header, specs)
        return [(str(s.path), float(s.scale)) for s in specs]

    def set_lora(self, scales: Sequence[float]) -> None:
        """The adapters' scales for the next decode, by id (a no-op when they are the ones set)."""
        if self._adapters is not None:
            self._adapters.apply(self.ctx, scales)

    # -- images (a vision model's projector: engine.mtmd) ---------------------------
    def load_projector(self, path: Path) -> ProjectorInfo:
        """serve's ``--mmproj``: the projector for this model, checked against its header
        first (one line naming both files). Loaded before the engine thread starts."""
        from localllm.engine.mtmd import Projector  # lazy: libmtmd's bindings (~13 ms), only for a vision model

        assert self.model and self.tok.header is not None, "loaded"
        proj = Projector(_Host(self), Path(path))
        if self._projector is not None:
            self._projector.close()
        self._projector = proj
        return proj.info

    @property
    def projector(self) -> Projector | None:
        return self._projector

    def image_prompt(self, image: RGBImage | AudioClip) -> MediaPrompt:
        """``image``'s pieces (libmtmd's text around it, e.g. Gemma 3's ``<start_of_image>``,
        and its image chunks), owned by the ``MediaPrompt`` (freed with it). Called from a
        worker thread, as llama-server tokenizes in its HTTP threads: ``mtmd_tokenize`` only
        reads the projector (resizes and normalizes the picture), nothing is decoded."""
        from localllm.vision.marker import MARKER  # lazy: as load_projector

        if self._projector is None:
            raise EngineError("no projector is loaded")
        return self._projector.tokenize(MARKER, [image], add_special=False, parse_special=True)

    def image_too_large(self, piece: Piece) -> int | None:
        """The context's n_ubatch when ``piece`` (an image decoded whole) does not fit one ubatch, else None."""
        assert self._projector is not None
        return self._projector.too_large(piece)

    def decode_image(self, seq: int, pos: int, piece: Piece) -> tuple[int | None, int]:
        """Image ``piece`` into sequence ``seq`` at positions ``pos`` on, on the engine
        thread: encoded unless its embeddings were kept, then decoded whole (never cut by
        the scheduler's prefill chunks). Returns (encode ns, None when kept; decode ns)."""
        if self._projector is None:
            raise EngineError("no projector is loaded")
        return self._projector.decode_piece(piece, seq, pos)

    def close(self) -> None:
        if self._projector is not None:
            self._projector.close()  # before the model it was loaded for
            self._projector = None
        if self._adapters is not None:
            self._adapters.free()  # before the model (llama_adapter_lora_free unregisters from it)
            self._adapters = None
        if self._ranker is not None:
            self._ranker.close()
            self._ranker = None
        if self._embedder is not None:
            self._embedder.close()
            self._embedder = None
        if self._batch is not None:
            llama_cpp.llama_batch_free(self._batch)
            self._batch = None
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
        if self.model:
            llama_cpp.llama_model_free(self.model)
        self.tok = Tokenizer(None, None)
        self.model = self.ctx = self.mem = None
        self.steer = None

    # -- the KV cache, per sequence ---------------------------------------------
    def seq_rm(self, seq: int, p0: int = 0, p1: int = -1) -> bool:
        """Drop positions [p0, p1) of ``seq`` (p1=-1: to the end). False where the
        cache cannot drop part of a sequence (then drop it whole)."""
        return bool(llama_cpp.llama_memory_seq_rm(self.mem, seq, p0, p1))

    def seq_pos_min(self, seq: int) -> int:
        """The smallest position ``seq`` still has cells for (-1: none); a
        sliding-window cache has let go of those before its window."""
        return int(llama_cpp.llama_memory_seq_pos_min(self.mem, seq))

    def seq_cp(self, src: int, dst: int, n: int) -> None:
        """Let ``dst`` share the cells of ``src``'s first ``n`` positions."""
        llama_cpp.llama_memory_seq_cp(self.mem, src, dst, 0, n)

    def seq_save(self, seq: int) -> bytearray:
        """``seq``'s cells (its KV rows and positions) as llama.cpp's sequence state,
        for serve's prompt cache in RAM (llama-server's ``--cache-ram``)."""
        size = int(llama_cpp.llama_state_seq_get_size(self.ctx, seq))
        out = bytearray(size)  # written in place by llama.cpp: one copy of a state that may be hundreds of MiB
        got = int(llama_cpp.llama_state_seq_get_data(self.ctx, (ctypes.c_ubyte * size).from_buffer(out), size, seq))
        del out[got:]
        return out

    def seq_load(self, seq: int, data: bytes | bytearray) -> bool:
        """Put a state ``seq_save`` made into ``seq`` (empty before); False where
        llama.cpp refuses it (no room in the cache: then ``seq`` is left empty)."""
        buf = (ctypes.c_ubyte * len(data)).from_buffer(data) if isinstance(data, bytearray) else (ctypes.c_ubyte * len(data)).from_buffer_copy(data)
        if int(llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(data), seq)) == 0:
            llama_cpp.llama_memory_seq_rm(self.mem, seq, 0, -1)
            return False
        return True

    # -- sampling ------------------------------------------------------------------
    def new_sampler(self, sampling: SamplingConfig, prompt: Sequence[int] = ()):
        """A sampler chain for one request, its penalties primed with the prompt (as
        llama-server does), under its thinking budget if it has one (``Budgeted``)."""
        inner = self._new_sampler(sampling, prompt)
        budget = self.tok.thinking_budget(sampling.reasoning_budget, prompt)
        if budget is None:
            return inner
        return Budgeted(inner, budget, self._draw, lambda t: self.tok.token_bytes(t, special=True))

    def _new_sampler(self, sampling: SamplingConfig, prompt: Sequence[int]):
        if plain_greedy(sampling):
            return Greedy(self.tok.n_vocab)  # the same picks, without llama_sampler_sample's candidate array (sampler.Greedy)
        if sampling.grammar is None:
            chain = new_sampler(sampling, self.tok.n_vocab, self.tok.vocab)
            prime(chain, sampling, prompt)
            return chain
        # sample, then check the pick against the grammar (checked_sampler: 14.6 ms a token for the grammar first)
        gram = grammar.init(self.tok.vocab, sampling.grammar, sampling.grammar_triggers)
        try:
            chain = new_sampler(sampling, self.tok.n_vocab, self.tok.vocab, grammar_in_chain=False)
        except BaseException:
            llama_cpp.llama_sampler_free(gram)
            raise
        prime(chain, sampling, prompt, grammar_in_chain=False)
        return CheckedSampler(chain, gram, self.tok.n_vocab)

    def check_grammar(self, text: str) -> None:
        """Raise ``InputError`` unless llama.cpp parses the GBNF ``text`` and it
        filters this vocabulary in time (serve asks before admitting a request,
        off the engine thread)."""
        grammar.check(self.tok.vocab, text, self.tok.n_vocab)

    @staticmethod
    def free_sampler(sampler) -> None:
        if isinstance(sampler, Budgeted):
            sampler = sampler.inner
        if isinstance(sampler, (CheckedSampler, Greedy)):
            sampler.free()
        else:
            free_sampler(sampler)

    def sample(self, sampler, i: int) -> int:
        """Sample from the logits of batch entry ``i`` (and accept the token)."""
        if isinstance(sampler, Budgeted):
            return sampler.sample(self.ctx, i)
        return self._draw(sampler, self.ctx, i)

    @staticmethod
    def _draw(sampler, ctx, i: int) -> int:
        if isinstance(sampler, (CheckedSampler, Greedy)):
            return sampler.sample(ctx, i)
        return sample(sampler, ctx, i)

    def sample_all(self, picks: Sequence[tuple[object, int]]) -> list[int]:
        """``sample(sampler, i)`` for each pair of one step, in order; the greedy
        ones' rows are read with one argmax (``sampler.first_max_rows``), a row
        with a NaN by llama.cpp's greedy sampler (``Greedy.sample``)."""
        greedy = [(sampler, i) for sampler, i in picks if isinstance(sampler, Greedy)]
        fast = iter(first_max_rows(self.ctx, [i for _, i in greedy], greedy[0][0].n_vocab)) if len(greedy) > 1 else None
        out = []
        for sampler, i in picks:
            tok = next(fast) if fast is not None and isinstance(sampler, Greedy) else None
            if tok is None:
                try:
                    tok = self.sample(sampler, i)
                except GrammarTooSlow:  # this request's fault: -1 ends it alone (the scheduler reads the sampler's .failed)
                    tok = -1
            out.append(tok)
        return out

    def is_eog(self, token: int) -> bool:
        return self.tok.is_eog(token)

    def piece(self, token: int) -> bytes:
        """A generated token's text as the reply shows it: the chat template's
        tool-call and thinking control tokens as their text, others as nothing (``Tokenizer.reply_bytes``)."""
        return self.tok.reply_bytes(token)

    # -- one step ------------------------------------------------------------------
    def decode(self, entries: Sequence[tuple[int, int, int, bool]]) -> None:
        """Evaluate ``(token, pos, seq_id, wants_logits)`` entries as one batch;
        then ``sample(sampler, i)`` reads the logits of entry i (llama_get_logits_ith
        takes the batch index)."""
        n = len(entries)
        if not 0 < n <= self._cap:
            raise EngineError(f"a batch of {n} tokens does not fit n_batch {self._cap}")
        b = self._batch
        assert b is not None  # n <= self._cap > 0 only once loaded
        token, pos, n_seq_id, seq_id, logits = b.token, b.pos, b.n_seq_id, b.seq_id, b.logits
        for i, (tok, p, s, want) in enumerate(entries):
            token[i] = tok
            pos[i] = p
            n_seq_id[i] = 1
            seq_id[i][0] = s
            logits[i] = want
        b.n_tokens = n
        # One-token steps, steps of one token for each of several sequences, and
        # steps that read a prompt: each kind has its own thread count (engine.threadctl).
        kind = "token" if n == 1 else "multi" if len({e[2] for e in entries}) == n else "prefill"
        steer = self.steer
        k = steer.before(kind, n) if steer is not None else 0
        t0 = time.perf_counter_ns()
        rc = llama_cpp.llama_decode(self.ctx, b)
        if rc != 0:
            raise EngineError(f"llama_decode failed ({rc}): {ROUTER.last_error() or 'no reason given'}")
        if steer is not None:
            llama_cpp.llama_synchronize(self.ctx)  # the step's time, not its launch (sampling waits for it anyway)
            steer.after(kind, n, k, time.perf_counter_ns() - t0)

    @property
    def threads(self) -> ThreadController | None:
        """The thread counts' controller (``localllm.threads``): serve's /metrics reads its counts."""
        return self.steer.controller if self.steer is not None else None

    def logprobs(self, i: int, token: int, n_top: int) -> tuple[float, list[tuple[int, float]]]:
        """log p of ``token`` at batch entry ``i``, and the ``n_top`` likeliest
        tokens': the model's distribution before sampling (``engine.logprobs``)."""
        return row_logprobs(self.ctx, i, self.tok.n_vocab, token, n_top)

    def post_probs(self, i: int, token: int, n_top: int, sampling: SamplingConfig) -> tuple[float, list[tuple[int, float]]]:
        """p of ``token`` and the ``n_top`` likeliest tokens' of the distribution
        ``sampling`` draws from at batch entry ``i`` (``engine.logprobs.post_sampling_probs``)."""
        return post_sampling_probs(self.ctx, i, self.tok.n_vocab, token, n_top, sampling)


class _Host:
    """What a projector reads of the model it feeds (``engine.mtmd.Host``), for the batch context."""

    def __init__(self, owner: BatchModel) -> None:
        self._owner = owner

    @property
    def model(self) -> object:
        return self._owner.model

    @property
    def ctx(self) -> object:
        return self._owner.ctx

    @property
    def header(self) -> GGUFHeader:
        header = self._owner.tok.header
        assert header is not None  # loaded
        return header

    @property
    def n_batch(self) -> int:
        return int(llama_cpp.llama_n_batch(self._owner.ctx))

    def require(self) -> None:
        if not self._owner.ctx:
            raise EngineError("no model is loaded")
