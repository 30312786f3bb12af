"""The llama.cpp adapter: the only module that imports ``llama_cpp``.

It drives llama.cpp through llama-cpp-python's low-level bindings rather than the
``Llama`` class, for three measured reasons:

- ``Llama(verbose=False)`` redirects file descriptors 1 and 2 to /dev/null while
  it loads, which would blank a Textual screen drawn on fd 1;
- we need a timestamp at each llama_decode + llama_synchronize to match
  llama.cpp's own perf counters (t_p_eval_ms / t_eval_ms), and at each sample;
- the decode loop then has no per-token numpy copies of the logits.

llama.cpp logs to fd 2 by default; ``install_log_router`` sends every line to the
``localllm.llama`` logger instead (and keeps the last lines so that a failure can
quote llama.cpp's own reason).
"""

from __future__ import annotations

import codecs
import collections
import ctypes
import logging
import os
import re
import threading
import time
from pathlib import Path
from typing import Iterator, Sequence

import llama_cpp

from localllm.backend import (
    FLASH_ATTN_MODES,
    LoadConfig,
    LoadInfo,
    SamplingConfig,
    TokenEvent,
    check_cache_types,
    ggml_type_id,
)
from localllm.errors import EngineError, UsageError
from localllm.gguf_file import GGUFHeader, read_header
from localllm.metrics import GenerationStats, compute_stats
from localllm.model_info import describe

log = logging.getLogger("localllm.llama")

# ggml.h's ggml_log_level: 0 none, 1 debug, 2 info, 3 warn, 4 error, 5 continuation
# of the previous line. (llama-cpp-python's _logger.py still has the older order.)
_LEVELS = {0: logging.DEBUG, 1: logging.DEBUG, 2: logging.INFO, 3: logging.WARNING, 4: logging.ERROR}


class _LogRouter:
    """Reassembles llama.cpp's log fragments into lines and routes them to logging."""

    def __init__(self) -> None:
        self.lines: collections.deque[tuple[int, str]] = collections.deque(maxlen=20000)
        self._buf = ""
        self._level = logging.INFO
        self._lock = threading.Lock()
        self.count = 0  # lines seen so far; marks are positions in this count

    def __call__(self, level: int, text: bytes | None, _user: ctypes.c_void_p) -> None:
        if not text:
            return
        with self._lock:
            if level != 5:
                self._level = _LEVELS.get(level, logging.DEBUG)
            self._buf += text.decode("utf-8", errors="replace")
            while "\n" in self._buf:
                line, self._buf = self._buf.split("\n", 1)
                self.lines.append((self._level, line))
                self.count += 1
                log.log(self._level, "%s", line)

    def last_error(self) -> str:
        for level, line in reversed(self.lines):
            if level >= logging.ERROR and line.strip():
                return line.strip()
        return ""

    def lines_since(self, mark: int) -> list[tuple[int, str]]:
        """Lines logged after ``mark`` (as far back as the buffer reaches)."""
        n = self.count - mark
        return list(self.lines)[-n:] if n > 0 else []

    def first_error_since(self, mark: int) -> str:
        """The first error llama.cpp logged after ``mark``: the root cause, where the
        last one is often a generic 'failed to load model'. Function-name prefixes
        ('llama_model_load: ') are dropped."""
        for level, line in self.lines_since(mark):
            if level >= logging.ERROR and line.strip():
                return re.sub(r"^(?:[a-z_0-9]+: )+", "", line.strip())
        return self.last_error()

    def mark(self) -> int:
        """A position in the log, to read only what came after it."""
        return self.count


ROUTER = _LogRouter()
_callback = llama_cpp.llama_log_callback(ROUTER)  # keep a reference: C holds the pointer
_init_lock = threading.Lock()
_initialized = False


def install_log_router() -> None:
    """Route llama.cpp's log into ``logging`` and initialize the backend (once)."""
    global _initialized
    with _init_lock:
        llama_cpp.llama_log_set(_callback, ctypes.c_void_p(0))
        if not _initialized:
            llama_cpp.llama_backend_init()
            _initialized = True


def default_threads() -> int:
    """Physical cores: llama.cpp's decode does not gain from hyper-threads."""
    import psutil

    return psutil.cpu_count(logical=False) or os.cpu_count() or 1


def gpu_offload_supported() -> bool:
    install_log_router()
    return bool(llama_cpp.llama_supports_gpu_offload())


def system_info() -> str:
    install_log_router()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


def _check_config(cfg: LoadConfig) -> None:
    if cfg.n_ctx < 1:
        raise UsageError("--ctx must be at least 1")
    if cfg.flash_attn not in FLASH_ATTN_MODES:
        raise UsageError(f"--flash-attn must be one of {', '.join(FLASH_ATTN_MODES)}")
    ggml_type_id(cfg.type_k)
    ggml_type_id(cfg.type_v)
    if cfg.type_v not in ("f32", "f16", "bf16") and cfg.flash_attn == "off":
        raise UsageError(f"a quantized V cache ({cfg.type_v}) needs flash attention: drop --flash-attn off or use --kv-type f16")


class LlamaCppBackend:
    """Load a GGUF with llama.cpp and stream timed tokens from it."""

    def __init__(self) -> None:
        self.model: llama_cpp.llama_model_p | None = None
        self.ctx: llama_cpp.llama_context_p | None = None
        self.vocab = None
        self.header: GGUFHeader | None = None
        self.info: LoadInfo | None = None
        self.last_stats: GenerationStats | None = None
        self._chat_formatter = None

    # -- load / close -----------------------------------------------------------
    def load(self, path: Path, config: LoadConfig) -> LoadInfo:
        _check_config(config)
        self.header = read_header(path)  # validate before llama.cpp sees the file
        shape = describe(self.header)
        check_cache_types(config.type_k, config.type_v, shape.head_dim_k, shape.head_dim_v)
        install_log_router()
        self.close()
        n_threads = config.n_threads or default_threads()
        mparams = llama_cpp.llama_model_default_params()
        mparams.n_gpu_layers = 0x7FFFFFFF if config.n_gpu_layers < 0 else config.n_gpu_layers
        cparams = llama_cpp.llama_context_default_params()
        cparams.n_ctx = config.n_ctx
        cparams.n_batch = min(config.n_batch, config.n_ctx)
        cparams.n_ubatch = min(config.n_ubatch, cparams.n_batch)
        cparams.n_threads = n_threads
        cparams.n_threads_batch = n_threads
        cparams.type_k = ggml_type_id(config.type_k)
        cparams.type_v = ggml_type_id(config.type_v)
        cparams.flash_attn_type = {
            "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
            "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
            "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
        }[config.flash_attn]
        cparams.swa_full = config.swa_full
        cparams.n_outputs_max = config.n_outputs_max
        cparams.no_perf = False
        mark = ROUTER.mark()
        t0 = time.perf_counter_ns()
        model = llama_cpp.llama_model_load_from_file(str(path).encode("utf-8"), mparams)
        if not model:
            raise EngineError(f"llama.cpp could not load {path}: {ROUTER.first_error_since(mark) or 'unknown reason'}")
        ctx = llama_cpp.llama_init_from_model(model, cparams)
        if not ctx:
            llama_cpp.llama_model_free(model)
            reason = ROUTER.first_error_since(mark) or "unknown reason"
            raise EngineError(f"llama.cpp could not create a context of {config.n_ctx} tokens: {reason}")
        load_ms = (time.perf_counter_ns() - t0) / 1e6
        self.model, self.ctx = model, ctx
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.info = LoadInfo(
            path=Path(path),
            load_ms=load_ms,
            n_ctx=llama_cpp.llama_n_ctx(ctx),
            n_threads=n_threads,
            n_gpu_layers=config.n_gpu_layers,
            type_k=config.type_k,
            type_v=config.type_v,
            flash_attn=config.flash_attn,
            gpu_offload_supported=bool(llama_cpp.llama_supports_gpu_offload()),
        )
        return self.info

    def close(self) -> None:
        if self.ctx:
            llama_cpp.llama_free(self.ctx)
            self.ctx = None
        if self.model:
            llama_cpp.llama_model_free(self.model)
            self.model = None
        self.vocab = None
        self._chat_formatter = None

    def __enter__(self) -> "LlamaCppBackend":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _require(self) -> None:
        if not self.ctx:
            raise EngineError("no model is loaded")

    # -- text <-> tokens --------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        self._require()
        raw = text.encode("utf-8")
        cap = len(raw) + 16
        buf = (llama_cpp.llama_token * cap)()
        n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        if n < 0:
            cap = -n
            buf = (llama_cpp.llama_token * cap)()
            n = llama_cpp.llama_tokenize(self.vocab, raw, len(raw), buf, cap, add_special, parse_special)
        return list(buf[:n])

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        buf = ctypes.create_string_buffer(64)
        n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        if n < 0:
            buf = ctypes.create_string_buffer(-n)
            n = llama_cpp.llama_token_to_piece(self.vocab, token, buf, len(buf), 0, special)
        return buf.raw[:n]

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", errors="replace")

    @property
    def has_chat_template(self) -> bool:
        return bool(self.header and isinstance(self.header.get("tokenizer.chat_template"), str))

    def render_chat(self, messages: list[dict[str, str]]) -> str:
        """Apply the model's own chat template (from its GGUF metadata)."""
        self._require()
        if self._chat_formatter is None:
            from llama_cpp.llama_chat_format import Jinja2ChatFormatter

            assert self.header is not None
            bos = self.header.get("tokenizer.ggml.bos_token_id")
            eos = self.header.get("tokenizer.ggml.eos_token_id")
            bos_text = self.token_bytes(bos, special=True).decode("utf-8", "replace") if bos is not None else ""
            eos_text = self.token_bytes(eos, special=True).decode("utf-8", "replace") if eos is not None else ""
            self._chat_formatter = Jinja2ChatFormatter(
                template=self.header.get("tokenizer.chat_template"), eos_token=eos_text, bos_token=bos_text
            )
        return self._chat_formatter(messages=messages).prompt

    def prompt_tokens(self, prompt: str, *, chat: bool) -> list[int]:
        """Tokens for a user prompt: through the chat template when there is one."""
        if chat and self.has_chat_template:
            text = self.render_chat([{"role": "user", "content": prompt}])
            # The template writes BOS itself where the model wants it.
            return self.tokenize(text, add_special=False, parse_special=True)
        return self.tokenize(prompt, add_special=True, parse_special=False)

    # -- generation -------------------------------------------------------------
    def _sampler(self, s: SamplingConfig):
        chain = llama_cpp.llama_sampler_chain_init(llama_cpp.llama_sampler_chain_default_params())
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

    def _decode(self, tokens: Sequence[int]) -> int:
        """Evaluate tokens and wait for the result; returns elapsed nanoseconds."""
        arr = (llama_cpp.llama_token * len(tokens))(*tokens)
        batch = llama_cpp.llama_batch_get_one(arr, len(tokens))
        t0 = time.perf_counter_ns()
        rc = llama_cpp.llama_decode(self.ctx, batch)
        llama_cpp.llama_synchronize(self.ctx)
        elapsed = time.perf_counter_ns() - t0
        if rc != 0:
            raise EngineError(f"llama_decode failed ({rc}): {ROUTER.last_error() or 'no reason given'}")
        return elapsed

    def _prompt_chunks(self, tokens: Sequence[int]) -> list[Sequence[int]]:
        """Split the prompt into n_batch chunks, never leaving a 1-token last chunk:
        llama.cpp counts a 1-token evaluation as decode, not prompt, in its perf
        counters, and our figures must agree with them."""
        n_batch = max(2, llama_cpp.llama_n_batch(self.ctx))
        chunks = [tokens[i : i + n_batch] for i in range(0, len(tokens), n_batch)]
        if len(chunks) > 1 and len(chunks[-1]) == 1:
            chunks[-2], chunks[-1] = chunks[-2][:-1], chunks[-2][-1:] + chunks[-1]
        return chunks

    def stream(self, prompt: str | Sequence[int], sampling: SamplingConfig, *, chat: bool = True) -> Iterator[TokenEvent]:
        self._require()
        start = time.perf_counter_ns()
        tokens = self.prompt_tokens(prompt, chat=chat) if isinstance(prompt, str) else list(prompt)
        n_ctx = llama_cpp.llama_n_ctx(self.ctx)
        if not tokens:
            raise UsageError("the prompt is empty")
        if len(tokens) >= n_ctx:
            raise UsageError(f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}: try --ctx {_round_up(len(tokens) + 256, 256)}")
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        llama_cpp.llama_perf_context_reset(self.ctx)
        sampler = self._sampler(sampling)
        self.last_stats = None
        prefill_ns = decode_ns = decode_evals = 0
        token_ns: list[int] = []
        stop = "length"
        budget = n_ctx - len(tokens)
        max_new = budget if sampling.max_tokens < 0 else min(sampling.max_tokens, budget)
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in self._prompt_chunks(tokens):
                prefill_ns += self._decode(chunk)
            for i in range(max_new):
                tok = llama_cpp.llama_sampler_sample(sampler, self.ctx, -1)
                now = time.perf_counter_ns()
                if not sampling.ignore_eos and llama_cpp.llama_vocab_is_eog(self.vocab, tok):
                    stop = "stop"
                    break
                token_ns.append(now)
                last = i == max_new - 1
                # A character split across tokens is emitted whole, with the token that completes it.
                text = utf8.decode(self.token_bytes(tok), final=last)
                yield TokenEvent(i, tok, text, now)
                if last:
                    break
                decode_ns += self._decode([tok])
                decode_evals += 1
            if stop == "length" and len(token_ns) == budget and sampling.max_tokens != budget:
                stop = "context"
        finally:
            llama_cpp.llama_sampler_free(sampler)
            end = time.perf_counter_ns()
            self.last_stats = compute_stats(
                start_ns=start,
                token_ns=token_ns,
                prompt_tokens=len(tokens),
                prefill_ns=prefill_ns,
                decode_ns=decode_ns,
                decode_evals=decode_evals,
                load_ms=self.info.load_ms if self.info else 0.0,
                end_ns=end,
                stop_reason=stop,
            )

    def perf_counters(self) -> dict[str, float]:
        """llama.cpp's own counters for the last generation (llama_perf_context)."""
        self._require()
        d = llama_cpp.llama_perf_context(self.ctx)
        return {
            "t_load_ms": d.t_load_ms,
            "t_p_eval_ms": d.t_p_eval_ms,
            "t_eval_ms": d.t_eval_ms,
            "n_p_eval": d.n_p_eval,
            "n_eval": d.n_eval,
        }


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k
