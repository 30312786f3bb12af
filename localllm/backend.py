"""The settings and records that cross the seam between localllm and an
inference engine: how to load (``LoadConfig``), how to sample, each token, the
load's facts. The seam itself, the ``Engine`` protocol, is in ``engine_api``;
``engine.LlamaCppBackend`` is the product's implementation, and
``localllm.testing.ScriptedEngine`` a scripted one for UI and unit tests.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from localllm.errors import UsageError

# K/V cache types llama.cpp accepts (common/arg.cpp's kv_cache_types).
KV_CACHE_TYPES: tuple[str, ...] = ("f32", "f16", "bf16", "q8_0", "q4_0", "q4_1", "iq4_nl", "q5_0", "q5_1")
FLASH_ATTN_MODES: tuple[str, ...] = ("auto", "on", "off")


def ggml_type_id(name: str) -> int:
    """ggml's enum value for a cache type name (gguf's enum mirrors ggml's)."""
    from gguf import GGMLQuantizationType  # lazy: gguf imports numpy

    if name not in KV_CACHE_TYPES:
        raise UsageError(f"unsupported cache type '{name}': choose one of {', '.join(KV_CACHE_TYPES)}")
    return GGMLQuantizationType[name.upper()].value


def check_cache_types(type_k: str, type_v: str, head_dim_k: int, head_dim_v: int) -> None:
    """A quantized cache stores whole blocks per head: llama.cpp refuses a type
    whose block size does not divide the head dimension. Say so before loading."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    for which, name, dim in (("K", type_k, head_dim_k), ("V", type_v, head_dim_v)):
        block = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type_id(name))][0]
        if dim and dim % block:
            raise UsageError(
                f"{which} cache type {name} stores blocks of {block} values but this model's {which} head dim is {dim}: use --kv-type f16"
            )


@dataclass(frozen=True)
class LoadConfig:
    """How to load a model and size its context.

    ``n_gpu_layers=-1`` offloads every layer when the build has a GPU backend
    (it is ignored on CPU builds). ``n_threads=None`` means physical cores.
    ``swa_full`` keeps a full-size cache for sliding-window layers (more memory,
    but the cache can then be shifted).
    A quantized V cache needs flash attention: ``auto`` lets llama.cpp decide.
    """

    n_ctx: int = 4096
    n_threads: int | None = None
    n_gpu_layers: int = -1
    flash_attn: str = "auto"
    type_k: str = "f16"
    type_v: str = "f16"
    n_batch: int = 512
    n_ubatch: int = 512
    swa_full: bool = False
    # Rows of logits a ubatch may output. Generation needs only the last token's,
    # and llama.cpp sizes its compute buffer for this many rows of n_vocab floats:
    # 1 instead of the default n_batch saves 490 MiB on Gemma 3 (262k vocabulary).
    # 0 means n_batch (needed to score every position, e.g. perplexity).
    n_outputs_max: int = 1
    # llama.cpp RPC workers ("host:port") whose devices join this machine's, and
    # the share of the offloaded layers each device takes (workers' devices first,
    # then local GPUs; llama_model_params.tensor_split). Empty: llama.cpp's defaults.
    rpc_servers: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def needs_flash_attn(cfg: LoadConfig) -> bool:
    """A quantized V cache works only with flash attention in llama.cpp."""
    return cfg.type_v not in ("f32", "f16", "bf16")


def run_config(cfg: LoadConfig):
    """The planner's view of a load config (flash attention 'auto' counts as on:
    llama.cpp enables it wherever the backend supports it)."""
    from localllm.planner import RunConfig

    return RunConfig(
        n_ctx=cfg.n_ctx,
        n_batch=cfg.n_batch,
        n_ubatch=min(cfg.n_ubatch, cfg.n_batch),
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        flash_attn=cfg.flash_attn != "off",
        n_gpu_layers=cfg.n_gpu_layers,
        swa_full=cfg.swa_full,
        n_outputs_max=cfg.n_outputs_max,
    )


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

