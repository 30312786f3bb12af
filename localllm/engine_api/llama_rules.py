"""llama.cpp's rules for the KV cache and flash attention, in one place.

Pure Python, no llama.cpp or gguf import: the CLI's parsers, the planner, the
fitting service, the cockpit and the engine adapter all read them here. Each
rule names the llama.cpp source it follows (the vendored copy matching our
build: llama-cpp-python 0.3.36, ``vendor/llama.cpp``); ``tests/test_llama_rules.py``
checks the type table against gguf-py's own copy of ggml's.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

from localllm.engine_api.errors import InvalidSetting
from localllm.errors import UsageError


@dataclass(frozen=True)
class CacheType:
    """A ggml type the KV cache may use: ggml's enum value (ggml/include/ggml.h
    ``enum ggml_type``), the values per block and the bytes per block
    (ggml/src/ggml.c ``type_traits``: ``blck_size``, ``type_size``; the
    quantized blocks are ggml/src/ggml-common.h's ``block_q8_0`` etc.)."""

    name: str
    ggml_id: int
    block_size: int
    type_size: int

    @property
    def quantized(self) -> bool:
        """ggml_is_quantized: more than one value per block."""
        return self.block_size > 1


# K/V cache types llama.cpp accepts, in its order (common/arg.cpp ``kv_cache_types``).
_CACHE_TYPES: tuple[CacheType, ...] = (
    CacheType("f32", 0, 1, 4),
    CacheType("f16", 1, 1, 2),
    CacheType("bf16", 30, 1, 2),
    CacheType("q8_0", 8, 32, 34),  # QK8_0 = 32: f16 scale + 32 int8
    CacheType("q4_0", 2, 32, 18),  # QK4_0 = 32: f16 scale + 16 bytes of nibbles
    CacheType("q4_1", 3, 32, 20),  # f16 scale and min + 16 bytes
    CacheType("iq4_nl", 20, 32, 18),  # QK4_NL = 32: f16 scale + 16 bytes
    CacheType("q5_0", 6, 32, 22),  # f16 scale + 4 bytes of high bits + 16 bytes
    CacheType("q5_1", 7, 32, 24),  # f16 scale and min + 4 + 16 bytes
)
CACHE_TYPES: dict[str, CacheType] = {t.name: t for t in _CACHE_TYPES}
KV_CACHE_TYPES: tuple[str, ...] = tuple(CACHE_TYPES)

# --flash-attn values (common/arg.cpp; llama.h LLAMA_FLASH_ATTN_TYPE_AUTO/ENABLED/DISABLED).
FLASH_ATTN_MODES: tuple[str, ...] = ("auto", "on", "off")


def cache_type(name: str) -> CacheType:
    """The cache type named ``name``, or one line naming the choices."""
    t = CACHE_TYPES.get(name)
    if t is None:
        raise UsageError(f"unsupported cache type '{name}': choose one of {', '.join(KV_CACHE_TYPES)}")
    return t


def ggml_type_id(name: str) -> int:
    """ggml's enum value for a cache type name (what llama_context_params.type_k/v take)."""
    return cache_type(name).ggml_id


def is_quantized(name: str) -> bool:
    """A block-quantized cache type (not f32/f16/bf16). An unknown name counts
    as quantized: the engine refuses it before llama.cpp sees it."""
    t = CACHE_TYPES.get(name)
    return t is None or t.quantized


def hadamard_sides(k_all: int, v_all: int, head_k: int, head_v: int, type_k: str, type_v: str) -> tuple[int, int]:
    """The one Hadamard rule (llama-kv-cache.cpp ``attn_rot_k`` / ``attn_rot_v``,
    ``build_input_k_rot`` / ``build_input_v_rot``): a quantized cache is written
    through a rotation, an n x n f32 graph input per cache. (K's n, V's n), 0 for
    none. K rotates when every layer of the cache shares one head size
    (``k_all`` > 0, else -1), K is quantized and the model's head size is a
    multiple of 64; n is the largest power of two from 64 up that divides
    ``k_all``. V likewise, but n is always 64; an MLA cache has no V (pass 0)."""
    nk = 0
    if k_all > 0 and is_quantized(type_k) and head_k % 64 == 0:
        nk = 64
        while k_all % (nk * 2) == 0:
            nk *= 2
    nv = 64 if v_all > 0 and is_quantized(type_v) and head_v % 64 == 0 else 0
    return nk, nv


def needs_flash_attn(type_v: str) -> bool:
    """A quantized V cache works only with flash attention: llama.cpp turns
    'auto' into 'on' for it and refuses 'off' (src/llama-context.cpp,
    llama_init_from_model: "quantized V cache requires flash_attn")."""
    return is_quantized(type_v)


def flash_attn_mode(requested: str, type_v: str) -> str:
    """The flash attention mode to ask llama.cpp for: 'on' when the V cache is
    quantized (see ``needs_flash_attn``), else what was requested."""
    return "on" if needs_flash_attn(type_v) else requested


def flash_attn_planned(requested: str, type_v: str) -> bool:
    """Whether to plan memory with flash attention: 'auto' counts as on, since
    llama.cpp enables it wherever the backend supports it (the CPU does;
    src/llama-context.cpp resolves auto by trying the FA op per device)."""
    return flash_attn_mode(requested, type_v) != "off"


def ubatch(n_batch: int, n_ubatch: int) -> int:
    """The physical batch llama.cpp uses: never above the logical batch, 0
    meaning the logical batch (src/llama-context.cpp:
    ``cparams.n_ubatch = std::min(cparams.n_batch, params.n_ubatch == 0 ? params.n_batch : params.n_ubatch)``)."""
    return min(n_batch, n_ubatch or n_batch)


def check_cache_types(type_k: str, type_v: str, head_dim_k: int, head_dim_v: int, *, flash_attn: bool = True,
                      k_rows: Iterable[int] = ()) -> None:
    """llama.cpp's rules for a quantized cache, checked before any load.

    - Flash attention on or auto: each quantized type's block size must divide
      the head size (src/llama-context.cpp, llama_init_from_model: "K cache type
      %s with block size %u does not divide n_embd_head_k", the same for V).
    - Flash attention off: a quantized V is refused ("quantized V cache requires
      flash_attn"), and a quantized K must fill whole blocks across a layer's K
      row, KV heads x head size (``k_rows``): otherwise ggml aborts creating the
      cache's per-stream views (src/llama-kv-cache.cpp, ``ggml_view_2d(ctx, k,
      n_embd_k_gqa, ...)``; ggml/src/ggml.c, ggml_new_tensor_impl: "GGML_ASSERT(
      view_src == NULL || data_size == 0 || data_size + view_offs <=
      ggml_nbytes(view_src))"). Measured here: head size 80 with one KV head and
      a q4_0 K aborts; with two KV heads (a row of 160) it loads and decodes.
    """
    rows = sorted(set(k_rows))
    if flash_attn:
        for which, name, dim in (("K", type_k, head_dim_k), ("V", type_v, head_dim_v)):
            block = cache_type(name).block_size
            if dim and dim % block:
                off_works = which == "K" and not is_quantized(type_v) and bool(rows) and all(r % block == 0 for r in rows)
                hint = ", or {flash_attn} off (llama.cpp checks the head size only with flash attention)" if off_works else ""
                raise InvalidSetting(
                    f"{which} cache type {name} stores blocks of {block} values but this model's {which} head dim is {dim}: use {{kv_type}} f16{hint}"
                )
        return
    if is_quantized(type_v):
        raise InvalidSetting(f"a quantized V cache ({type_v}) needs flash attention: use {{flash_attn}} on or auto, or an f16 V cache")
    block = cache_type(type_k).block_size
    for row in rows:
        if row % block:
            raise InvalidSetting(
                f"K cache type {type_k} stores blocks of {block} values but a K row of this model (KV heads x head dim) is {row} values, "
                f"which llama.cpp cannot cut into blocks with flash attention off: use {{kv_type}} f16"
            )


# Expert weights in RAM (llama.cpp's --cpu-moe / --n-cpu-moe, common/common.h
# LLM_FFN_EXPS_REGEX and llm_ffn_block_regex): tensor-buffer overrides to the
# CPU buffer type, matched with std::regex_search against each tensor's name
# (src/llama-model-loader.cpp). The regex matches a MoE layer's expert weights
# with their biases and scales (blk.N.ffn_up_exps.weight, .bias, .scale); not
# the router (ffn_gate_inp), nor a shared expert (ffn_*_shexp).
FFN_EXPS_REGEX = r"\.ffn_(up|down|gate|gate_up)_(ch|)exps"


def cpu_moe_patterns(n_cpu_moe: int) -> list[str]:
    """The override patterns llama.cpp's flags build: ``-1`` (--cpu-moe) every
    layer's experts, ``N`` (--n-cpu-moe N) those of layers 0..N-1, ``0`` none."""
    if n_cpu_moe < 0:
        return [FFN_EXPS_REGEX]
    return [rf"blk\.{i}{FFN_EXPS_REGEX}" for i in range(n_cpu_moe)]


def cpu_moe_layers(n_cpu_moe: int, n_layer: int) -> range:
    """The layers whose experts ``n_cpu_moe`` keeps in RAM (see ``cpu_moe_patterns``)."""
    return range(n_layer if n_cpu_moe < 0 else min(n_cpu_moe, n_layer))
