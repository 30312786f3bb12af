"""The one load config: from the CLI's options through the planner and the
fitting service to the engine, with no conversion on the way."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from localllm.engine_api import llama_rules


@dataclass(frozen=True)
class LoadConfig:
    """How to load a model and size its context (mirrors llama_context_params).

    ``n_gpu_layers=-1`` offloads every layer when the build has a GPU backend
    (it is ignored on CPU builds). ``n_threads=None`` means physical cores.
    ``swa_full`` keeps a full-size cache for sliding-window layers (more memory,
    but the cache can then be shifted). ``flash_attn`` is llama.cpp's mode
    (auto/on/off); a quantized V cache needs it on (``llama_rules``).
    The physical batch is never above the logical one (llama.cpp's own clamp,
    ``llama_rules.ubatch``), so the planner sees what llama.cpp will use.
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
    # Sequences sharing the cache (serve's batch engine plans with n_seq streams).
    n_seq: int = 1
    # One cache pool for all sequences (llama_context_params.kv_unified), as
    # serve's batch engine loads it: one stream of n_ctx cells, and a sliding
    # window of n_swa * n_seq + n_ubatch cells (src/llama-kv-cache-iswa.cpp),
    # instead of n_seq streams of n_ctx / n_seq cells each.
    kv_unified: bool = False
    # llama.cpp RPC workers ("host:port") whose devices join this machine's, and
    # the share of the offloaded layers each device takes (workers' devices first,
    # then local GPUs; llama_model_params.tensor_split). Empty: llama.cpp's defaults.
    rpc_servers: tuple[str, ...] = ()
    tensor_split: tuple[float, ...] = ()
    # Expert weights kept in RAM while the rest of their layer is offloaded
    # (llama.cpp's --cpu-moe / --n-cpu-moe, as tensor-buffer overrides to the
    # CPU: llama_rules.cpu_moe_patterns): the experts of layers 0..n_cpu_moe-1,
    # -1 for every layer's, 0 for none.
    n_cpu_moe: int = 0

    def __post_init__(self) -> None:
        if self.n_batch >= 1 and self.n_ubatch > self.n_batch:
            object.__setattr__(self, "n_ubatch", llama_rules.ubatch(self.n_batch, self.n_ubatch))

    @property
    def uses_flash_attn(self) -> bool:
        """Whether llama.cpp will run flash attention ('auto' counts as on;
        a quantized V cache forces it on)."""
        return llama_rules.flash_attn_planned(self.flash_attn, self.type_v)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)
