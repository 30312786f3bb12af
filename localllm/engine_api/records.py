"""The records that cross the engine boundary: how to sample, each token, the
load's facts, speculative decoding's count. How to load (``LoadConfig``) is in
``config``, the ``Engine`` protocol in ``protocol``; ``engine.LlamaCppBackend``
is the product's implementation, ``localllm.testing.ScriptedEngine`` a scripted
one for UI and unit tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class SamplingConfig:
    """Sampling for one generation, and the one set of defaults ``run``, ``chat``,
    the cockpit, ``serve`` and the library share: llama.cpp's own (common/common.h:
    temp 0.8, top-k 40, top-p 0.95, min-p 0.05, repeat penalty 1.0 = off, a random
    seed, no token limit), so a reply here and in llama-cli/llama-server is drawn
    the same way. ``temperature=0`` is greedy (deterministic).

    ``max_tokens=-1`` generates until an end-of-generation token or a full
    context; a positive ``max_tokens`` shifts the context to get there.
    ``ignore_eos`` keeps going past end-of-generation (benchmarks).
    ``repeat_penalty`` divides the logits of the last ``PENALTY_LAST_N`` tokens
    (llama.cpp's ``--repeat-penalty`` with ``--repeat-last-n 64``).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = -1
    ignore_eos: bool = False
    repeat_penalty: float = 1.0
    grammar: str | None = None  # GBNF the reply must match (llama.cpp's grammar sampler; engine.grammar makes it)
    # regexes that make the grammar lazy: it holds from the first capture of a match on (the whole of) the reply so far
    # (llama.cpp's llama_sampler_init_grammar_lazy_patterns; serve's tool calls with tool_choice "auto"); empty: from the start
    grammar_triggers: tuple[str, ...] = ()
    # OpenAI's penalties, as llama-server applies them (llama_sampler_init_penalties over the last 64 tokens): 0 is off
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    logit_bias: tuple[tuple[int, float], ...] = ()  # (token id, added to its logit): OpenAI's logit_bias, -100 bans a token
    # tokens of thinking before the end-of-thinking marker is forced (llama.cpp's --reasoning-budget): -1 unlimited,
    # 0 ends the thinking as soon as it opens; a model whose template does not think in text has nothing to bound
    reasoning_budget: int = -1
    # draftless speculation (localllm.speculation) where the context was loaded with rows for drafts: auto (drafts while
    # they pay), lookup (always drafts), none; the reply is the same token for token either way
    speculate: str = "auto"

    @property
    def penalized(self) -> bool:
        """Whether a penalties sampler is in the chain."""
        return self.repeat_penalty != 1.0 or self.presence_penalty != 0.0 or self.frequency_penalty != 0.0

    def problem(self) -> str | None:
        """Why llama.cpp could not sample with these values (one line naming the
        field and its range), or None: values come from flags, session files,
        the settings screen and HTTP bodies, all untrusted."""
        return sampling_problem(self)


PENALTY_LAST_N = 64  # llama.cpp's --repeat-last-n default
MAX_SEED = 0xFFFFFFFF  # llama.cpp's seeds are uint32
# field: (lowest, highest or None), as llama.cpp's samplers accept them
SAMPLING_RANGES: dict[str, tuple[float, float | None]] = {
    "temperature": (0.0, None),
    "top_k": (0, None),
    "top_p": (0.0, 1.0),
    "min_p": (0.0, 1.0),
    "repeat_penalty": (0.0, None),
    "seed": (0, MAX_SEED),
    "presence_penalty": (-2.0, 2.0),
    "frequency_penalty": (-2.0, 2.0),
}


def sampling_problem(s: SamplingConfig) -> str | None:
    for name, (lo, hi) in SAMPLING_RANGES.items():
        v = getattr(s, name)
        if v is None and name == "seed":
            continue
        if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or v in (float("inf"), float("-inf")):
            return f"{name} must be a finite number, got {v!r}"
        if isinstance(lo, int) and not isinstance(v, int):
            return f"{name} must be a whole number, got {v!r}"
        if v < lo or (hi is not None and v > hi):
            return f"{name} must be {'from ' + str(lo) + ' to ' + str(hi) if hi is not None else 'at least ' + str(lo)}, got {v}"
    if s.repeat_penalty == 0:
        return "repeat_penalty must be above 0 (1.0 is off), got 0"
    if isinstance(s.max_tokens, bool) or not isinstance(s.max_tokens, int) or s.max_tokens == 0 or s.max_tokens < -1:
        return f"max_tokens must be -1 (until the model stops) or at least 1, got {s.max_tokens!r}"
    if s.speculate not in ("auto", "lookup", "none"):
        return f"speculate must be auto, lookup or none, got {s.speculate!r}"
    if isinstance(s.reasoning_budget, bool) or not isinstance(s.reasoning_budget, int) or s.reasoning_budget < -1:
        return f"reasoning_budget must be -1 (unlimited), 0 (no thinking) or a number of tokens, got {s.reasoning_budget!r}"
    return None


@dataclass(frozen=True)
class TokenEvent:
    """One generated token, stamped with ``time.perf_counter_ns`` when sampled."""

    index: int
    token_id: int
    text: str
    t_ns: int


@dataclass(frozen=True)
class LoadInfo:
    path: Path
    load_ms: float
    n_ctx: int
    n_threads: int
    n_gpu_layers: int
    type_k: str
    type_v: str
    flash_attn: str
    gpu_offload_supported: bool


@dataclass
class SpecStats:
    """Speculative decoding's count: tokens drafted, and how many the model accepted."""

    drafted: int = 0
    accepted: int = 0

    @property
    def acceptance(self) -> float | None:
        """The share of drafted tokens kept; None when nothing was drafted (not 0: not measured)."""
        return self.accepted / self.drafted if self.drafted else None


def host_buffer(device: str) -> bool:
    """Whether llama.cpp's buffer name is in system RAM: "CPU", "CPU_Mapped",
    or a GPU backend's pinned host buffer ("CUDA_Host", "Metal_Host"...)."""
    return device.startswith("CPU") or device.endswith("_Host")


@dataclass(frozen=True)
class DryRun:
    """What llama.cpp's dry run said: per device, the compute and output buffers
    in bytes (as it prints them, to 0.01 MiB); or why llama.cpp refused the
    config (``refused``: its first error line); or why the dry run itself gave
    no figure (``failed``: a crash, a time-out)."""

    buffers: dict[str, dict[str, int]] = field(default_factory=dict)
    seconds: float | None = None
    refused: str | None = None
    failed: str | None = None

    @property
    def ok(self) -> bool:
        return self.refused is None and self.failed is None

    def total(self, kind: str, *, cpu: bool | None = None) -> int | None:
        """Bytes of ``kind`` over the devices (only the CPU, or only the others,
        with ``cpu``); None when the dry run logged no such buffer."""
        found = [b[kind] for dev, b in self.buffers.items() if kind in b and (cpu is None or host_buffer(dev) == cpu)]
        return sum(found) if found else None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    # The start of the dry run child's answer line (``engine.dryrun.serve``, read
    # by ``plan.referee``): llama.cpp may print other lines to stdout.
    MARK = "localllm-dryrun "
