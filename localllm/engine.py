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
import ctypes
import os
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
    needs_flash_attn,
)
from localllm.errors import EngineError, InputError, UsageError
from localllm.gguf_file import GGUFHeader, read_header
from localllm.llamalog import ROUTER
from localllm.metrics import GenerationStats, ShiftRecord, compute_stats
from localllm.model_info import describe

# Every struct field this package sets on llama.cpp's parameter structs. ctypes
# silently accepts an unknown attribute on a Structure (it becomes a plain
# Python attribute llama.cpp never sees), so an older or newer llama-cpp-python
# whose structs lack one would load with our settings quietly ignored: check at
# import, where the cost is one getattr per name and no I/O.
_FIELDS_SET = {
    "llama_model_params": ("n_gpu_layers", "devices", "tensor_split"),
    "llama_context_params": (
        "n_ctx", "n_batch", "n_ubatch", "n_threads", "n_threads_batch", "type_k", "type_v",
        "flash_attn_type", "swa_full", "n_seq_max", "kv_unified", "n_outputs_max", "no_perf",
    ),
    "llama_model_quantize_params": ("nthread", "ftype", "allow_requantize", "dry_run", "imatrix"),
}


def missing_struct_fields(module: object = llama_cpp) -> list[str]:
    """``struct.field`` names we set that this llama-cpp-python does not have."""
    missing = []
    for struct, names in _FIELDS_SET.items():
        cls = getattr(module, struct, None)
        have = {f[0] for f in getattr(cls, "_fields_", ())}
        missing += [f"{struct}.{n}" for n in names if n not in have]
    return missing


_missing = missing_struct_fields()
if _missing:  # EngineError: the CLI shows it as one line, exit 1
    raise EngineError(
        f"llama-cpp-python {getattr(llama_cpp, '__version__', '?')} lacks {', '.join(_missing)}: "
        "localllm needs llama-cpp-python>=0.3.36 (run scripts/install.sh)"
    )

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
    """Whether this build has a GPU (or integrated GPU) device to offload to.

    Not ``llama_supports_gpu_offload()``: that is true in every build with the
    RPC backend compiled in (src/llama.cpp: ``... || llama_supports_rpc()``),
    GPU or not, and our builds have it. A worker added with ``--rpc`` shows up
    as a GPU-type device, so it counts once it is there."""
    install_log_router()
    lib = _ggml_lib()
    if lib is None:
        return bool(llama_cpp.llama_supports_gpu_offload())
    by_type = lib.ggml_backend_dev_by_type
    by_type.restype = ctypes.c_void_p
    by_type.argtypes = [ctypes.c_int]
    return any(by_type(t) for t in (_DEV_GPU, _DEV_IGPU))


_DEV_GPU, _DEV_IGPU = 1, 2  # enum ggml_backend_dev_type (ggml/include/ggml-backend.h)


def _ggml_lib() -> ctypes.CDLL | None:
    """llama-cpp-python's own libggml (already loaded by llama_cpp: same handle)."""
    libdir = Path(llama_cpp.__file__).parent / "lib"
    for name in ("libggml.so", "libggml.dylib", "ggml.dll"):
        if (libdir / name).exists():
            return ctypes.CDLL(str(libdir / name))
    return None


def system_info() -> str:
    install_log_router()
    return llama_cpp.llama_print_system_info().decode("utf-8", errors="replace")


MAX_CTX = 1 << 24  # llama.cpp keeps n_ctx in a uint32; no model is trained on more than ~10M tokens
MAX_THREADS = 512  # GGML_MAX_N_THREADS, ggml/include/ggml.h


def max_threads() -> int:
    """Threads a load may ask for: this machine's logical CPUs (and ggml's cap)."""
    return max(1, min(os.cpu_count() or 1, MAX_THREADS))


def _check_config(cfg: LoadConfig) -> None:
    """Refuse what llama.cpp would assert on or silently wrap (its fields are
    32-bit), for callers that build a LoadConfig without the CLI's parsers."""
    if not 1 <= cfg.n_ctx <= MAX_CTX:
        raise UsageError(f"--ctx must be between 1 and {MAX_CTX}, got {cfg.n_ctx}")
    if not 1 <= cfg.n_batch <= MAX_CTX or not 1 <= cfg.n_ubatch <= MAX_CTX:
        raise UsageError(f"--batch and --ubatch must be between 1 and {MAX_CTX}")
    if cfg.n_threads is not None and not 1 <= cfg.n_threads <= max_threads():
        raise UsageError(f"--threads must be between 1 and {max_threads()} (this machine's CPUs), got {cfg.n_threads}")
    if not 0 <= cfg.n_outputs_max <= MAX_CTX:
        raise UsageError(f"n_outputs_max must be between 0 and {MAX_CTX}")
    if cfg.flash_attn not in FLASH_ATTN_MODES:
        raise UsageError(f"--flash-attn must be one of {', '.join(FLASH_ATTN_MODES)}")
    ggml_type_id(cfg.type_k)
    ggml_type_id(cfg.type_v)


class LlamaCppBackend:
    """Load a GGUF with llama.cpp and stream timed tokens from it."""

    def __init__(self) -> None:
        self.model: llama_cpp.llama_model_p | None = None
        self.ctx: llama_cpp.llama_context_p | None = None
        self.vocab = None
        self.header: GGUFHeader | None = None
        self.info: LoadInfo | None = None
        self.last_stats: GenerationStats | None = None
        self.cache_tokens: list[int] = []  # what the KV cache holds, position by position
        self.last_verify_ns = 0
        self._n_outputs_max = 1
        self.last_spec = None  # speculative.SpecStats of the last speculative generation
        self.logged_buffers: dict[str, dict[str, list[float]]] = {}  # device -> kind -> MiB, from llama.cpp's log at load
        self._template = None  # chat_template.ChatTemplate, compiled on first use
        self._template_override: tuple[str, str] | None = None  # ("builtin", name) or ("jinja", source)
        self._template_origin = ""
        self.state_error: str | None = None  # why the last load_state refused its file

    # -- load / close -----------------------------------------------------------
    def load(self, path: Path, config: LoadConfig) -> LoadInfo:
        _check_config(config)
        self.header = read_header(path)  # validate before llama.cpp sees the file
        shape = describe(self.header)
        check_cache_types(config.type_k, config.type_v, shape.head_dim_k, shape.head_dim_v)
        install_log_router()
        self.close()
        mparams, cparams, keep = llama_params(config)  # noqa: F841  (keep: arrays that must outlive the load)
        n_threads = cparams.n_threads
        cparams.n_outputs_max = config.n_outputs_max
        cparams.no_perf = False
        mark = ROUTER.mark()  # the allocation lines of this load, for logged_buffers
        model, ctx, load_ms = load_model_and_context(path, config, mparams, cparams)
        from localllm.placement import logged_buffers

        self.logged_buffers = logged_buffers([line for _, line in ROUTER.lines_since(mark)])
        self.model, self.ctx = model, ctx
        self._n_outputs_max = config.n_outputs_max or cparams.n_batch
        self.vocab = llama_cpp.llama_model_get_vocab(model)
        self.info = LoadInfo(
            path=Path(path),
            load_ms=load_ms,
            n_ctx=llama_cpp.llama_n_ctx(ctx),
            n_threads=n_threads,
            n_gpu_layers=config.n_gpu_layers,
            type_k=config.type_k,
            type_v=config.type_v,
            flash_attn="on" if needs_flash_attn(config) else config.flash_attn,
            gpu_offload_supported=gpu_offload_supported(),
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
        self.cache_tokens = []
        self._template = None

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
        if self._template_override is not None:
            return True
        return bool(self.header and isinstance(self.header.get("tokenizer.chat_template"), str))

    def use_template(self, spec: str) -> None:
        """``--template FILE|NAME``: a Jinja file, or one of llama.cpp's built-in
        templates by name (chatml, llama3, gemma, ...), instead of the model's."""
        p = Path(spec).expanduser()
        if p.is_file():
            if p.stat().st_size > 1024 * 1024:
                raise InputError(f"the template {p} is larger than 1 MiB")
            try:
                source = p.read_text(encoding="utf-8")
            except UnicodeDecodeError:
                raise InputError(f"the template {p} is not UTF-8 text") from None
            except OSError as exc:
                raise InputError(f"cannot read the template {p}: {exc.strerror or exc}") from None
            from localllm.chat_template import ChatTemplate

            self._template = ChatTemplate(source, f"the chat template {p}")  # compile now: errors before the first turn
            self._template_override = ("jinja", source)
            self._template_origin = f"the chat template {p}"
            return
        names = builtin_templates()
        if spec not in names:
            raise UsageError(f"--template {spec}: no such file, and not a built-in template (one of: {', '.join(names)})")
        self._template_override = ("builtin", spec)

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        """Apply the chat template (the model's, or ``use_template``'s) under
        time and size limits; a failing template is an ``InputError``."""
        self._require()
        if self._template_override and self._template_override[0] == "builtin":
            return self._render_builtin(self._template_override[1], messages, add_generation_prompt)
        if self._template is None:
            from localllm.chat_template import ChatTemplate

            if self._template_override is not None:
                source, origin = self._template_override[1], self._template_origin
            else:
                source = self.header.get("tokenizer.chat_template") if self.header else None
                origin = f"{self.header.path if self.header else 'the model'}: the model's chat template"
            if not isinstance(source, str):
                raise UsageError("this model has no chat template (a base model): use --raw, or --template FILE|NAME")
            self._template = ChatTemplate(source, origin)
        # BOS/EOS as llama.cpp's vocabulary has them (it ignores ids out of range).
        bos = llama_cpp.llama_vocab_bos(self.vocab)
        eos = llama_cpp.llama_vocab_eos(self.vocab)
        bos_text = self.token_bytes(bos, special=True).decode("utf-8", "replace") if bos >= 0 else ""
        eos_text = self.token_bytes(eos, special=True).decode("utf-8", "replace") if eos >= 0 else ""
        return self._template.render(messages, bos_token=bos_text, eos_token=eos_text, add_generation_prompt=bool(add_generation_prompt))

    def _render_builtin(self, name: str, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        arr = (llama_cpp.llama_chat_message * max(len(messages), 1))()
        keep = []
        for i, m in enumerate(messages):
            role, content = str(m.get("role", "")).encode("utf-8", "replace"), str(m.get("content") or "").encode("utf-8", "replace")
            keep += [role, content]
            arr[i].role, arr[i].content = role, content
        n = llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_generation_prompt, None, 0)
        if n < 0:
            raise UsageError(f"llama.cpp cannot apply the built-in template {name} to this conversation")
        buf = ctypes.create_string_buffer(n + 1)
        llama_cpp.llama_chat_apply_template(name.encode(), arr, len(messages), add_generation_prompt, buf, n + 1)
        return buf.raw[:n].decode("utf-8", "replace")

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
        counters, and our figures must agree with them. No chunk is ever larger
        than n_batch: llama_decode asserts (aborts) on that (llama-context.cpp,
        GGML_ASSERT(n_tokens_all <= cparams.n_batch)), so with --batch 1 every
        chunk is one token."""
        n_batch = max(1, llama_cpp.llama_n_batch(self.ctx))
        chunks = [tokens[i : i + n_batch] for i in range(0, len(tokens), n_batch)]
        if n_batch >= 2 and len(chunks) > 1 and len(chunks[-1]) == 1:
            chunks[-2], chunks[-1] = chunks[-2][:-1], chunks[-2][-1:] + chunks[-1]
        return chunks

    @property
    def n_ctx(self) -> int:
        self._require()
        return int(llama_cpp.llama_n_ctx(self.ctx))

    @property
    def can_shift(self) -> bool:
        """Whether llama.cpp can shift this cache (not a sliding-window cache
        smaller than the context, not a recurrent model)."""
        self._require()
        return bool(llama_cpp.llama_memory_can_shift(llama_cpp.llama_get_memory(self.ctx)))

    def reset(self) -> None:
        """Forget the conversation: an empty KV cache."""
        self._require()
        llama_cpp.llama_memory_clear(llama_cpp.llama_get_memory(self.ctx), True)
        self.cache_tokens = []

    def stream(
        self,
        prompt: str | Sequence[int],
        sampling: SamplingConfig,
        *,
        chat: bool = True,
        n_keep: int | None = None,
        start_ns: int | None = None,
    ) -> Iterator[TokenEvent]:
        """A fresh generation from ``prompt`` (the cache is cleared first).

        With ``max_tokens`` set, a full context shifts to make room; with -1 the
        generation stops at a full context (``stop_reason='context'``).
        ``n_keep``: tokens at the front that a context shift never drops. By
        default the whole prompt when it takes at most half the context, else
        just the BOS token, so that ``run -n`` can go past ``n_ctx``.
        ``start_ns``: when the user submitted the prompt (TTFT's clock); now by default."""
        self._require()
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        tokens = self.prompt_tokens(prompt, chat=chat) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise UsageError("the prompt is empty")
        n_ctx = self.n_ctx
        if len(tokens) >= n_ctx:
            raise UsageError(f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}: try --ctx {_round_up(len(tokens) + 256, 256)}")
        if n_keep is None:
            bos = 1 if self.header and tokens[0] == self.header.get("tokenizer.ggml.bos_token_id") else 0
            n_keep = len(tokens) if len(tokens) <= n_ctx // 2 else bos
        self.reset()
        return self._generate(tokens, sampling, n_keep=n_keep, start=start)

    def extend(
        self, tokens: Sequence[int], sampling: SamplingConfig, *, n_keep: int, shift: bool = True, start_ns: int | None = None
    ) -> Iterator[TokenEvent]:
        """Append ``tokens`` to what the cache holds and generate (a chat turn).
        With ``shift=False`` a full context is an error instead of a shift.
        ``start_ns``: when the user submitted the message (TTFT's clock)."""
        self._require()
        if not tokens:
            raise UsageError("nothing to add to the conversation")
        if len(tokens) > self.n_ctx - n_keep - 1:
            raise UsageError(f"the message is {len(tokens)} tokens; the context holds {self.n_ctx} with {n_keep} kept: try a larger --ctx")
        if not shift and len(self.cache_tokens) + len(tokens) >= self.n_ctx:
            raise EngineError(f"the context is full ({len(self.cache_tokens)} of {self.n_ctx} tokens): clear the chat, or turn the sliding window on")
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        return self._generate(list(tokens), sampling, n_keep=n_keep, start=start, shift=shift)

    def prefill(self, tokens: Sequence[int]) -> float:
        """Evaluate ``tokens`` into the cache after what it holds, generating
        nothing (a system prompt to save). Returns the milliseconds it took."""
        self._require()
        if len(self.cache_tokens) + len(tokens) > self.n_ctx:
            raise UsageError(f"{len(tokens)} tokens do not fit the context of {self.n_ctx} with {len(self.cache_tokens)} already in it")
        ns = 0
        for chunk in self._prompt_chunks(list(tokens)):
            ns += self._decode(chunk)
            self.cache_tokens.extend(chunk)
        return ns / 1e6

    def verify(self, tokens: Sequence[int]) -> list[int]:
        """Evaluate ``tokens`` after the cache in one batch and return, for each
        position, the most likely next token (greedy). Speculative decoding
        checks a draft with this; needs ``n_outputs_max >= len(tokens)``."""
        import numpy as np

        self._require()
        n = len(tokens)
        if n > self._n_outputs_max:
            # llama.cpp asserts (aborts the process) past n_outputs_max: refuse instead.
            raise EngineError(f"verifying {n} tokens needs a context loaded with n_outputs_max >= {n} (it has {self._n_outputs_max})")
        if n > llama_cpp.llama_n_batch(self.ctx):
            raise UsageError(f"verifying {n} tokens at once needs --batch {n} or more")
        n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        start = len(self.cache_tokens)
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = start + i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            t0 = time.perf_counter_ns()
            rc = llama_cpp.llama_decode(self.ctx, batch)
            llama_cpp.llama_synchronize(self.ctx)
            self.last_verify_ns = time.perf_counter_ns() - t0
            if rc != 0:
                raise EngineError(f"llama_decode failed ({rc}): {ROUTER.last_error() or 'no reason given'}")
            self.cache_tokens.extend(tokens)
            out = []
            for i in range(n):
                row = np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(self.ctx, i), shape=(n_vocab,))
                out.append(int(row.argmax()))
            return out
        finally:
            llama_cpp.llama_batch_free(batch)

    def is_eog(self, token: int) -> bool:
        return bool(llama_cpp.llama_vocab_is_eog(self.vocab, token))

    def truncate(self, n: int) -> None:
        """Drop everything after the first ``n`` cached tokens (rejected draft tokens)."""
        self._require()
        if n < len(self.cache_tokens):
            llama_cpp.llama_memory_seq_rm(llama_cpp.llama_get_memory(self.ctx), 0, n, -1)
            self.cache_tokens = self.cache_tokens[:n]

    def save_state(self, path: Path) -> int:
        """Write the cache (sequence 0) and its tokens to ``path`` atomically, in
        localllm's checked format (``_state_header``); returns bytes written."""
        self._require()
        size = llama_cpp.llama_state_seq_get_size(self.ctx, 0)
        buf = (ctypes.c_uint8 * max(size, 1))()
        n = llama_cpp.llama_state_seq_get_data(self.ctx, buf, size, 0)
        if not n:
            raise EngineError(f"llama.cpp could not save the cache to {path}")
        data = pack_state(self._state_meta(), self.cache_tokens, bytes(buf)[:n])
        from localllm import atomic

        atomic.write_bytes(path, data)
        return len(data)

    def _state_meta(self) -> dict[str, object]:
        """What a state file must match to be loaded here: this llama.cpp build,
        the model file, the cache layout."""
        import hashlib

        assert self.info is not None
        st = self.info.path.stat()
        return {
            "build": f"llama-cpp-python {llama_cpp.__version__}; " + hashlib.sha256(system_info().encode()).hexdigest()[:16],
            "model": {"path": str(self.info.path.resolve()), "size": st.st_size, "mtime_ns": st.st_mtime_ns},
            "cache": {"type_k": self.info.type_k, "type_v": self.info.type_v, "flash_attn": self.info.flash_attn},
        }

    def load_state(self, path: Path) -> bool:
        """Replace the cache with one saved by ``save_state``. False (and an
        empty cache) when the file fails a check, with the reason in
        ``state_error``: llama.cpp never reads a file that is not exactly what
        this build wrote for this model and context."""
        self._require()
        self.reset()
        self.state_error = None
        try:
            raw = Path(path).read_bytes()
        except OSError as exc:
            self.state_error = f"unreadable ({exc.strerror or exc})"
            return False
        try:
            meta, tokens, payload = unpack_state(raw)
        except StateFileError as exc:
            self.state_error = str(exc)
            return False
        want = self._state_meta()
        for key, what in (("build", "another llama.cpp build"), ("model", "another model file"), ("cache", "other cache settings")):
            if meta.get(key) != want[key]:
                self.state_error = f"written for {what}"
                return False
        n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        if len(tokens) > self.n_ctx or any(not 0 <= t < n_vocab for t in tokens):
            self.state_error = "holds tokens that do not fit this context"
            return False
        buf = (ctypes.c_uint8 * max(len(payload), 1)).from_buffer_copy(payload or b"\0")
        if not llama_cpp.llama_state_seq_set_data(self.ctx, buf, len(payload), 0):
            self.reset()
            self.state_error = "refused by llama.cpp"
            return False
        self.cache_tokens = list(tokens)
        return True

    def _make_room(self, n_new: int, n_keep: int, shifts: list[ShiftRecord]) -> None:
        """Context shift: drop the oldest half of what follows the first ``n_keep``
        tokens (llama.cpp's seq_rm + seq_add, no re-evaluation); where the cache
        cannot shift, re-evaluate the kept window instead."""
        n_ctx = self.n_ctx
        while len(self.cache_tokens) + n_new > n_ctx:
            n_past = len(self.cache_tokens)
            n_left = n_past - n_keep
            if n_left <= 0 or n_keep + n_new > n_ctx:
                raise EngineError(f"the context ({n_ctx}) is full of kept tokens ({n_keep}): raise --ctx or shorten the system prompt")
            n_discard = min(n_left, max(n_left // 2, n_new))
            kept = self.cache_tokens[:n_keep] + self.cache_tokens[n_keep + n_discard :]
            t0 = time.perf_counter_ns()
            mem = llama_cpp.llama_get_memory(self.ctx)
            if llama_cpp.llama_memory_can_shift(mem):
                llama_cpp.llama_memory_seq_rm(mem, 0, n_keep, n_keep + n_discard)
                llama_cpp.llama_memory_seq_add(mem, 0, n_keep + n_discard, n_past, -n_discard)
                self.cache_tokens = kept
                method = "shift"
            else:
                self.reset()
                for chunk in self._prompt_chunks(kept):
                    self._decode(chunk)
                    self.cache_tokens.extend(chunk)
                method = "reprocess"
            shifts.append(ShiftRecord(at_token=n_past, dropped=n_discard, kept=len(kept), ms=(time.perf_counter_ns() - t0) / 1e6, method=method))

    def _generate(self, tokens: list[int], sampling: SamplingConfig, *, n_keep: int, start: int, shift: bool = True) -> Iterator[TokenEvent]:
        llama_cpp.llama_perf_context_reset(self.ctx)
        sampler = self._sampler(sampling)
        self.last_stats = None
        prefill_ns = decode_ns = decode_evals = 0
        token_ns: list[int] = []
        first_text_ns: int | None = None
        shifts: list[ShiftRecord] = []
        stop = "length"
        utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        try:
            for chunk in self._prompt_chunks(tokens):
                self._make_room(len(chunk), n_keep, shifts)
                prefill_ns += self._decode(chunk)
                self.cache_tokens.extend(chunk)
            i = 0
            while sampling.max_tokens < 0 or i < sampling.max_tokens:
                tok = llama_cpp.llama_sampler_sample(sampler, self.ctx, -1)
                now = time.perf_counter_ns()
                if not sampling.ignore_eos and llama_cpp.llama_vocab_is_eog(self.vocab, tok):
                    stop = "stop"
                    break
                token_ns.append(now)
                last = i == sampling.max_tokens - 1
                # A character split across tokens is emitted whole, with the token that completes it.
                text = utf8.decode(self.token_bytes(tok), final=last)
                if first_text_ns is None and text:
                    first_text_ns = now
                yield TokenEvent(i, tok, text, now)
                i += 1
                if last:
                    break
                if len(self.cache_tokens) >= self.n_ctx and (sampling.max_tokens < 0 or not shift):
                    stop = "context"  # no length asked for: stop at a full context rather than shift forever
                    break
                self._make_room(1, n_keep, shifts)
                decode_ns += self._decode([tok])
                decode_evals += 1
                self.cache_tokens.append(tok)
        finally:
            llama_cpp.llama_sampler_free(sampler)
            self.last_stats = compute_stats(
                start_ns=start,
                token_ns=token_ns,
                prompt_tokens=len(tokens),
                prefill_ns=prefill_ns,
                decode_ns=decode_ns,
                decode_evals=decode_evals,
                load_ms=self.info.load_ms if self.info else 0.0,
                end_ns=time.perf_counter_ns(),
                stop_reason=stop,
                n_ctx=self.n_ctx,
                context_used=len(self.cache_tokens),
                shifts=shifts,
                first_text_ns=first_text_ns,
            )

    def bos_token(self) -> int | None:
        """The beginning-of-sequence token when the vocabulary adds one to a text
        (llama_vocab_get_add_bos), else None."""
        self._require()
        if not llama_cpp.llama_vocab_get_add_bos(self.vocab):
            return None
        bos = int(llama_cpp.llama_vocab_bos(self.vocab))
        return bos if bos >= 0 else None

    def logits(self, tokens: Sequence[int]):
        """Logits at every position of ``tokens``, evaluated from an empty cache
        (a float32 array of shape [len(tokens), n_vocab]). Needs a context
        loaded with ``n_outputs_max=0`` and ``n_batch >= len(tokens)``."""
        import numpy as np

        self._require()
        n = len(tokens)
        if n > llama_cpp.llama_n_batch(self.ctx):
            raise UsageError(f"scoring {n} tokens needs --batch {n} or more")
        n_vocab = llama_cpp.llama_vocab_n_tokens(self.vocab)
        self.reset()
        batch = llama_cpp.llama_batch_init(n, 0, 1)
        try:
            batch.n_tokens = n
            for i, tok in enumerate(tokens):
                batch.token[i] = tok
                batch.pos[i] = i
                batch.n_seq_id[i] = 1
                batch.seq_id[i][0] = 0
                batch.logits[i] = True
            rc = llama_cpp.llama_decode(self.ctx, batch)
            if rc != 0:
                raise EngineError(f"llama_decode failed ({rc}): {ROUTER.last_error() or 'no reason given'}")
            ptr = llama_cpp.llama_get_logits(self.ctx)
            out = np.ctypeslib.as_array(ptr, shape=(n, n_vocab)).copy()
        finally:
            llama_cpp.llama_batch_free(batch)
            self.reset()
        return out

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


def load_model_and_context(path: Path, config: LoadConfig, mparams: object, cparams: object) -> tuple[object, object, float]:
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


def llama_params(config: LoadConfig) -> tuple[object, object, list[object]]:
    """llama.cpp's model and context parameters for ``config``, shared by this
    engine and the batch engine (``batch_engine``): threads, offload and RPC
    devices, context and batch sizes, cache types, flash attention (forced on
    for a quantized V cache, which llama.cpp refuses without it), swa_full.
    Returns (model params, context params, ctypes arrays to keep alive)."""
    n_threads = config.n_threads or min(default_threads(), max_threads())
    mparams = llama_cpp.llama_model_default_params()
    mparams.n_gpu_layers = 0x7FFFFFFF if config.n_gpu_layers < 0 else min(config.n_gpu_layers, 0x7FFFFFFF)
    keep = _set_devices(mparams, config)
    cparams = llama_cpp.llama_context_default_params()
    cparams.n_ctx = config.n_ctx
    cparams.n_batch = min(config.n_batch, config.n_ctx)
    cparams.n_ubatch = min(config.n_ubatch, cparams.n_batch)
    cparams.n_threads = n_threads
    cparams.n_threads_batch = n_threads
    cparams.type_k = ggml_type_id(config.type_k)
    cparams.type_v = ggml_type_id(config.type_v)
    flash = "on" if needs_flash_attn(config) else config.flash_attn
    cparams.flash_attn_type = {
        "auto": llama_cpp.LLAMA_FLASH_ATTN_TYPE_AUTO,
        "on": llama_cpp.LLAMA_FLASH_ATTN_TYPE_ENABLED,
        "off": llama_cpp.LLAMA_FLASH_ATTN_TYPE_DISABLED,
    }[flash]
    cparams.swa_full = config.swa_full
    return mparams, cparams, keep


def _set_devices(mparams, config: LoadConfig) -> list[object]:
    """With RPC workers: the workers' devices (probed first, with a timeout), then
    this machine's GPUs, as llama.cpp orders them by default; and the planner's
    split. Returns the ctypes arrays, which must stay alive through the load."""
    keep: list[object] = []
    if config.rpc_servers:
        from localllm import engine_rpc
        from localllm.rpc import parse_endpoints

        devs = engine_rpc.add_servers(parse_endpoints(",".join(config.rpc_servers)))
        n_local = len(config.tensor_split) - len(devs) if config.tensor_split else None
        devs += engine_rpc.local_gpus()[:n_local]
        engine_rpc.on_abort()  # a worker that dies mid-generation: one line and exit 1, not a backtrace
        arr = (ctypes.c_void_p * (len(devs) + 1))(*devs, None)
        mparams.devices = ctypes.addressof(arr)
        keep.append(arr)
    if config.tensor_split:
        n = llama_cpp.llama_max_devices()
        split = (ctypes.c_float * n)(*config.tensor_split[:n])
        mparams.tensor_split = split
        keep.append(split)
    return keep


def builtin_templates() -> list[str]:
    """Names of llama.cpp's built-in chat templates (llama_chat_builtin_templates)."""
    n = llama_cpp.llama_chat_builtin_templates(None, 0)
    arr = (ctypes.c_char_p * max(n, 1))()
    n = llama_cpp.llama_chat_builtin_templates(arr, n)
    return [arr[i].decode() for i in range(max(n, 0))]


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


# -- prompt-cache state files -------------------------------------------------------
#
# Layout: magic, format version (u32), metadata length (u32), metadata (JSON:
# build, model, cache, tokens, payload length), llama.cpp's sequence state
# (payload), and a SHA-256 of everything before it. A file is used only when the
# magic, version, lengths and checksum hold and the metadata matches.

STATE_MAGIC = b"LOCALLLM-KV\0"
STATE_VERSION = 1
_MAX_META = 64 * 1024 * 1024


class StateFileError(Exception):
    """A state file that fails a check (the message says which)."""


def pack_state(meta: dict[str, object], tokens: Sequence[int], payload: bytes) -> bytes:
    import hashlib
    import json
    import struct

    body = json.dumps({**meta, "tokens": list(tokens), "payload_bytes": len(payload)}, separators=(",", ":")).encode()
    head = STATE_MAGIC + struct.pack("<II", STATE_VERSION, len(body)) + body + payload
    return head + hashlib.sha256(head).digest()


def unpack_state(raw: bytes) -> tuple[dict[str, object], list[int], bytes]:
    import hashlib
    import json
    import struct

    fixed = len(STATE_MAGIC) + 8
    if len(raw) < fixed + 32 or not raw.startswith(STATE_MAGIC):
        raise StateFileError("not a localllm prompt cache (an older format, or another file)")
    version, meta_len = struct.unpack_from("<II", raw, len(STATE_MAGIC))
    if version != STATE_VERSION:
        raise StateFileError(f"format version {version}, this localllm reads {STATE_VERSION}")
    if meta_len > _MAX_META or fixed + meta_len + 32 > len(raw):
        raise StateFileError("damaged (its lengths do not add up)")
    if hashlib.sha256(raw[:-32]).digest() != raw[-32:]:
        raise StateFileError("damaged (checksum mismatch)")
    try:
        meta = json.loads(raw[fixed : fixed + meta_len])
        tokens = meta.pop("tokens")
        n_payload = meta.pop("payload_bytes")
        if not isinstance(meta, dict) or not isinstance(tokens, list) or not all(type(t) is int for t in tokens) or type(n_payload) is not int:
            raise ValueError
    except (ValueError, KeyError, TypeError, AttributeError):
        raise StateFileError("damaged (unreadable metadata)") from None
    if fixed + meta_len + n_payload + 32 != len(raw):
        raise StateFileError("damaged (its length is not what its header says)")
    return meta, tokens, raw[fixed + meta_len : -32]


# -- quantization ------------------------------------------------------------------

QUANT_TYPES: dict[str, int] = {
    "F32": 0, "F16": llama_cpp.LLAMA_FTYPE_MOSTLY_F16, "BF16": llama_cpp.LLAMA_FTYPE_MOSTLY_BF16,
    "Q8_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q8_0, "Q6_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q6_K,
    "Q5_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_M, "Q5_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_K_S,
    "Q5_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_0, "Q5_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q5_1,
    "Q4_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_M, "Q4_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_K_S,
    "Q4_0": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_0, "Q4_1": llama_cpp.LLAMA_FTYPE_MOSTLY_Q4_1,
    "IQ4_NL": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_NL, "IQ4_XS": llama_cpp.LLAMA_FTYPE_MOSTLY_IQ4_XS,
    "Q3_K_M": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_M, "Q3_K_S": llama_cpp.LLAMA_FTYPE_MOSTLY_Q3_K_S,
    "Q2_K": llama_cpp.LLAMA_FTYPE_MOSTLY_Q2_K,
}


def quantize_model(
    src: Path,
    dst: Path,
    qtype: str,
    *,
    n_threads: int = 0,
    allow_requantize: bool = False,
    dry_run: bool = False,
    imatrix: dict[str, "object"] | None = None,
) -> None:
    """llama.cpp's own quantizer (llama_model_quantize). Progress and sizes go
    to the log (``ROUTER``): one '[ i/ n] tensor ...' line per tensor, then
    'model size' and 'quant size'. ``imatrix`` maps tensor names to float32
    arrays of per-column importance."""
    install_log_router()
    params = llama_cpp.llama_model_quantize_default_params()
    params.nthread = n_threads
    params.ftype = QUANT_TYPES[qtype]
    params.allow_requantize = allow_requantize
    params.dry_run = dry_run
    keep = []
    if imatrix:
        entries = (llama_cpp.llama_model_imatrix_data * (len(imatrix) + 1))()
        for i, (name, values) in enumerate(imatrix.items()):
            import numpy as np

            arr = np.ascontiguousarray(values, dtype=np.float32)
            keep.append(arr)
            raw = name.encode()
            keep.append(raw)
            entries[i].name = raw
            entries[i].data = arr.ctypes.data_as(ctypes.POINTER(ctypes.c_float))
            entries[i].size = arr.size
        keep.append(entries)
        params.imatrix = ctypes.cast(entries, ctypes.POINTER(llama_cpp.llama_model_imatrix_data))
    mark = ROUTER.mark()
    rc = llama_cpp.llama_model_quantize(str(src).encode(), str(dst).encode(), ctypes.byref(params))
    if rc != 0:
        raise EngineError(f"llama.cpp could not quantize {src.name}: {ROUTER.first_error_since(mark) or 'unknown reason'}")
