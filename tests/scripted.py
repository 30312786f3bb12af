"""A scripted backend for UI tests: set delays, exact timestamps, no model.

It implements what the cockpit uses from the engine (load, extend, reset,
tokenize, render_chat, cache_tokens, last_stats), so the latency panel can be
checked against known TTFT and ITL. The product's behaviour is tested on
llama.cpp elsewhere; this only drives the display.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Iterator, Sequence

from localllm.backend import LoadConfig, LoadInfo, SamplingConfig, TokenEvent
from localllm.metrics import GenerationStats, compute_stats


class ScriptedBackend:
    def __init__(self, *, ttft_ms: float = 300.0, itl_ms: float = 40.0, tokens: int = 10, word: str = "tok",
                 fail_at: int | None = None, chat_template: bool = True) -> None:
        self.ttft_ms, self.itl_ms, self.tokens, self.word = ttft_ms, itl_ms, tokens, word
        self.fail_at = fail_at  # raise a RuntimeError (a bug, not a LocalLLMError) before this token
        self.chat_template = chat_template
        self.stamps: list[int] = []  # every token's time, over all replies
        self.cache_tokens: list[int] = []
        self.last_stats: GenerationStats | None = None
        self.config: LoadConfig | None = None
        self.loads = 0

    def load(self, path: Path, config: LoadConfig) -> LoadInfo:
        self.config = config
        self.loads += 1
        return LoadInfo(Path(path), 1.0, config.n_ctx, 1, config.n_gpu_layers, config.type_k, config.type_v, config.flash_attn, False)

    def close(self) -> None:
        pass

    @property
    def n_ctx(self) -> int:
        return self.config.n_ctx if self.config else 0

    @property
    def has_chat_template(self) -> bool:
        return self.chat_template

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True) -> str:
        text = "".join(f"<{m['role']}>{m['content']}</{m['role']}>" for m in messages)
        return text + ("<assistant>" if add_generation_prompt else "")

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]:
        return [hash(w) % 1000 for w in text.replace("<", " <").split()]

    def reset(self) -> None:
        self.cache_tokens = []

    def prefill(self, tokens: Sequence[int]) -> float:
        self.cache_tokens.extend(tokens)
        return 0.0

    def save_state(self, path: Path) -> int:
        data = " ".join(map(str, self.cache_tokens))
        path.write_text(data)
        return len(data)

    def load_state(self, path: Path) -> bool:
        self.cache_tokens = [int(t) for t in path.read_text().split()]
        return True

    def extend(
        self, tokens: Sequence[int], sampling: SamplingConfig, *, n_keep: int, shift: bool = True, start_ns: int | None = None
    ) -> Iterator[TokenEvent]:
        start = start_ns if start_ns is not None else time.perf_counter_ns()
        self.cache_tokens.extend(tokens)
        n = self.tokens if sampling.max_tokens < 0 else min(self.tokens, sampling.max_tokens)
        stamps: list[int] = []
        try:
            for i in range(n):
                if self.fail_at is not None and i == self.fail_at:
                    raise RuntimeError(f"scripted failure at token {i}")
                t = start + int((self.ttft_ms + i * self.itl_ms) * 1e6)
                while time.perf_counter_ns() < t:
                    time.sleep(min(0.005, max((t - time.perf_counter_ns()) / 1e9, 0)))
                stamps.append(t)
                self.stamps.append(t)
                self.cache_tokens.append(i)
                yield TokenEvent(i, i, f" {self.word}{i}", t)
        finally:
            end = stamps[-1] if stamps else start
            self.last_stats = compute_stats(
                start_ns=start, token_ns=stamps, prompt_tokens=len(tokens), prefill_ns=int(self.ttft_ms * 1e6),
                decode_ns=int(self.itl_ms * 1e6) * max(len(stamps) - 1, 0), decode_evals=max(len(stamps) - 1, 0),
                load_ms=1.0, end_ns=end, stop_reason="length", n_ctx=self.n_ctx, context_used=len(self.cache_tokens),
            )
