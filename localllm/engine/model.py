"""Model and context handles: turning a ``LoadConfig`` into a loaded llama.cpp
model and context, and the one decode call everything else builds on.

The engine and the batch engine (``localllm.engine.batch``) share
``llama_params`` and ``load_model_and_context``, so both honour the same
settings and word a refused file the same way.
"""

from __future__ import annotations

import ctypes
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import llama_cpp

from localllm.engine import moe, rpc
from localllm.engine.llamalog import ROUTER
from localllm.engine.native import MAX_CTX, gpu_offload_supported, install_log_router, max_threads
from localllm.engine.threadctl import Steered, controller_for, start_count
from localllm.engine_api import LoadConfig, LoadInfo
from localllm.engine_api.errors import InvalidSetting
from localllm.engine_api.llama_rules import FLASH_ATTN_MODES, ggml_type_id, needs_flash_attn
from localllm.errors import EngineError
from localllm.modelfile.gguf_file import GGUFHeader, read_header
from localllm.plan import planner
from localllm.plan.placement import logged_buffers
from localllm.plan.workers import parse_endpoints
from localllm.speculation.history import Replies


def check_config(cfg: LoadConfig) -> None:
    """Refuse what llama.cpp would assert on or silently wrap (its fields are
    32-bit), for callers that build a LoadConfig without the CLI's parsers."""
    if not 1 <= cfg.n_ctx <= MAX_CTX:
        raise InvalidSetting(f"{{n_ctx}} must be between 1 and {MAX_CTX}, got {cfg.n_ctx}")
    if not 1 <= cfg.n_batch <= MAX_CTX or not 1 <= cfg.n_ubatch <= MAX_CTX:
        raise InvalidSetting(f"{{n_batch}} and {{n_ubatch}} must be between 1 and {MAX_CTX}")
    if cfg.n_threads is not None and not 1 <= cfg.n_threads <= max_threads():
        raise InvalidSetting(f"{{n_threads}} must be between 1 and {max_threads()} (this machine's CPUs), got {cfg.n_threads}")
    if not 0 <= cfg.n_outputs_max <= MAX_CTX:
        raise InvalidSetting(f"{{n_outputs_max}} must be between 0 and {MAX_CTX}")
    if cfg.flash_attn not in FLASH_ATTN_MODES:
        raise InvalidSetting(f"{{flash_attn}} must be one of {', '.join(FLASH_ATTN_MODES)}")
    ggml_type_id(cfg.type_k)
    ggml_type_id(cfg.type_v)




def llama_params(config: LoadConfig) -> tuple[Any, Any, list[object]]:
    """llama.cpp's model and context parameters for ``config``, shared by this
    engine and the batch engine (``batch_engine``): threads, offload and RPC
    devices, context and batch sizes, cache types, flash attention (forced on
    for a quantized V cache, which llama.cpp refuses without it), swa_full.
    Returns (model params, context params, ctypes arrays to keep alive)."""
    n_threads = config.n_threads or min(start_count(config), max_threads())  # the fast cores (threads.topology)
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if config.n_gpu_layers < 0 else min(config.n_gpu_layers, 0x7FFFFFFF)
    keep = _set_devices(mparams, config) + moe.set_overrides(mparams, config)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = config.n_ctx
    cparams.n_batch = min(config.n_batch, config.n_ctx)
    cparams.n_ubatch = min(config.n_ubatch, cparams.n_batch)
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    cparams.type_k = ggml_type_id(config.type_k)
    cparams.type_v = ggml_type_id(config.type_v)
    flash = "on" if needs_flash_attn(config.type_v) else config.flash_attn
    cparams.flash_attn_type = {
        "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
        "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }[flash]
    cparams.swa_full = config.swa_full
    # Several sequences (serve's batch engine, and its dry run): n_seq_max and a
    # unified cache change the KV, recurrent-state and compute buffers alike.
    cparams.n_seq_max = max(config.n_seq, 1)
    cparams.kv_unified = config.kv_unified
    return mparams, cparams, keep


def _set_devices(mparams, config: LoadConfig) -> list[object]:
    """With RPC workers: the workers' devices (probed first, with a timeout), then
    this machine's GPUs, as llama.cpp orders them by default; and the planner's
    split. Returns the ctypes arrays, which must stay alive through the load."""
    keep: list[object] = []
    if config.rpc_servers:

        devs = rpc.add_servers(parse_endpoints(",".join(config.rpc_servers)))
        n_local = len(config.tensor_split) - len(devs) if config.tensor_split else None
        devs += rpc.local_gpus()[:n_local]
        rpc.on_abort()  # a worker that dies mid-generation: one line and exit 1, not a backtrace
        arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
        mparams.devices = ctypes.addressof(arr)
        keep.append(arr)
    if config.tensor_split:
        n = llama_cpp.llama_max_devices()
        split = (ctypes.c_float * n)(*config.tensor_split[:n])
        mparams.tensor_split = split
        keep.append(split)
    return keep


def load_model_and_context(path: Path, config: LoadConfig, mparams: Any, cparams: Any) -> tuple[object, object, float]:
    """Load the model and create its context (engine and batch engine); a file or
    a context llama.cpp refuses is one EngineError naming the file and quoting
    llama.cpp's first error. Returns (model, context, milliseconds)."""
    mark = ROUTER.mark()
    t0 = time.perf_counter_ns()
    model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
    if not model:
        # A file llama.cpp refuses is the file's problem (exit 1, naming it).
        raise EngineError(f"llama.cpp could not load {path}: {ROUTER.first_error_since(mark) or 'unknown reason'}")
    ctx = llama_cpp.llama_init_from_model(model, cparams)
    if not ctx:
        llama_cpp.llama_model_free(model)
        reason = ROUTER.first_error_since(mark) or "unknown reason"
        raise EngineError(f"llama.cpp could not create a context of {config.n_ctx} tokens for {path}: {reason}")
    return model, ctx, (time.perf_counter_ns() - t0) / 1e6


@dataclass
class ModelHandle:
    """A loaded model and its single-sequence context, freed together by ``close``.

    The other parts of the engine (tokenizer, KV cache, generator, scorer) hold
    a handle rather than raw pointers, so a closed model is one check away."""

    model: object
    ctx: object
    vocab: object
    header: GGUFHeader
    info: LoadInfo
    n_outputs_max: int  # rows of logits one decode may output (llama.cpp asserts past it)
    logged_buffers: dict[str, dict[str, list[float]]] = field(default_factory=dict)  # device -> kind -> MiB, from the load's log
    load_log: list[tuple[int, str]] = field(default_factory=list)  # llama.cpp's log lines of this load (level, text)
    steer: Steered | None = None  # the thread counts, chosen per step (engine.threadctl); None: as loaded
    replies: Replies = field(default_factory=Replies)  # its replies so far, which later replies' drafts may quote

    @staticmethod
    def check(path: Path, config: LoadConfig, header: GGUFHeader | None = None) -> GGUFHeader:
        """Validate the file and the settings before llama.cpp sees them (and
        before a loaded model is given up for them); returns the file's header.
        ``header``: read already by the load path (``runtime.plan``), so that a
        load reads it once; else read here."""
        check_config(config)
        header = header if header is not None else read_header(path)
        # llama.cpp's cache-type rules, over every layer's head sizes and K row (it refuses or aborts otherwise)
        shape = planner.ModelShape.from_header(header)
        planner.check_cache_types(shape, config)
        planner.check_moe(shape, config)  # experts in RAM need experts (llama.cpp would match nothing, silently)
        return header

    @classmethod
    def open(cls, path: Path, config: LoadConfig, header: GGUFHeader | None = None) -> ModelHandle:
        """Load ``path`` (checked first unless ``check`` already gave its header)."""
        if header is None:
            header = cls.check(path, config)
        install_log_router()
        mparams, cparams, keep = llama_params(config)  # noqa: F841  (keep: arrays that must outlive the load)
        cparams.n_outputs_max = config.n_outputs_max
        cparams.no_perf = False
        mark = ROUTER.mark()  # the allocation lines of this load, for logged_buffers
        model, ctx, load_ms = load_model_and_context(path, config, mparams, cparams)

        info = LoadInfo(
            path=Path(path),
            load_ms=load_ms,
            n_ctx=llama_cpp.llama_n_ctx(ctx),
            n_threads=cparams.n_threads,
            n_gpu_layers=config.n_gpu_layers,
            type_k=config.type_k,
            type_v=config.type_v,
            flash_attn="on" if needs_flash_attn(config.type_v) else config.flash_attn,
            gpu_offload_supported=gpu_offload_supported(),
        )
        log = ROUTER.lines_since(mark)
        return cls(
            model=model, ctx=ctx, vocab=llama_cpp.llama_model_get_vocab(model), header=header, info=info,
            n_outputs_max=config.n_outputs_max or cparams.n_batch,
            logged_buffers=logged_buffers([line for _, line in log]), load_log=log,
            steer=Steered(ctx, controller_for(config), cparams.n_threads, cparams.n_threads_batch),
        )

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
        self.vocab = None

    def require(self) -> None:
        if not self.ctx:
            raise EngineError("no model is loaded")

    @property
    def n_ctx(self) -> int:
        self.require()
        return int(llama_cpp.llama_n_ctx(self.ctx))

    @property
    def n_batch(self) -> int:
        return int(llama_cpp.llama_n_batch(self.ctx))

    @property
    def n_vocab(self) -> int:
        return int(llama_cpp.llama_vocab_n_tokens(self.vocab))

    @property
    def recurrent(self) -> bool:
        """Whether part of the model's memory is a recurrent state (Mamba, RWKV, hybrids),
        which cannot drop its last cells again (rejected draft tokens)."""
        return bool(llama_cpp.llama_model_is_recurrent(self.model) or llama_cpp.llama_model_is_hybrid(self.model))

    @property
    def memory(self) -> object:
        return llama_cpp.llama_get_memory(self.ctx)

    def decode(self, tokens: Sequence[int], pos: int | None = None) -> int:
        """Evaluate tokens and wait for the result; returns elapsed nanoseconds.
        ``pos``: the first token's position (None: after the last one the cache
        holds, as llama_batch_get_one leaves it to llama.cpp)."""
        if pos is None:
            arr = (llama_cpp.llama_token * len(tokens))(*tokens)
            return self.decode_batch(llama_cpp.llama_batch_get_one(arr, len(tokens)), len(tokens))
        n = len(tokens)
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, tok in enumerate(tokens):
                batch.token[i], batch.pos[i], batch.n_seq_id[i] = tok, pos + i, 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = i == n - 1  # as llama_batch_get_one: the last token's logits only
            return self.decode_batch(batch, n)
        finally:
            llama_cpp.llama_batch_free(batch)

    def decode_batch(self, batch: Any, size: int | None = None) -> int:
        """llama_decode + llama_synchronize of a prepared ``llama_batch`` of ``size``
        tokens, timed (nanoseconds); llama.cpp's last error line on failure. The
        thread count is chosen for the step before it and told its time after it
        (``steer``): one-token steps and prompt batches each have their own."""
        size = int(batch.n_tokens) if size is None else size
        kind = "token" if size == 1 else "prefill"
        n = self.steer.before(kind, size) if self.steer is not None else 0
        t0 = time.perf_counter_ns()
        rc = llama_cpp.llama_decode(self.ctx, batch)
        llama_cpp.llama_synchronize(self.ctx)
        elapsed = time.perf_counter_ns() - t0
        if rc != 0:
            raise EngineError(f"llama_decode failed ({rc}): {ROUTER.last_error() or 'no reason given'}")
        if self.steer is not None:
            self.steer.after(kind, size, n, elapsed)
        return elapsed

    def prompt_chunks(self, tokens: Sequence[int]) -> list[list[int]]:
        """Split the prompt into n_batch chunks, never leaving a 1-token last chunk:
        llama.cpp counts a 1-token evaluation as decode, not prompt, in its perf
        counters, and our figures must agree with them. No chunk is ever larger
        than n_batch: llama_decode asserts (aborts) on that (llama-context.cpp,
        GGML_ASSERT(n_tokens_all <= cparams.n_batch)), so with --batch 1 every
        chunk is one token."""
        n_batch = max(1, self.n_batch)
        chunks = [list(tokens[i : i + n_batch]) for i in range(0, len(tokens), n_batch)]
        if n_batch >= 2 and len(chunks) > 1 and len(chunks[-1]) == 1:
            chunks[-2], chunks[-1] = chunks[-2][:-1], chunks[-2][-1:] + chunks[-1]
        return chunks

    def perf_counters(self) -> dict[str, float]:
        """llama.cpp's own counters for the last generation (llama_perf_context)."""
        self.require()
        d = llama_cpp.llama_perf_context(self.ctx)
        return {
            "t_load_ms": d.t_load_ms,
            "t_p_eval_ms": d.t_p_eval_ms,
            "t_eval_ms": d.t_eval_ms,
            "n_p_eval": d.n_p_eval,
            "n_eval": d.n_eval,
        }

    def reset_perf(self) -> None:
        llama_cpp.llama_perf_context_reset(self.ctx)
