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
        """Settings from a saved session: a value of the wrong type (a hand edit,
        an older version) falls back to its default instead of reaching llama.cpp."""
        default = cls()
        kept: dict[str, Any] = {}
        for f in fields(cls):
            if f.name not in d:
                continue
            v, want = d[f.name], getattr(default, f.name)
            if f.name in ("n_keep", "n_gpu_layers", "threads"):
                ok = v is None or (type(v) is int and v >= 0) or (f.name == "n_gpu_layers" and type(v) is int)
            elif type(want) is float:
                ok = type(v) in (int, float) and v >= 0
            elif type(want) is int:
                ok = type(v) is int and v >= 1
            else:
                ok = type(v) is type(want)
            if ok:
                kept[f.name] = float(v) if type(want) is float else v
        return cls(**kept)

    def needs_reload(self, other: "Settings") -> bool:
        return any(getattr(self, f) != getattr(other, f) for f in RELOAD_FIELDS)
