"""The cockpit's settings, and which of them need the model reloaded."""

from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

RELOAD_FIELDS = ("n_ctx", "type_k", "type_v", "n_gpu_layers", "threads", "swa_full")


@dataclass(frozen=True)
class Settings:
    n_ctx: int = 4096
    type_k: str = "f16"
    type_v: str = "f16"
    sliding_window: bool = True
    n_keep: int | None = None  # None: keep the system prompt
    n_gpu_layers: int | None = None  # None: auto-fit to the budget
    threads: int | None = None
    swa_full: bool = False
    temperature: float = 0.7
    max_tokens: int = 512
    system_prompt: str = "You are a helpful assistant."

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Settings":
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in names})

    def needs_reload(self, other: "Settings") -> bool:
        return any(getattr(self, f) != getattr(other, f) for f in RELOAD_FIELDS)
