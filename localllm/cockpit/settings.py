"""The cockpit's settings, and which of them need the model reloaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import Any

from localllm.compaction import COCKPIT_AT
from localllm.engine_api import SamplingConfig
from localllm.engine_api.llama_rules import FLASH_ATTN_MODES, KV_CACHE_TYPES
from localllm.modelfile.lora import AdapterSpec, read_adapter
from localllm.plan import fitting
from localllm.speculation import MODES

RELOAD_FIELDS = ("n_ctx", "type_k", "type_v", "n_gpu_layers", "threads", "swa_full", "flash_attn", "n_batch", "n_ubatch", "policy",
                 "n_cpu_moe", "lora", "speculate")
POLICIES = ("ctx", "offload")
# Text fields whose value must be one of these (a hand-edited session file
# must not reach llama.cpp with a value it does not know).
_CHOICES = {"type_k": KV_CACHE_TYPES, "type_v": KV_CACHE_TYPES, "flash_attn": FLASH_ATTN_MODES, "policy": POLICIES, "speculate": MODES}
SAMPLING_FIELDS = ("temperature", "top_k", "top_p", "min_p", "repeat_penalty", "max_tokens", "seed", "reasoning_budget")
_WHOLE = ("top_k", "max_tokens", "seed", "reasoning_budget")
_SAMPLING = SamplingConfig()  # the one set of defaults run, chat and serve use too


@dataclass(frozen=True)
class Settings:
    """What the cockpit loads and samples with (F3 edits them; a saved session keeps them)."""

    n_ctx: int | None = None  # None: the plan decides (``fitting.default_ctx``, from the model's trained context)
    type_k: str = "f16"
    type_v: str = "f16"
    sliding_window: bool = True
    # the older turns summarized by the model at this fraction of the context (localllm.compaction), before the
    # window has to slide; None: off (the sliding window alone). On by default: a summary keeps what a shift would drop
    compact_at: float | None = COCKPIT_AT
    n_keep: int | None = None  # None: keep the system prompt
    n_gpu_layers: int | None = None  # None: auto-fit to the budget
    threads: int | None = None
    swa_full: bool = False
    flash_attn: str = "auto"
    n_batch: int = 512
    n_ubatch: int = 512
    policy: str = "ctx"  # when it does not fit: shrink the context (ctx) or offload fewer layers (offload)
    n_cpu_moe: int | None = None  # experts in RAM: of the first N layers, -1 all (--n-cpu-moe / --cpu-moe); None: the fit's choice
    temperature: float = _SAMPLING.temperature
    top_k: int = _SAMPLING.top_k
    top_p: float = _SAMPLING.top_p
    min_p: float = _SAMPLING.min_p
    repeat_penalty: float = _SAMPLING.repeat_penalty
    max_tokens: int = _SAMPLING.max_tokens
    seed: int | None = _SAMPLING.seed
    reasoning_budget: int = _SAMPLING.reasoning_budget  # tokens of thinking before its end is forced; -1 unlimited, 0 none
    thinking: bool = True  # the template's enable_thinking: a thinking model thinks (the settings' toggle; tui --reasoning)
    speculate: str = "auto"  # draftless speculation (localllm.speculation): auto, lookup, none (tui --speculate; none loads no draft rows)
    system_prompt: str = "You are a helpful assistant."
    # LoRA adapters (--lora, --lora-scaled): (path, scale) by id. Given on the command line only:
    # a saved session's list (JSON makes it a list, not a tuple) is not taken back.
    lora: tuple[tuple[str, float], ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Settings:
        """Settings from a saved session: a value of the wrong type (a hand edit,
        an older version) falls back to its default instead of reaching llama.cpp."""
        default = cls()
        kept: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v, want = d[f.name], getattr(default, f.name)
            if f.name in SAMPLING_FIELDS:
                typed = type(v) is int or (type(v) is float and f.name not in _WHOLE) or (v is None and f.name == "seed")
                ok = typed and replace(_SAMPLING, **{f.name: v}).problem() is None
            elif f.name == "compact_at":
                ok = v is None or (type(v) in (int, float) and 0 < v <= 1)
            elif f.name == "n_ctx":
                ok = v is None or (type(v) is int and v >= 1)
            elif f.name in ("n_keep", "n_gpu_layers", "threads", "n_cpu_moe"):
                ok = v is None or (type(v) is int and v >= 0) or (f.name == "n_gpu_layers" and type(v) is int) or (f.name == "n_cpu_moe" and v == -1)
            elif type(want) is float:
                ok = type(v) in (int, float) and v >= 0
            elif type(want) is int:
                ok = type(v) is int and v >= 1
            else:
                ok = type(v) is type(want) and (f.name not in _CHOICES or v in _CHOICES[f.name])
            if ok:
                kept[f.name] = float(v) if type(want) is float and v is not None else v
        return cls(**kept)

    def sampling(self) -> SamplingConfig:
        """How the chat samples with these settings."""
        return SamplingConfig(**{name: getattr(self, name) for name in SAMPLING_FIELDS}, speculate=self.speculate)

    def needs_reload(self, other: Settings) -> bool:
        return any(getattr(self, f) != getattr(other, f) for f in RELOAD_FIELDS)

    def load_options(self, n_ctx: int | None = None) -> fitting.LoadOptions:
        """The settings' load options, in the CLI's shape (``n_ctx`` instead of
        the setting's, e.g. capped at a model's trained context). The cache
        types are the ones shown in the settings, so they are kept; blank GPU
        layers leave the layers to the fit."""
        return fitting.LoadOptions(
            n_ctx=n_ctx or self.n_ctx, threads=self.threads, n_gpu_layers=self.n_gpu_layers, type_k=self.type_k,
            type_v=self.type_v, flash_attn=self.flash_attn, swa_full=self.swa_full, n_batch=self.n_batch,
            n_ubatch=self.n_ubatch, policy=self.policy, n_cpu_moe=self.n_cpu_moe,
        )

    def ctx_for(self, trained: int | None) -> int:
        """The context asked of a model trained for ``trained`` tokens (the models
        screen's "fits" column): the setting capped at it, or the plan's default."""
        if self.n_ctx is None:
            return fitting.default_ctx(trained)
        return min(self.n_ctx, trained or self.n_ctx)

    def fit_request(self, n_ctx: int | None = None) -> fitting.Request:
        """What the cockpit asks the fitting service for (``load_options``), with
        the LoRA adapters' headers (checked against the model and counted by the fit)."""
        request = self.load_options(n_ctx).request()
        return replace(request, adapters=tuple(read_adapter(p) for p, _ in self.lora)) if self.lora else request

    def adapter_specs(self) -> list[AdapterSpec]:
        """The LoRA adapters to load after the model, with their scales."""
        return [AdapterSpec(Path(p), s) for p, s in self.lora]
