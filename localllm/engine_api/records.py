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
    """Sampling for one generation. ``temperature=0`` is greedy (deterministic).

    ``max_tokens=-1`` generates until an end-of-generation token or a full
    context; a positive ``max_tokens`` shifts the context to get there.
    ``ignore_eos`` keeps going past end-of-generation (benchmarks).
    """

    temperature: float = 0.8
    top_k: int = 40
    top_p: float = 0.95
    min_p: float = 0.05
    seed: int | None = None
    max_tokens: int = -1
    ignore_eos: bool = False


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
    def acceptance(self) -> float:
        return self.accepted / self.drafted if self.drafted else 0.0


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
