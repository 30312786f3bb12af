"""What a GGUF model is, read from its header alone (``localllm inspect``).

Everything here is pure Python over ``gguf_file.read_header``: no model load,
no llama.cpp. The planner and the engine use the same figures.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from localllm.modelfile.arch_rules import cache_rule
from localllm.modelfile.gguf_file import ArrayInfo, GGUFHeader, read_header
from localllm.modelfile.gguf_names import LlamaFileType


@dataclass(frozen=True)
class TensorTypeStat:
    type: str
    count: int
    bytes: int
    n_elements: int


@dataclass
class ModelInfo:
    path: str
    architecture: str
    name: str
    n_params: int
    size_bytes: int
    file_type: str
    bits_per_weight: float
    tensor_types: list[TensorTypeStat]
    n_layer: int
    n_embd: int
    n_head: int
    n_head_kv: int
    gqa_ratio: float
    head_dim_k: int
    head_dim_v: int
    context_length: int
    sliding_window: int | None
    swa_layers: list[int]
    n_vocab: int
    chat_template: bool
    n_head_kv_per_layer: list[int] = field(default_factory=list)
    swa_type: str = "none"  # none | standard | chunked (llama4) | symmetric
    cache_rule_verified: bool = True  # False: llama.cpp's cache rule for this architecture is not known here
    cache_rule_source: str = ""  # the vendored llama.cpp file the rule follows

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _first_int(value: Any, default: int = 0) -> int:
    if isinstance(value, list):
        nonzero = [int(v) for v in value if int(v)]
        return max(nonzero) if nonzero else default
    if value is None:
        return default
    return int(value)


def _per_layer(value: Any, n_layer: int) -> list[int]:
    if isinstance(value, list):
        return [int(v) for v in value]
    return [int(value or 0)] * n_layer


def swa_layers(header: GGUFHeader, n_layer: int | None = None) -> list[int]:
    """Indices of the layers that use the sliding window (or chunked attention),
    the way llama.cpp decides per architecture (``arch_rules``; e.g. phi3 turns
    a GGUF's window off, gemma2 has one without the key). ``n_layer`` is kept
    for callers; the header's block count decides."""
    return sorted(cache_rule(header).swa_layers)


def _file_type_name(header: GGUFHeader, mix: list[TensorTypeStat]) -> str:
    ft = header.get("general.file_type")
    if ft is not None:
        try:
            name = LlamaFileType(int(ft)).name
        except ValueError:
            return f"unknown({ft})"
        return name.removeprefix("MOSTLY_").removeprefix("ALL_")
    return max(mix, key=lambda s: s.bytes).type if mix else "unknown"


def _n_vocab(header: GGUFHeader) -> int:
    tokens = header.get("tokenizer.ggml.tokens")
    if isinstance(tokens, ArrayInfo):
        return tokens.length
    if isinstance(tokens, list):
        return len(tokens)
    return int(header.arch_key("vocab_size", 0) or 0)


def describe(header: GGUFHeader) -> ModelInfo:
    counts: Counter[str] = Counter()
    sizes: Counter[str] = Counter()
    elems: Counter[str] = Counter()
    for t in header.tensors:
        counts[t.type.name] += 1
        sizes[t.type.name] += t.n_bytes
        elems[t.type.name] += t.n_elements
    mix = sorted(
        (TensorTypeStat(k, counts[k], sizes[k], elems[k]) for k in counts),
        key=lambda s: -s.bytes,
    )
    n_params = sum(elems.values())
    tensor_bytes = sum(sizes.values())
    n_layer = int(header.arch_key("block_count", 0) or 0)
    n_embd = int(header.arch_key("embedding_length", 0) or 0)
    n_head = _first_int(header.arch_key("attention.head_count"))
    kv_raw = header.arch_key("attention.head_count_kv")
    n_head_kv = _first_int(kv_raw, n_head)
    head_dim_k = int(header.arch_key("attention.key_length", 0) or (n_embd // n_head if n_head else 0))
    head_dim_v = int(header.arch_key("attention.value_length", 0) or (n_embd // n_head if n_head else 0))
    rule = cache_rule(header)
    return ModelInfo(
        path=str(header.path),
        architecture=header.architecture,
        name=str(header.get("general.name", Path(header.path).stem)),
        n_params=n_params,
        size_bytes=header.size_bytes,
        file_type=_file_type_name(header, mix),
        bits_per_weight=round(tensor_bytes * 8 / n_params, 4) if n_params else 0.0,
        tensor_types=mix,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        n_head_kv=n_head_kv,
        gqa_ratio=round(n_head / n_head_kv, 3) if n_head_kv else 0.0,
        head_dim_k=head_dim_k,
        head_dim_v=head_dim_v,
        context_length=int(header.arch_key("context_length", 0) or 0),
        sliding_window=rule.n_swa if rule.has_swa else None,
        swa_layers=sorted(rule.swa_layers),
        n_vocab=_n_vocab(header),
        chat_template=isinstance(header.get("tokenizer.chat_template"), str),
        n_head_kv_per_layer=_per_layer(kv_raw if kv_raw is not None else n_head, n_layer)
        if isinstance(kv_raw, list)
        else [],
        swa_type=rule.swa_type if rule.has_swa else "none",
        cache_rule_verified=rule.verified,
        cache_rule_source=rule.source,
    )


def inspect_model(path: str | Path) -> ModelInfo:
    return describe(read_header(path))
