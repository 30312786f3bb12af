"""What the rest of localllm may use of an engine: the ``Engine`` protocol and
the ``Generation`` it hands back.

Pure Python (no llama.cpp), so chat, speculative decoding, doctor, bench, the
commands and the cockpit are typed against it and run on ``localllm.testing``'s
scripted fake as well as on ``localllm.engine.LlamaCppBackend``. A generation's
numbers travel in the ``Generation`` object the caller holds, not in attributes
left on the engine, so two generations can never read each other's stats.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from localllm.engine_api.config import LoadConfig
from localllm.engine_api.records import LoadInfo, SamplingConfig, SpecStats, TokenEvent
from localllm.engine_api.stats import GenerationStats

if TYPE_CHECKING:
    from localllm.modelfile.gguf_file import GGUFHeader


# The variables the renderer itself gives a chat template: ``extra`` (a request's
# chat_template_kwargs) cannot replace them; llama.cpp lets it, so a client could
# swap the messages past serve's checks, or a function (engine/chat_template.py)
TEMPLATE_RESERVED = frozenset({"messages", "bos_token", "eos_token", "add_generation_prompt", "raise_exception",
                               "strftime_now", "tools", "functions"})

class Generation:
    """A running generation: iterate it for ``TokenEvent``s; ``close`` ends it
    early. ``stats`` (and ``spec`` for a speculative one) exist once it has
    ended, exhausted or closed; before that they are None.

    ``produce`` is a generator function given this object; it yields the
    events and calls ``finish`` in its ``finally``."""

    def __init__(self, produce: Callable[[Generation], Iterator[TokenEvent]]) -> None:
        self.stats: GenerationStats | None = None
        self.spec: SpecStats | None = None
        self.ended = False
        self._events = produce(self)

    def finish(self, stats: GenerationStats | None, spec: SpecStats | None = None) -> None:
        """The producer's last word (from its ``finally``)."""
        self.stats, self.spec, self.ended = stats, spec, True

    def __iter__(self) -> Generation:
        return self

    def __next__(self) -> TokenEvent:
        return next(self._events)

    def close(self) -> None:
        """End the generation now (its ``finally`` runs: stats are computed)."""
        close = getattr(self._events, "close", None)
        if close is not None:
            close()
        self.ended = True

    def drain(self) -> GenerationStats:
        """Run to the end and return the stats (benchmarks, warm-ups)."""
        try:
            for _ in self:
                pass
        finally:
            self.close()
        assert self.stats is not None, "the generation ended without stats"
        return self.stats

    def __enter__(self) -> Generation:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Verification(NamedTuple):
    """``Engine.verify``'s answer: the greedy next token after each position,
    and how long the one batch took (speculative decoding's decode time)."""

    predictions: list[int]
    ns: int


class Engine(Protocol):
    """Everything chat, speculative decoding, doctor, bench, the commands and
    the cockpit use of an engine. ``localllm.engine.LlamaCppBackend`` is the
    product's; ``localllm.testing.ScriptedEngine`` a fake for UI and unit tests."""

    # -- the loaded model ------------------------------------------------------
    @property
    def info(self) -> LoadInfo | None: ...

    @property
    def header(self) -> GGUFHeader | None: ...

    @property
    def load_log(self) -> list[tuple[int, str]]:
        """llama.cpp's log lines (level, text) of the last load: what it allocated
        where, for the post-load memory check (``plan.memcheck``)."""
        ...

    @property
    def logged_buffers(self) -> dict[str, dict[str, list[float]]]:
        """Device -> buffer kind -> MiB, as llama.cpp logged them at load."""
        ...

    @property
    def n_ctx(self) -> int: ...

    def load(self, path: Path, config: LoadConfig, header: Any = None) -> LoadInfo:
        """Load ``path`` as ``config`` says; ``header``: its GGUF header, read
        already by the load path (``localllm.runtime``), else the engine reads it."""
        ...

    def close(self) -> None: ...

    def __enter__(self) -> Engine: ...

    def __exit__(self, *exc: object) -> None: ...

    # -- tokens and templates --------------------------------------------------
    @property
    def has_chat_template(self) -> bool: ...

    def use_template(self, spec: str) -> None: ...

    def render_chat(self, messages: list[dict[str, str]], *, add_generation_prompt: bool = True,
                    tools: list[dict[str, object]] | None = None, extra: dict[str, object] | None = None) -> str:
        """The chat template applied; ``tools``: OpenAI's tool objects, given to the
        template as Transformers' ``apply_chat_template(tools=...)`` gives them;
        ``extra``: more template variables (``enable_thinking``, ...)."""
        ...

    @property
    def template_source(self) -> str | None:
        """The chat template's text, where the tool-call format is read from (None: unknown)."""
        ...

    def tokenize(self, text: str, *, add_special: bool = True, parse_special: bool = False) -> list[int]: ...

    def prompt_tokens(self, prompt: str, *, chat: bool) -> list[int]: ...

    def token_bytes(self, token: int, *, special: bool = False) -> bytes: ...

    def detokenize(self, tokens: Sequence[int]) -> str: ...

    def is_eog(self, token: int) -> bool: ...

    def bos_token(self) -> int | None: ...

    # -- the KV cache ----------------------------------------------------------
    @property
    def cache_tokens(self) -> list[int]:
        """A copy of what the KV cache holds, position by position."""
        ...

    @property
    def context_used(self) -> int: ...

    @property
    def state_error(self) -> str | None:
        """Why the last ``load_state`` refused its file."""
        ...

    def reset(self) -> None: ...

    def prefill(self, tokens: Sequence[int]) -> float: ...

    def truncate(self, n: int) -> None: ...

    def save_state(self, path: Path) -> int: ...

    def load_state(self, path: Path) -> bool: ...

    # -- generating and scoring ------------------------------------------------
    def stream(self, prompt: str | Sequence[int], sampling: SamplingConfig, *, chat: bool = True,
               n_keep: int | None = None, start_ns: int | None = None) -> Generation:
        """A fresh generation from ``prompt`` (the cache is cleared first)."""
        ...

    def extend(self, tokens: Sequence[int], sampling: SamplingConfig, *, n_keep: int, shift: bool = True,
               start_ns: int | None = None) -> Generation:
        """Append ``tokens`` to the cache and generate (a chat turn)."""
        ...

    def verify(self, tokens: Sequence[int]) -> Verification: ...

    def logits(self, tokens: Sequence[int], first: int = 0): ...
