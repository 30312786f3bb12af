"""llama.cpp's cache rules, per architecture, read from a GGUF header.

Which layers attend through a sliding window (or chunked attention), which have
no KV cache of their own, which are recurrent (a fixed-size state instead of a
KV cache), and how wide each layer's K and V rows are. Every rule follows the
llama.cpp vendored by llama-cpp-python 0.3.36 and names the source file it
comes from (paths relative to ``vendor/llama.cpp/src``). An architecture with
no rule here is planned as dense (every layer its own full-context cache) and
reported as unverified, never silently guessed.

Pure Python over ``gguf_file.GGUFHeader``: no llama.cpp import.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from localllm.modelfile.gguf_file import GGUFHeader

# Architectures whose ``load_arch_hparams`` (src/models/<file>.cpp) sets no
# sliding window, no KV sharing, no recurrent layers and no MLA, and which
# llama_model::create_memory (src/llama-model.cpp) gives the plain
# ``llama_kv_cache`` over every layer. Collected by reading each file's
# load_arch_hparams in the vendored source.
# Architectures whose RoPE is M-RoPE or its interleaved form (src/llama-model.cpp, llama_model_rope_type):
# their positions have 4 parts, and llama.cpp cannot shift their cache (src/llama-kv-cache.cpp, get_can_shift:
# n_pos_per_embd() > 1), so a full context re-reads what it keeps.
M_ROPE = frozenset({"qwen2vl", "paddleocr", "qwen3vl", "qwen3vlmoe", "qwen35", "qwen35moe", "qwen4exp", "qwen3tts"})
_DENSE = {
    "llama": "models/llama.cpp", "qwen2": "models/qwen2.cpp", "qwen3": "models/qwen3.cpp",
    "qwen2moe": "models/qwen2moe.cpp", "qwen3moe": "models/qwen3moe.cpp", "qwen2vl": "models/qwen2vl.cpp",
    "qwen3vl": "models/qwen3vl.cpp", "qwen3vlmoe": "models/qwen3vlmoe.cpp", "qwen": "models/qwen.cpp",
    "granite": "models/granite.cpp", "granitemoe": "models/granite-moe.cpp", "mistral3": "models/mistral3.cpp",
    "smollm3": "models/smollm3.cpp", "olmo": "models/olmo.cpp", "olmoe": "models/olmoe.cpp",
    "gemma": "models/gemma.cpp", "phi2": "models/phi2.cpp", "phimoe": "models/phimoe.cpp",
    "stablelm": "models/stablelm.cpp", "starcoder": "models/starcoder.cpp", "starcoder2": "models/starcoder2.cpp",
    "internlm2": "models/internlm2.cpp", "deci": "models/deci.cpp", "falcon": "models/falcon.cpp",
    "baichuan": "models/baichuan.cpp", "bloom": "models/bloom.cpp", "command-r": "models/command-r.cpp",
    "chatglm": "models/chatglm.cpp", "glm4": "models/glm4.cpp", "glm4moe": "models/glm4-moe.cpp",
    "gpt2": "models/gpt2.cpp", "gptneox": "models/gptneox.cpp", "mpt": "models/mpt.cpp", "orion": "models/orion.cpp",
    "minicpm": "models/minicpm.cpp", "exaone": "models/exaone.cpp", "ernie4_5": "models/ernie4-5.cpp",
    "seed_oss": "models/seed-oss.cpp", "apertus": "models/apertus.cpp", "arcee": "models/arcee.cpp",
    "dbrx": "models/dbrx.cpp", "deepseek": "models/deepseek.cpp", "dots1": "models/dots1.cpp",
    "grok": "models/grok.cpp", "hunyuan-moe": "models/hunyuan-moe.cpp", "bitnet": "models/bitnet.cpp",
    "nemotron": "models/nemotron.cpp", "openelm": "models/openelm.cpp", "xverse": "models/xverse.cpp",
    "codeshell": "models/codeshell.cpp", "refact": "models/refact.cpp", "plamo": "models/plamo.cpp",
    "bailingmoe": "models/bailingmoe.cpp", "bailingmoe2": "models/bailingmoe2.cpp",
    "minimax-m2": "models/minimax-m2.cpp", "pangu-embedded": "models/pangu-embed.cpp",
    "jais": "models/jais.cpp", "jais2": "models/jais2.cpp", "maincoder": "models/maincoder.cpp",
    "grovemoe": "models/grovemoe.cpp", "arctic": "models/arctic.cpp",
}


@dataclass(frozen=True)
class CacheRule:
    """What llama.cpp allocates per layer for this model (see module docstring)."""

    architecture: str
    verified: bool  # False: no rule for this architecture, planned as dense
    source: str  # the llama.cpp file(s) the rule follows
    n_layer: int  # block_count less the NextN/MTP layers
    swa_type: str  # none | standard | chunked | symmetric
    n_swa: int
    swa_layers: frozenset[int]
    kv_layers: frozenset[int]  # layers with their own KV cache
    recurrent_layers: frozenset[int]  # layers with a recurrent state instead
    n_head_kv: tuple[int, ...]
    head_dim_k: tuple[int, ...]  # per layer (SWA layers may differ: key_length_swa)
    head_dim_v: tuple[int, ...]
    mla: bool = False  # DeepSeek-style latent attention: K holds the latent, no V cache
    n_embd_r: int = 0  # recurrent conv-state width per layer (f32 values)
    n_embd_s: int = 0  # recurrent SSM-state width per layer (f32 values)
    n_expert: int = 0
    n_expert_used: int = 0
    notes: tuple[str, ...] = field(default_factory=tuple)

    @property
    def has_swa(self) -> bool:
        return self.swa_type != "none" and bool(self.swa_layers)


def _num(v: Any, default: int) -> int:
    """A header value as a non-negative int; anything else (a string, a float
    NaN, a negative count from a damaged file) counts as absent."""
    try:
        out = int(v)
    except (TypeError, ValueError, OverflowError):
        return default
    return out if out >= 0 else default


def _int(v: Any, default: int = 0) -> int:
    if isinstance(v, list):
        return _num(v[0], default) if v else default
    return default if v is None else _num(v, default)


def _arr(v: Any, n: int, default: int) -> list[int]:
    """llama_model_loader::get_key_or_arr: a scalar for every layer, or one per layer."""
    if isinstance(v, list):
        out = [_num(x, default) for x in v[:n]]
        return out + [default] * (n - len(out))
    return [default if v is None else _num(v, default)] * n


def _pattern(header: GGUFHeader, n_layer: int, n_pattern: int, dense_first: bool = False) -> list[bool]:
    """llama_model_base::load_swa_pattern (src/llama-model.cpp): the GGUF's
    per-layer ``sliding_window_pattern`` array wins; else its integer (or the
    architecture's default) feeds llama_hparams::set_swa_pattern
    (src/llama-hparams.cpp): with dense_first layer 0 of each period is dense,
    else the last one is."""
    p = header.arch_key("attention.sliding_window_pattern")
    if isinstance(p, list):
        flags = [bool(x) for x in p[:n_layer]]
        return flags + [False] * (n_layer - len(flags))
    if p is not None and not isinstance(p, list):
        n_pattern = int(p)
    if dense_first:
        return [n_pattern == 0 or il % n_pattern != 0 for il in range(n_layer)]
    return [n_pattern == 0 or il % n_pattern < n_pattern - 1 for il in range(n_layer)]


def _window(header: GGUFHeader) -> int | None:
    v = header.arch_key("attention.sliding_window")
    return None if v is None else _int(v)


# -- per-architecture SWA rules -----------------------------------------------------
# Each returns (swa_type, n_swa, per-layer flags) the way the architecture's
# load_arch_hparams sets hparams.swa_type / n_swa / is_swa_impl.
SwaRule = Callable[[GGUFHeader, int], "tuple[str, int, list[bool]]"]
_NONE: tuple[str, int] = ("none", 0)


def _none(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    return "none", _window(header) or 0, [False] * n


def _always(n_pattern: int, default_window: int = 0, dense_first: bool = False) -> SwaRule:
    """SWA always on (the window key, or a hard-coded default)."""

    def rule(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
        w = _window(header)
        return "standard", default_window if w is None else w, _pattern(header, n, n_pattern, dense_first)

    return rule


def _if_window(n_pattern: int, dense_first: bool = False, forced_window: int | None = None) -> SwaRule:
    """SWA only when the GGUF has ``sliding_window`` > 0."""

    def rule(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
        w = _window(header)
        if not w:
            return _none(header, n)
        return "standard", forced_window or w, _pattern(header, n, n_pattern, dense_first)

    return rule


def _array_pattern(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    """The per-layer pattern array is required (mimo2, step35, gemma4, granite_swa)."""
    return "standard", _window(header) or 0, _pattern(header, n, 0)


def _phi3(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    # models/phi3.cpp: a sliding_window key > 0 turns SWA *off* ("Phi SWA is
    # currently disabled"): swa_type NONE, n_swa 0, every layer dense.
    return "none", 0, [False] * n


def _exaone4(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    # models/exaone4.cpp: only the 64-layer (32B) model uses SWA (default window
    # 4096, pattern 4); the sliding_window key alone does not turn it on.
    if n == 64:
        w = _window(header)
        return "standard", 4096 if w is None else w, _pattern(header, n, 4)
    return "none", _window(header) or 0, [False] * n


def _llama4(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    # models/llama4.cpp: chunked attention (chunk 8192, pattern 4: 3 chunked, 1
    # full) unless the GGUF says sliding_window = 0.
    w = header.arch_key("attention.sliding_window")
    if w is not None and _int(w) == 0:
        return "none", 0, [False] * n
    return "chunked", 8192, _pattern(header, n, 4)


def _lfm2(header: GGUFHeader, n: int) -> tuple[str, int, list[bool]]:
    # models/lfm2.cpp: with sliding_window > 0 every attention layer (n_head_kv > 0) is SWA.
    w = _window(header)
    if not w:
        return _none(header, n)
    kv = _arr(header.arch_key("attention.head_count_kv"), n, 0)
    return "standard", w, [kv[i] > 0 for i in range(n)]


_SWA_RULES: dict[str, tuple[SwaRule, str]] = {
    "gemma2": (_always(2, 4096), "models/gemma2.cpp"),
    "gemma3": (_if_window(6), "models/gemma3.cpp"),
    "gemma3n": (_always(5), "models/gemma3n.cpp"),
    "gemma4": (_array_pattern, "models/gemma4.cpp"),
    "cohere2": (_always(4), "models/cohere2.cpp"),
    "cohere2moe": (_always(4, dense_first=True), "models/cohere2moe.cpp"),
    "olmo2": (_if_window(4), "models/olmo2.cpp"),
    "gpt-oss": (_always(2), "models/openai-moe.cpp"),
    "exaone4": (_exaone4, "models/exaone4.cpp"),
    "exaone-moe": (_always(4, 128), "models/exaone-moe.cpp"),
    "llama4": (_llama4, "models/llama4.cpp"),
    "phi3": (_phi3, "models/phi3.cpp"),
    "plamo3": (_if_window(8), "models/plamo3.cpp"),
    "afmoe": (_if_window(4), "models/afmoe.cpp"),
    "mellum": (_if_window(4), "models/mellum.cpp"),
    "smallthinker": (_if_window(4, dense_first=True, forced_window=4096), "models/smallthinker.cpp"),
    "laguna": (_if_window(4, dense_first=True), "models/laguna.cpp"),
    "muse-glimmer": (_always(4), "models/muse-glimmer.cpp"),
    "mimo2": (_array_pattern, "models/mimo2.cpp"),
    "step35": (_array_pattern, "models/step35.cpp"),
    "granite_swa": (_array_pattern, "models/granite-swa.cpp"),
    "maple": (_array_pattern, "models/maple.cpp"),
    "spark2_5": (_array_pattern, "models/spark2-5.cpp"),
    "lfm2": (_lfm2, "models/lfm2.cpp"),
    "lfm2moe": (_none, "models/lfm2moe.cpp"),
    "granitehybrid": (_none, "models/granite-hybrid.cpp"),
    "deepseek2": (_none, "models/deepseek2.cpp"),
    "mamba2": (_none, "models/mamba2.cpp"),
    "falcon-h1": (_none, "models/falcon-h1.cpp"),
    "nemotron_h": (_none, "models/nemotron-h.cpp"),
}

# Hybrid models: layers with n_head_kv == 0 are recurrent (models/lfm2.cpp,
# models/lfm2moe.cpp, models/granite-hybrid.cpp set is_recr_impl that way);
# llama_memory_hybrid (src/llama-memory-hybrid.cpp) gives the other layers the KV cache.
_HYBRID_BY_HEAD_KV = {"lfm2", "lfm2moe", "granitehybrid"}


def _layer_memory(header: GGUFHeader, arch: str, n_layer: int, n_head_kv: list[int]) -> tuple[frozenset[int], frozenset[int]] | None:
    """(layers with a KV cache, recurrent layers) where they are not "every layer,
    none": llama_model::create_memory's layer filters (src/llama-model.cpp)."""
    every = frozenset(range(n_layer))
    if arch in _HYBRID_BY_HEAD_KV:
        recr = frozenset(i for i in range(n_layer) if n_head_kv[i] == 0)
        return every - recr, recr
    if arch == "mamba2":  # llm_arch_is_recurrent (src/llama-arch.cpp): llama_memory_recurrent alone, no KV cache
        return frozenset(), every
    if arch == "falcon-h1":  # create_memory: filter_attn and filter_recr both true; models/falcon-h1.cpp: every layer is_recr
        return every, every
    if arch == "nemotron_h":
        # models/nemotron-h.cpp: recurrent iff n_head_kv == 0 and n_ff == 0; create_memory
        # gives the KV cache to layers with n_ff == 0 that are not recurrent (a
        # feed-forward-only layer has neither).
        n_ff = _arr(header.arch_key("feed_forward_length"), n_layer, 0)
        recr = frozenset(i for i in range(n_layer) if n_head_kv[i] == 0 and n_ff[i] == 0)
        return frozenset(i for i in range(n_layer) if n_ff[i] == 0) - recr, recr
    return None


def _recurrent_widths(header: GGUFHeader, arch: str, n_embd: int) -> tuple[int, int]:
    """llama_hparams::n_embd_r / n_embd_s (src/llama-hparams.cpp)."""
    l_cache = _int(header.arch_key("shortconv.l_cache"))
    if l_cache:  # LFM2 short convolution: n_embd * (L - 1), no SSM state
        return n_embd * (l_cache - 1), 0
    d_conv = _int(header.arch_key("ssm.conv_kernel"))
    d_inner = _int(header.arch_key("ssm.inner_size"))
    d_state = _int(header.arch_key("ssm.state_size"))
    n_group = _int(header.arch_key("ssm.group_count"))
    return (d_conv - 1 if d_conv > 0 else 0) * (d_inner + 2 * n_group * d_state), d_state * d_inner


def cache_rule(header: GGUFHeader) -> CacheRule:
    arch = header.architecture
    n_all = _int(header.arch_key("block_count"))
    n_nextn = _int(header.arch_key("nextn_predict_layers"))
    n_layer = max(n_all - n_nextn, 0)
    n_embd = _int(header.arch_key("embedding_length"))
    n_head = _arr(header.arch_key("attention.head_count"), n_all, 0)
    raw_kv = header.arch_key("attention.head_count_kv")
    n_head_kv = n_head if raw_kv is None else _arr(raw_kv, n_all, 0)
    # src/llama-model.cpp load_hparams: head sizes default to n_embd / n_head(0);
    # SWA layers may have their own (key_length_swa / value_length_swa).
    h0 = n_head[0] if n_head else 0
    hk = _int(header.arch_key("attention.key_length")) or (n_embd // h0 if h0 else 0)
    hv = _int(header.arch_key("attention.value_length")) or (n_embd // h0 if h0 else 0)
    hk_swa = _int(header.arch_key("attention.key_length_swa")) or hk
    hv_swa = _int(header.arch_key("attention.value_length_swa")) or hv

    notes: list[str] = []
    if arch in _SWA_RULES:
        swa_rule, source = _SWA_RULES[arch]
        verified = True
        swa_type, n_swa, flags = swa_rule(header, n_layer)
    elif arch in _DENSE:
        source, verified = _DENSE[arch], True
        swa_type, n_swa, flags = "none", 0, [False] * n_layer
    else:
        source, verified = "none: planned as dense", False
        swa_type, n_swa, flags = "none", 0, [False] * n_layer
        notes.append(f"no llama.cpp cache rule known to localllm for '{arch}': planned as dense")
    if arch == "phi3" and (_window(header) or 0) > 0:
        notes.append("phi3: llama.cpp turns the sliding window off (models/phi3.cpp); every layer keeps the full context")
    swa = frozenset(i for i, f in enumerate(flags) if f) if swa_type != "none" else frozenset()

    recurrent: frozenset[int] = frozenset()
    n_r = n_s = 0
    attention: frozenset[int] = frozenset()
    memory = _layer_memory(header, arch, n_layer, n_head_kv)
    if memory is not None:
        attention, recurrent = memory
        n_r, n_s = _recurrent_widths(header, arch, n_embd)

    # src/llama-hparams.cpp has_kv: gemma3n keeps KV only for the first 20 layers
    # (models/gemma3n.cpp n_layer_kv_from_start = 20), gemma4 for all but the
    # last shared_kv_layers (models/gemma4.cpp); the rest reuse those caches
    # (llama_model::create_memory's reuse callback).
    kv_from = -1
    if arch == "gemma3n":
        kv_from = 20
    elif arch == "gemma4":
        kv_from = n_all - _int(header.arch_key("attention.shared_kv_layers"))
    # create_memory filters out the NextN/MTP layers of the main context.
    kv_layers = frozenset(
        il for il in range(n_layer)
        if (kv_from < 0 or il < kv_from) and (il in attention if memory is not None else True)
    )
    if kv_from >= 0 and kv_from < n_layer:
        notes.append(f"layers {kv_from}..{n_layer - 1} reuse earlier layers' KV cache")

    mla = bool(header.arch_key("attention.key_length_mla")) and bool(header.arch_key("attention.value_length_mla"))
    return CacheRule(
        architecture=arch,
        verified=verified,
        source=source,
        n_layer=n_layer,
        swa_type=swa_type,
        n_swa=n_swa,
        swa_layers=swa,
        kv_layers=kv_layers,
        recurrent_layers=recurrent,
        n_head_kv=tuple(n_head_kv[:n_layer]),
        head_dim_k=tuple(hk_swa if i in swa else hk for i in range(n_layer)),
        head_dim_v=tuple(hv_swa if i in swa else hv for i in range(n_layer)),
        mla=mla,
        n_embd_r=n_r,
        n_embd_s=n_s,
        n_expert=_int(header.arch_key("expert_count")),
        n_expert_used=max(_arr(header.arch_key("expert_used_count"), max(n_all, 1), 0)),
        notes=tuple(notes),
    )
