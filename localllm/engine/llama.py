"""``LlamaCppBackend``: the ``Engine`` on llama.cpp, assembled from the parts.

It holds a ``ModelHandle`` (model and context), a ``Tokenizer`` (vocabulary
and chat template), a ``KVCache`` (the token mirror), and delegates generating
and scoring to ``generator`` and ``scorer``. It drives llama.cpp through
llama-cpp-python's low-level bindings rather than the ``Llama`` class, for
three measured reasons:

- ``Llama(verbose=False)`` redirects file descriptors 1 and 2 to /dev/null while
  it loads, which would blank a Textual screen drawn on fd 1;
- we need a timestamp at each llama_decode + llama_synchronize to match
  llama.cpp's own perf counters (t_p_eval_ms / t_eval_ms), and at each sample;
- the decode loop then has no per-token numpy copies of the logits.
"""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

from localllm.audio.sound import AudioClip
from localllm.engine import generator, scorer
from localllm.engine.kvcache import KVCache
from localllm.engine.lora import Adapters, AdapterSpec, clear
from localllm.engine.model import ModelHandle
from localllm.engine.template import TemplateChoice
from localllm.engine.tokenizer import Tokenizer
from localllm.engine_api import Generation, LoadConfig, LoadInfo, SamplingConfig, Verification
from localllm.engine_api.errors import InvalidSetting
from localllm.errors import EngineError, UsageError
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.threads import ThreadController
from localllm.vision.image import RGBImage
from localllm.vision.marker import strip_marker, with_images
from localllm.vision.projector import ProjectorInfo

if TYPE_CHECKING:
    from localllm.engine.mtmd import MediaPrompt, Projector


def _round_up(n: int, k: int) -> int:
    return (n + k - 1) // k * k


class LlamaCppBackend:
    """Load a GGUF with llama.cpp and stream timed tokens from it (an ``Engine``)."""

    def __init__(self) -> None:
        self._handle: ModelHandle | None = None
        self._tok: Tokenizer | None = None
        self._cache: KVCache | None = None
        self._adapters: Adapters | None = None  # LoRA adapters of the loaded model (load_adapters)
        self._template = TemplateChoice()  # outlives a reload: --template stays chosen
        self._projector: Projector | None = None  # a vision model's mmproj (load_projector), freed with the model
        # told (tokens done, total) as a prompt is read, chunk by chunk (generator.Progress): the cockpit's progress line
        self.prefill_progress: generator.Progress | None = None

    # -- load / close -----------------------------------------------------------
    def load(self, path: Path, config: LoadConfig, header: GGUFHeader | None = None) -> LoadInfo:
        header = ModelHandle.check(path, config, header)  # a bad file or setting keeps the loaded model
        self.close()
        handle = ModelHandle.open(path, config, header)
        self._handle, self._cache = handle, KVCache(handle)
        self._tok = Tokenizer(handle.vocab, handle.header, self._template)
        return handle.info

    def close(self) -> None:
        if self._projector is not None:
            self._projector.close()  # before the model it was loaded for
            self._projector = None
        if self._adapters is not None:
            self._adapters.free()  # before the model (llama_adapter_lora_free unregisters from it)
            self._adapters = None
        if self._handle is not None:
            self._handle.close()
        self._handle = self._tok = self._cache = None
        self._template.forget_compiled()

    def load_adapters(self, specs: Sequence[AdapterSpec]) -> list[Path]:
        """Load LoRA adapters for the loaded model (``--lora``, ``--lora-scaled``)
        and set them on its context with their scales; replaces any loaded before.
        Each file is checked against the model's header first: one line naming
        the cause for a wrong, missing or damaged file (``engine.lora``).
        Returns their paths, by id."""
        handle, _, cache = self._parts()
        adapters = Adapters(handle.model, handle.header, specs) if specs else None
        if self._adapters is not None:
            self._adapters.free()
        self._adapters = adapters
        if adapters is not None:
            adapters.apply(handle.ctx)
        else:
            clear(handle.ctx)
        cache.reset()  # the cache was computed with other weights
        return adapters.paths if adapters is not None else []

    def set_adapter_scales(self, scales: Sequence[float]) -> None:
        """New scales for the loaded adapters, by id (0 turns one off); the cache is cleared."""
        handle, _, cache = self._parts()
        if self._adapters is None:
            raise UsageError("no LoRA adapter is loaded")
        self._adapters.apply(handle.ctx, scales)
        self._adapters.scales = [float(s) for s in scales]
        cache.reset()

    @property
    def adapters(self) -> list[tuple[Path, float]]:
        """The loaded LoRA adapters and their scales, by id."""
        a = self._adapters
        return list(zip(a.paths, a.scales)) if a is not None else []

    def __enter__(self) -> LlamaCppBackend:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _parts(self) -> tuple[ModelHandle, Tokenizer, KVCache]:
        if self._handle is None or self._tok is None or self._cache is None:
            raise EngineError("no model is loaded")
        return self._handle, self._tok, self._cache

    @property
    def info(self) -> LoadInfo | None:
        return self._handle.info if self._handle is not None else None

    @property
    def header(self) -> GGUFHeader | None:
        return self._handle.header if self._handle is not None else None

    @property
    def load_log(self) -> list[tuple[int, str]]:
        return list(self._handle.load_log) if self._handle is not None else []

    @property
    def logged_buffers(self) -> dict[str, dict[str, list[float]]]:
        return self._handle.logged_buffers if self._handle is not None else {}

    @property
    def n_ctx(self) -> int:
        return self._parts()[0].n_ctx

    @property
    def threads(self) -> ThreadController | None:
        """The decode thread counts of the loaded model, chosen per step (``localllm.threads``);
        None when none is loaded. Read by the cockpit's figures from another thread: counts only."""
        h = self._handle
        return h.steer.controller if h is not None and h.steer is not None else None

    @contextmanager
    def pinned_threads(self, n: int) -> Iterator[None]:
        """Every step on ``n`` threads for the block, then the controller as it was:
        ``doctor`` measures decode at each count side by side with this."""
        h = self._handle
        if h is None or h.steer is None:
            yield
            return
        steer, before = h.steer, h.steer.controller
        steer.controller = ThreadController(n, hi=n, fixed=True, why="pinned")
        try:
            yield
        finally:
            steer.controller = before

    def perf_counters(self) -> dict[str, float]:
        """llama.cpp's own counters for the last generation (llama_perf_context)."""
        return self._parts()[0].perf_counters()

    # -- text <-> tokens --------------------------------------------------------
    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return self._parts()[1].tokenize(text, add_special=add_special, parse_special=parse_special)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        return self._parts()[1].token_bytes(token, special=special)

    def detokenize(self, tokens: Sequence[int]) -> str:
        return self._parts()[1].detokenize(tokens)

    def is_eog(self, token: int) -> bool:
        return self._parts()[1].is_eog(token)

    def bos_token(self) -> int | None:
        return self._parts()[1].bos_token()

    @property
    def has_chat_template(self) -> bool:
        return self._template.available(self.header)

    def use_template(self, spec: str) -> None:
        """``--template FILE|NAME``: a Jinja file, or one of llama.cpp's built-in
        templates by name (chatml, llama3, gemma, ...), instead of the model's."""
        self._template.use(spec)

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                    tools: list[dict[str, object]] | None = None, extra: dict[str, object] | None = None) -> str:
        return self._parts()[1].render_chat(messages, add_generation_prompt=add_generation_prompt, tools=tools, extra=extra)

    @property
    def template_source(self) -> str | None:
        """The chat template's Jinja text (None for a built-in one or none): which
        tool-call format it speaks is read from it (serve/tools.py's ``detect``)."""
        return self._template.source(self.header)

    def prompt_tokens(self, prompt: str, *, chat: bool) -> list[int]:
        return self._parts()[1].prompt_tokens(prompt, chat=chat)

    # -- the KV cache -----------------------------------------------------------
    @property
    def cache_tokens(self) -> list[int]:
        return self._cache.tokens if self._cache is not None else []

    @property
    def context_used(self) -> int:
        return len(self._cache) if self._cache is not None else 0

    @property
    def can_shift(self) -> bool:
        return self._parts()[2].can_shift

    @property
    def state_error(self) -> str | None:
        return self._cache.state_error if self._cache is not None else None

    def reset(self) -> None:
        self._parts()[2].reset()

    def prefill(self, tokens: Sequence[int]) -> float:
        return self._parts()[2].prefill(tokens)

    def truncate(self, n: int) -> None:
        self._parts()[2].truncate(n)

    def save_state(self, path: Path) -> int:
        return self._parts()[2].save_state(path)

    def load_state(self, path: Path) -> bool:
        return self._parts()[2].load_state(path)

    # -- generation -------------------------------------------------------------
    def stream(
        self,
        prompt: str | Sequence[int],
        sampling: SamplingConfig,
        *,
        chat: bool = True,
        n_keep: int | None = None,
        start_ns: int | None = None,
    ) -> Generation:
        """A fresh generation from ``prompt`` (the cache is cleared first).

        With ``max_tokens`` set, a full context shifts to make room; with -1 the
        generation stops at a full context (``stop_reason='context'``).
        ``n_keep``: tokens at the front that a context shift never drops. By
        default the whole prompt when it takes at most half the context, else
        just the BOS token, so that ``run -n`` can go past ``n_ctx``.
        ``start_ns``: when the user submitted the prompt (TTFT's clock); now by default."""
        handle, tok, cache = self._parts()
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        tokens = tok.prompt_tokens(prompt, chat=chat) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise UsageError("the prompt is empty")
        n_ctx = handle.n_ctx
        if len(tokens) >= n_ctx:
            raise InvalidSetting(f"the prompt is {len(tokens)} tokens but the context holds {n_ctx}: try {{n_ctx}} {_round_up(len(tokens) + 256, 256)}")
        if n_keep is None:
            bos = 1 if tokens[0] == handle.header.get("tokenizer.ggml.bos_token_id") else 0
            n_keep = len(tokens) if len(tokens) <= n_ctx // 2 else bos
        cache.reset()
        return generator.generate(handle, tok, cache, tokens, sampling, n_keep=n_keep, start=start, progress=self.prefill_progress)

    def extend(
        self, tokens: Sequence[int], sampling: SamplingConfig, *, n_keep: int, shift: bool = True, start_ns: int | None = None
    ) -> Generation:
        """Append ``tokens`` to what the cache holds and generate (a chat turn).
        With ``shift=False`` a full context is an error instead of a shift.
        ``start_ns``: when the user submitted the message (TTFT's clock)."""
        handle, tok, cache = self._parts()
        if not tokens:
            raise UsageError("nothing to add to the conversation")
        n_ctx = handle.n_ctx
        if len(tokens) > n_ctx - n_keep - 1:
            raise InvalidSetting(f"the message is {len(tokens)} tokens; the context holds {n_ctx} with {n_keep} kept: try a larger {{n_ctx}}")
        if not shift and len(cache) + len(tokens) >= n_ctx:
            raise EngineError(f"the context is full ({len(cache)} of {n_ctx} tokens): clear the chat, or turn the sliding window on")
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        return generator.generate(handle, tok, cache, list(tokens), sampling, n_keep=n_keep, start=start, shift=shift,
                                  progress=self.prefill_progress)

    # -- scoring ----------------------------------------------------------------
    def verify(self, tokens: Sequence[int]) -> Verification:
        """For each of ``tokens`` evaluated after the cache (one batch), the greedy
        next token; and the batch's time. Needs ``n_outputs_max >= len(tokens)``."""
        handle, _, cache = self._parts()
        return scorer.verify(handle, cache, tokens)

    def logits(self, tokens: Sequence[int], first: int = 0):
        """Logits at each position of ``tokens`` from index ``first`` on, from an empty cache ([n - first, n_vocab] float32)."""
        handle, _, cache = self._parts()
        return scorer.logits(handle, cache, tokens, first)

    # -- images (a vision model: engine.mtmd) -------------------------------------
    def load_projector(self, path: Path) -> ProjectorInfo:
        """Load a projector (mmproj) for the loaded model; checked against its
        header first (one line naming both files). Replaces one loaded before."""
        from localllm.engine.mtmd import Projector  # lazy: libmtmd's bindings (~13 ms), only for a vision model

        handle, _, _ = self._parts()
        proj = Projector(handle, Path(path))
        if self._projector is not None:
            self._projector.close()
        self._projector = proj
        return proj.info

    @property
    def projector(self) -> Projector | None:
        """The loaded projector (its ``encoded`` count: images the vision encoder ran on)."""
        return self._projector

    def last_logits(self):
        """The logits after the last evaluated position (``engine.mtmd.last_logits``)."""
        from localllm.engine.mtmd import last_logits  # lazy: as in load_projector

        return last_logits(self._parts()[0])

    def _media(self, text: str, images: Sequence[RGBImage | AudioClip], *, add_special: bool, parse_special: bool) -> MediaPrompt:
        if self._projector is None:
            if any(isinstance(m, AudioClip) for m in images):
                raise UsageError("audio needs an audio model's projector (mmproj), and none is loaded")
            raise UsageError("images need a vision model's projector, and none is loaded")
        return self._projector.tokenize(text, images, add_special=add_special, parse_special=parse_special)

    def stream_images(self, prompt: str, images: Sequence[RGBImage | AudioClip], sampling: SamplingConfig, *, chat: bool = True,
                      start_ns: int | None = None) -> Generation:
        """``stream`` with ``images`` before the prompt's text (as Ollama and LM
        Studio place them); the cache is cleared first."""
        handle, tok, cache = self._parts()
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        typed = strip_marker(prompt)
        if tok.tokenize(typed, add_special=False, parse_special=True) != tok.tokenize(typed, add_special=False, parse_special=False):
            raise UsageError("the prompt holds special-token text, which cannot be kept as plain text beside images")
        body = with_images(typed, len(images))
        if chat and tok.has_chat_template:
            mp = self._media(tok.render_chat([{"role": "user", "content": body}]), images, add_special=False, parse_special=True)
        else:
            mp = self._media(body, images, add_special=True, parse_special=False)
        n_ctx = handle.n_ctx
        total = mp.n_tokens
        if total >= n_ctx:
            mp.close()
            raise InvalidSetting(f"the prompt and its images are {total} tokens but the context holds {n_ctx}: try {{n_ctx}} {_round_up(total + 256, 256)}")
        first = mp.pieces[0].tokens[:1] if mp.pieces and not mp.pieces[0].is_image else []
        bos = 1 if first and first[0] == handle.header.get("tokenizer.ggml.bos_token_id") else 0
        n_keep = total if total <= n_ctx // 2 else bos
        cache.reset()
        return self._generate_media(mp, sampling, n_keep=n_keep, shift=True, start=start)

    def extend_images(self, text: str, images: Sequence[RGBImage | AudioClip], sampling: SamplingConfig, *, n_keep: int,
                      shift: bool = True, start_ns: int | None = None) -> Generation:
        """``extend`` with the rendered ``text`` (a chat turn's new part, one
        ``MARKER`` where each of ``images`` goes): what the cache holds stays,
        its images included, and only this turn's images are encoded."""
        handle, _, cache = self._parts()
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        mp = self._media(text, images, add_special=False, parse_special=True)
        n_ctx = handle.n_ctx
        if mp.n_tokens > n_ctx - n_keep - 1:
            mp.close()
            raise InvalidSetting(f"the message and its images are {mp.n_tokens} tokens; the context holds {n_ctx} with {n_keep} kept: try a larger {{n_ctx}}")
        if not shift and len(cache) + mp.n_tokens >= n_ctx:
            mp.close()
            raise EngineError(f"the context is full ({len(cache)} of {n_ctx} tokens): clear the chat, or turn the sliding window on")
        return self._generate_media(mp, sampling, n_keep=n_keep, shift=shift, start=start)

    def _generate_media(self, mp: MediaPrompt, sampling: SamplingConfig, *, n_keep: int, shift: bool, start: int) -> Generation:
        """Generate after ``mp``: its pieces but the last text one in the prologue (images
        encoded there, timed apart), the last through the generator as any prompt."""
        handle, tok, cache = self._parts()
        proj = self._projector
        assert proj is not None  # _media checked
        pieces = list(mp.pieces)
        if not pieces or pieces[-1].is_image or not pieces[-1].tokens:
            mp.close()
            raise UsageError("a prompt may not end with an image: put text after it")
        head, tail = pieces[:-1], pieces[-1].tokens
        # a cache that cannot shift (sliding-window, recurrent) re-reads its kept tokens as text, and an image's
        # cells are no text: with images such a cache stops full instead (the chat says to clear it)
        shift = shift and cache.can_shift
        if not shift and len(cache) + mp.n_tokens >= handle.n_ctx:
            mp.close()
            raise EngineError(f"the context is full ({len(cache)} of {handle.n_ctx} tokens, images included): clear the chat, or load it with a larger context")

        total, progress = mp.n_tokens, self.prefill_progress

        def prologue(keep: int, shifts: list) -> tuple[int, int, int, int]:
            try:
                if progress is not None:
                    progress(0, total)  # the images are encoded first: nothing read yet
                done = proj.evaluate(cache, head, keep, shifts)
            finally:
                mp.close()
            return done.prefill_ns, done.encode_ns, done.images, done.tokens

        return generator.generate(handle, tok, cache, list(tail), sampling, n_keep=n_keep, start=start, shift=shift, prologue=prologue,
                                  progress=progress)
