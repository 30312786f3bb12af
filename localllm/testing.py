"""A scripted ``Engine`` for UI and unit tests: set delays, exact timestamps, no model.

``ScriptedEngine`` implements the whole ``localllm.engine_api.Engine`` protocol
without llama.cpp, so the cockpit, chat sessions, speculative decoding, bench
and doctor code can be driven with known TTFT and ITL and checked exactly. It
is a fake, not a model: what the product does on a real model is tested on
llama.cpp (``localllm.engine.LlamaCppBackend``).

Its tokenizer splits on whitespace (and before ``<``), giving each new word the
next id; it generates ``tokens`` tokens ``" {word}{i}"``, the ``i``-th stamped
``ttft_ms + i * itl_ms`` after the start (sleeping until then), and is greedy in
a way ``verify`` can check: after token ``t`` it predicts ``t + 1``.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from localllm.engine_api import Generation, LoadConfig, LoadInfo, SamplingConfig, TokenEvent, Verification
from localllm.engine_api.stats import ShiftRecord, compute_stats
from localllm.errors import EngineError, UsageError

EOG = 0  # the end-of-generation token id


class ScriptedEngine:
    """An ``Engine`` whose replies and timings are set in advance."""

    template_source: str | None = None  # no Jinja text: tool calls in the generic format (a test may set one)
    generation_prompt = "<assistant>"  # what a rendering ends with for the reply (a test may open the thinking: DeepSeek R1's "<think>\n")

    def __init__(self, *, ttft_ms: float = 300.0, itl_ms: float = 40.0, tokens: int = 10, word: str = "tok",
                 fail_at: int | None = None, chat_template: bool = True, n_ctx: int | None = None,
                 reply: Sequence[str] | None = None) -> None:
        self.ttft_ms, self.itl_ms, self.tokens, self.word = ttft_ms, itl_ms, tokens, word
        self.reply = list(reply) if reply is not None else None  # each token's text, instead of " {word}{i}"
        self.chats: list[list[dict[str, str]]] = []  # every conversation rendered, as the model was given it
        self.replies: list[Sequence[str]] = []  # replies to give in turn, each as its tokens' texts; then ``reply``
        self.tools: list[dict[str, object]] | None = None  # the tools the last rendering was given
        self.fail_at = fail_at  # raise a RuntimeError (a bug, not a LocalLLMError) before this token
        self.chat_template = chat_template
        self.n_ctx_override = n_ctx  # a context smaller than the load config's (shift tests)
        self.stamps: list[int] = []  # every token's time, over all replies
        # called with a reply's last token's time (perf_counter_ns: CLOCK_MONOTONIC on Linux, comparable
        # across processes) once the UI has taken it: scripts/bench_tui.py times the final frame from it
        self.on_last_token: Callable[[int], None] | None = None
        # told (tokens done, total) as the prompt is "read", one n_batch chunk at a time spread over the TTFT (the engine's
        # generator.Progress): the cockpit's progress line
        self.prefill_progress: Callable[[int, int], None] | None = None
        self.config: LoadConfig | None = None
        self.sampling: SamplingConfig | None = None  # what the last reply was asked to sample with
        self.loads = 0
        self._info: LoadInfo | None = None
        self._cache: list[int] = []
        self._words: dict[str, int] = {"</s>": EOG}
        self._ids: list[str] = ["</s>"]
        self._template_spec: str | None = None
        self._state_error: str | None = None

    # -- the loaded model --------------------------------------------------------
    def load(self, path: Path, config: LoadConfig, header: object = None) -> LoadInfo:
        self.config = config
        self.loads += 1
        self._cache = []
        self._info = LoadInfo(Path(path), 1.0, self.n_ctx, 1, config.n_gpu_layers, config.type_k, config.type_v,
                              config.flash_attn, False)
        return self._info

    def close(self) -> None:
        self._cache = []

    def __enter__(self) -> ScriptedEngine:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def info(self) -> LoadInfo | None:
        return self._info

    @property
    def header(self) -> None:
        return None

    @property
    def load_log(self) -> list[tuple[int, str]]:
        return []  # no llama.cpp: the memory check says n/a

    @property
    def logged_buffers(self) -> dict[str, dict[str, list[float]]]:
        return {}

    @property
    def n_ctx(self) -> int:
        if self.n_ctx_override is not None:
            return self.n_ctx_override
        return self.config.n_ctx if self.config else 0

    # -- tokens and templates ----------------------------------------------------
    @property
    def has_chat_template(self) -> bool:
        return self.chat_template or self._template_spec is not None

    def use_template(self, spec: str) -> None:
        self._template_spec = spec

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                    tools: list[dict[str, object]] | None = None, extra: dict[str, object] | None = None) -> str:
        if not self.has_chat_template:
            raise UsageError("this model has no chat template (a base model): use --raw, or --template FILE|NAME")
        self.chats.append([dict(m) for m in messages])
        self.tools = tools
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + (self.generation_prompt if add_generation_prompt else "")

    def _id(self, word: str) -> int:
        if word not in self._words:
            self._words[word] = len(self._ids)
            self._ids.append(word)
        return self._words[word]

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [self._id(w) for w in text.replace("<", " <").split()]

    def prompt_tokens(self, prompt: str, *, chat: bool) -> list[int]:
        if chat and self.has_chat_template:
            return self.tokenize(self.render_chat([{"role": "user", "content": prompt}]))
        return self.tokenize(prompt)

    def token_bytes(self, token: int, *, special: bool = False) -> bytes:
        word = self._ids[token] if 0 <= token < len(self._ids) else f"#{token}"
        return (" " + word).encode()

    def detokenize(self, tokens: Sequence[int]) -> str:
        return b"".join(self.token_bytes(t) for t in tokens).decode("utf-8", "replace")

    def is_eog(self, token: int) -> bool:
        return token == EOG

    def bos_token(self) -> int | None:
        return None

    # -- the KV cache ------------------------------------------------------------
    @property
    def cache_tokens(self) -> list[int]:
        return list(self._cache)

    @property
    def context_used(self) -> int:
        return len(self._cache)

    @property
    def state_error(self) -> str | None:
        return self._state_error

    def reset(self) -> None:
        self._cache = []

    def prefill(self, tokens: Sequence[int]) -> float:
        if len(self._cache) + len(tokens) > self.n_ctx:
            raise UsageError(f"{len(tokens)} tokens do not fit the context of {self.n_ctx}")
        self._cache.extend(tokens)
        return 0.0

    def truncate(self, n: int) -> None:
        del self._cache[n:]

    def save_state(self, path: Path) -> int:
        data = "scripted " + " ".join(map(str, self._cache))
        path.write_text(data)
        return len(data)

    def load_state(self, path: Path) -> bool:
        self._cache = []
        self._state_error = None
        words = Path(path).read_text().split()
        if not words or words[0] != "scripted" or not all(w.isdigit() for w in words[1:]):
            self._state_error = "not a scripted prompt cache"
            return False
        self._cache = [int(t) for t in words[1:]]
        return True

    # -- generating and scoring --------------------------------------------------
    def stream(self, prompt: str | Sequence[int], sampling: SamplingConfig, *, chat: bool = True,
               n_keep: int | None = None, start_ns: int | None = None) -> Generation:
        tokens = self.prompt_tokens(prompt, chat=chat) if isinstance(prompt, str) else list(prompt)
        if not tokens:
            raise UsageError("the prompt is empty")
        self._cache = []
        return self.extend(tokens, sampling, n_keep=len(tokens) if n_keep is None else n_keep, start_ns=start_ns)

    def extend(self, tokens: Sequence[int], sampling: SamplingConfig, *, n_keep: int, shift: bool = True,
               start_ns: int | None = None) -> Generation:
        if not tokens:
            raise UsageError("nothing to add to the conversation")
        if self.config is None:
            raise EngineError("no model is loaded")
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        self.sampling = sampling
        return Generation(lambda out: self._run(out, list(tokens), sampling, n_keep, shift, start))

    def _make_room(self, n_new: int, n_keep: int, shifts: list[ShiftRecord]) -> None:
        """The engine's rule (``KVCache.make_room``): drop half of what follows the kept tokens."""
        while len(self._cache) + n_new > self.n_ctx:
            n_past = len(self._cache)
            n_left = n_past - n_keep
            if n_left <= 0:
                raise EngineError(f"the context ({self.n_ctx}) is full of kept tokens ({n_keep})")
            n_discard = min(n_left, max(n_left // 2, n_new))
            self._cache = self._cache[:n_keep] + self._cache[n_keep + n_discard :]
            shifts.append(ShiftRecord(at_token=n_past, dropped=n_discard, kept=len(self._cache), ms=0.0, method="shift"))

    def _run(self, out: Generation, tokens: list[int], sampling: SamplingConfig, n_keep: int, shift: bool,
             start: int) -> Iterator[TokenEvent]:
        if self.replies:  # the next scripted reply (a tool call, then the answer that reads its result)
            self.reply = list(self.replies.pop(0))
        tokens_out = len(self.reply) if self.reply is not None else self.tokens
        n = tokens_out if sampling.max_tokens < 0 else min(tokens_out, sampling.max_tokens)
        stamps: list[int] = []
        shifts: list[ShiftRecord] = []
        stop = "length"
        try:
            self._make_room(len(tokens), n_keep, shifts)
            self._cache.extend(tokens)
            self._report_prefill(len(tokens), start)
            for i in range(n):
                if self.fail_at is not None and i == self.fail_at:
                    raise RuntimeError(f"scripted failure at token {i}")
                t = start + int((self.ttft_ms + i * self.itl_ms) * 1e6)
                while time.perf_counter_ns() < t:
                    time.sleep(min(0.005, max((t - time.perf_counter_ns()) / 1e9, 0)))
                if not shift and len(self._cache) + 1 > self.n_ctx:
                    stop = "context"
                    break
                self._make_room(1, n_keep, shifts)
                tok = self._id(f"{self.word}{i}")
                self._cache.append(tok)
                stamps.append(t)
                self.stamps.append(t)
                yield TokenEvent(i, tok, self.reply[i] if self.reply is not None else f" {self.word}{i}", t)
            if stamps and self.on_last_token is not None:
                self.on_last_token(stamps[-1])
        finally:
            end = stamps[-1] if stamps else start
            out.finish(compute_stats(
                start_ns=start, token_ns=stamps, prompt_tokens=len(tokens), prefill_ns=int(self.ttft_ms * 1e6),
                decode_ns=int(self.itl_ms * 1e6) * max(len(stamps) - 1, 0), decode_evals=max(len(stamps) - 1, 0),
                load_ms=1.0, end_ns=end, stop_reason=stop, n_ctx=self.n_ctx, context_used=len(self._cache), shifts=shifts,
            ))

    def _report_prefill(self, total: int, start: int) -> None:
        """``prefill_progress`` before each n_batch chunk, at its share of the TTFT, and after the last."""
        report = self.prefill_progress
        if report is None:
            return
        n_batch = max(1, self.config.n_batch if self.config is not None else 512)
        starts = range(0, total, n_batch)
        for k, done in enumerate(starts):
            t = start + int(self.ttft_ms * 1e6 * k / max(len(starts), 1))
            while time.perf_counter_ns() < t:
                time.sleep(min(0.005, max((t - time.perf_counter_ns()) / 1e9, 0)))
            report(done, total)
        report(total, total)

    def verify(self, tokens: Sequence[int]) -> Verification:
        """Greedy by rule: after token ``t`` comes ``t + 1``."""
        if len(self._cache) + len(tokens) > self.n_ctx:
            raise UsageError("the draft does not fit the context")
        self._cache.extend(tokens)
        return Verification([t + 1 for t in tokens], int(self.itl_ms * 1e6))

    def logits(self, tokens: Sequence[int], first: int = 0):
        """One-hot rows from index ``first`` on: position ``i`` predicts ``tokens[i] + 1`` (numpy, like the engine)."""
        import numpy as np

        n_vocab = max([len(self._ids), *(t + 2 for t in tokens)])
        out = np.full((len(tokens) - first, n_vocab), -10.0, dtype=np.float32)
        for i, t in enumerate(tokens[first:]):
            out[i, t + 1] = 10.0
        return out
