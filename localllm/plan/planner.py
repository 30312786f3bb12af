"""Memory planner: KV cache, weights, compute and output buffers, per device.

Pure Python over the GGUF header (no llama.cpp calls), so it runs in
milliseconds and can plan models that are not downloaded in full. The arithmetic
follows llama.cpp (the version pinned by scripts/install.sh):

- the context is padded to 256 cells (llama-context.cpp, ``GGML_PAD(n_ctx, 256)``);
- each layer's K row is ``ggml_row_size(type_k, head_dim_k * n_head_kv(layer))``
  bytes per cell, V likewise (llama-kv-cache.cpp);
- sliding-window layers get their own cache of
  ``GGML_PAD(min(n_ctx, n_swa * n_seq + n_ubatch), 256)`` cells, or the full
  context with ``swa_full`` (llama-kv-cache-iswa.cpp);
- with ``n_gpu_layers = g``, layers ``>= n_layer + 1 - g`` go to the GPU; the
  output layer counts as layer ``n_layer``, so it is the first to go (g >= 1)
  and the last to come back; the token embeddings stay on the CPU
  (llama-model.cpp ``get_layer_buft_list``);
- the output buffer holds ``n_vocab`` floats per output row, one row per
  sequence at reserve (llama-context.cpp ``output_reserve``);
- the compute buffer is the peak of the worst-case graph (``n_ubatch`` tokens,
  full cache): for the architectures compute_graph.py rebuilds, that graph is
  replayed through a copy of ggml-alloc's allocator (exact to llama.cpp's log
  on the conformance suite, serve's several sequences in one unified cache
  included); for the others, and for separate streams, it is an estimate: the
  largest of the logits, attention and feed-forward phases plus the attention
  masks (``compute_estimated`` in the plan).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

from localllm.engine_api import LoadConfig, llama_rules
from localllm.engine_api.errors import InvalidSetting
from localllm.engine_api.llama_rules import FFN_EXPS_REGEX, cpu_moe_layers, hadamard_sides, is_quantized
from localllm.modelfile.arch_rules import cache_rule
from localllm.modelfile.gguf_file import GGUFHeader
from localllm.modelfile.gguf_names import GGML_QUANT_SIZES, GGMLQuantizationType
from localllm.modelfile.model_info import describe
from localllm.plan import compute_graph, moe

CTX_PAD = 256
MiB = 1024 * 1024


def _pad(n: int, k: int) -> int:
    return (n + k - 1) // k * k


def row_bytes(type_name: str, n: int) -> int:
    """ggml_row_size: bytes of ``n`` values stored as ``type_name``."""
    block, size = GGML_QUANT_SIZES[GGMLQuantizationType[type_name.upper()]]
    return n // block * size


def _mla_dims(header: GGUFHeader) -> tuple[int, int, int, int]:
    """MLA graph sizes (key_length_mla, value_length_mla, q_lora_rank, leading_dense_block_count)."""
    k, v, q, dense = (int(header.arch_key(key, 0) or 0) for key in (
        "attention.key_length_mla", "attention.value_length_mla", "attention.q_lora_rank", "leading_dense_block_count"))
    return k, v, q, dense


def _ssm_dims(header: GGUFHeader) -> tuple[int, int, int, int]:
    """Mamba-2 mixer sizes (d_inner, d_state, n_group, heads): the estimate's mixer phase."""
    d_inner, d_state, n_group, heads = (int(header.arch_key(key, 0) or 0) for key in (
        "ssm.inner_size", "ssm.state_size", "ssm.group_count", "ssm.time_step_rank"))
    return d_inner, d_state, n_group, heads


@dataclass(frozen=True)
class ModelShape:
    """What the planner needs from a model, read from its header.

    The cache layout (which layers slide, which have a cache of their own, which
    are recurrent, per-layer head sizes) comes from ``arch_rules.cache_rule``,
    llama.cpp's own rules per architecture."""

    architecture: str
    n_layer: int
    n_embd: int
    n_ff: list[int]
    n_head: list[int]
    n_head_kv: list[int]
    head_dim_k: int
    head_dim_v: int
    n_vocab: int
    n_swa: int
    swa_layers: frozenset[int]
    layer_bytes: list[int]  # weights of blk.N.*
    input_bytes: int  # token embeddings and other non-layer tensors on the input side
    output_bytes: int  # output.* tensors (norm and matrix)
    tied_bytes: int  # token_embd again, when there is no output.weight: llama.cpp copies it to the output's device
    mla: bool = False  # DeepSeek-style latent attention: K holds the latent, no V cache
    q_norm: bool = False  # per-head Q norm (Gemma 3, Qwen 3): one more Q-sized activation
    verified: bool = True  # False: no llama.cpp cache rule known for this architecture (planned as dense)
    rule_source: str = ""  # the vendored llama.cpp file the cache rule follows
    kv_layers: frozenset[int] | None = None  # layers with their own KV cache; None: every layer
    recurrent_layers: frozenset[int] = frozenset()  # hybrid models: layers with a recurrent state instead
    n_embd_r: int = 0  # recurrent conv state per layer, f32 values (llama_hparams::n_embd_r)
    n_embd_s: int = 0  # recurrent SSM state per layer, f32 values (llama_hparams::n_embd_s)
    head_dim_k_swa: int = 0  # SWA layers' head sizes where they differ (key_length_swa); 0: the same
    head_dim_v_swa: int = 0
    n_expert: int = 0
    n_expert_used: int = 0
    n_ff_exp: int = 0  # a MoE expert's feed-forward width (expert_feed_forward_length)
    layer_active_bytes: list[int] | None = None  # weights a token reads per layer (MoE: the used experts only)
    # MLA graph sizes (key_length_mla, value_length_mla, q_lora_rank, leading_dense_block_count): compute_graph.py
    mla_dims: tuple[int, int, int, int] = (0, 0, 0, 0)
    # The estimated compute (never the replay) times this: llama.cpp's dry run
    # over the estimate, when it found more (plan.prepare refits with it).
    compute_scale: float = 1.0
    # Mamba-2 mixers (ssm.inner_size, ssm.state_size, ssm.group_count, ssm.time_step_rank): the estimate's mixer phase
    ssm_dims: tuple[int, int, int, int] = (0, 0, 0, 0)
    n_ff_shexp: int = 0  # a MoE's shared expert (expert_shared_feed_forward_length): the estimate holds one more n_embd
    # Per layer, the bytes of the tensors llama.cpp's --cpu-moe pattern matches
    # (llama_rules.FFN_EXPS_REGEX: the experts with their biases and scales),
    # which LoadConfig.n_cpu_moe keeps in RAM; None: no such tensor (a dense model).
    layer_expert_bytes: list[int] | None = None
    # LoRA adapters (``with_adapters``), already counted in layer_bytes,
    # input_bytes and output_bytes: kept apart so the plan can show them.
    lora_layer_bytes: list[int] | None = None
    lora_input_bytes: int = 0
    lora_output_bytes: int = 0

    @classmethod
    def from_header(cls, header: GGUFHeader) -> ModelShape:

        info = describe(header)
        rule = cache_rule(header)
        n_layer = info.n_layer

        def per_layer(key: str, default: int) -> list[int]:
            v = header.arch_key(key)
            if isinstance(v, list):
                return [int(x) for x in v]
            return [int(v if v is not None else default)] * n_layer

        n_expert, n_used = rule.n_expert, rule.n_expert_used
        layer_bytes = [0] * n_layer
        active = [0] * n_layer
        experts = [0] * n_layer
        exps = re.compile(FFN_EXPS_REGEX)
        input_bytes = output_bytes = 0
        token_embd = 0
        has_output = False
        for t in header.tensors:
            if t.name.startswith("blk."):
                il = int(t.name.split(".")[1])
                if il < n_layer:
                    layer_bytes[il] += t.n_bytes
                    # A token reads n_expert_used of the n_expert experts
                    # (ggml_mul_mat_id over *_exps tensors, llama-graph.cpp build_moe_ffn).
                    expert = "_exps." in t.name and n_expert > 0
                    active[il] += t.n_bytes * n_used // n_expert if expert else t.n_bytes
                    if exps.search(t.name):
                        experts[il] += t.n_bytes
            elif t.name.startswith("output"):
                output_bytes += t.n_bytes
                has_output = has_output or t.name == "output.weight"
            else:
                input_bytes += t.n_bytes
                if t.name == "token_embd.weight":
                    token_embd = t.n_bytes
        n_head_kv = per_layer("attention.head_count_kv", info.n_head_kv)
        if header.arch_key("attention.head_count_kv") is None:
            n_head_kv = per_layer("attention.head_count", info.n_head)
        hk_swa = int(header.arch_key("attention.key_length_swa", 0) or 0)
        hv_swa = int(header.arch_key("attention.value_length_swa", 0) or 0)
        return cls(
            architecture=info.architecture,
            n_layer=n_layer,
            n_embd=info.n_embd,
            n_ff=per_layer("feed_forward_length", 4 * info.n_embd),
            n_head=per_layer("attention.head_count", info.n_head),
            n_head_kv=n_head_kv,
            head_dim_k=info.head_dim_k,
            head_dim_v=info.head_dim_v,
            n_vocab=info.n_vocab,
            n_swa=rule.n_swa if rule.has_swa else 0,
            swa_layers=rule.swa_layers if rule.has_swa else frozenset(),
            layer_bytes=layer_bytes,
            input_bytes=input_bytes,
            output_bytes=output_bytes,
            tied_bytes=0 if has_output else token_embd,
            mla=rule.mla,
            q_norm=any(t.name.endswith("attn_q_norm.weight") for t in header.tensors),
            verified=rule.verified,
            rule_source=rule.source,
            kv_layers=rule.kv_layers,
            recurrent_layers=rule.recurrent_layers,
            n_embd_r=rule.n_embd_r,
            n_embd_s=rule.n_embd_s,
            head_dim_k_swa=hk_swa,
            head_dim_v_swa=hv_swa,
            n_expert=n_expert,
            n_expert_used=n_used,
            n_ff_exp=max(per_layer("expert_feed_forward_length", 0) or [0]),
            layer_active_bytes=active,
            mla_dims=_mla_dims(header),
            ssm_dims=_ssm_dims(header) if rule.n_embd_s else (0, 0, 0, 0),
            n_ff_shexp=int(header.arch_key("expert_shared_feed_forward_length", 0) or 0) if n_expert else 0,
            layer_expert_bytes=experts if any(experts) else None,
        )

    def with_adapters(self, adapters: Sequence[Any]) -> ModelShape:
        """This shape with LoRA adapters' tensors (``modelfile.lora.AdapterInfo``)
        counted where llama.cpp allocates them: each a/b pair on the buffer type
        of the base tensor it modifies (src/llama-adapter.cpp,
        llama_adapter_lora_init_impl: ``buft = ggml_backend_buffer_get_type(
        model_tensor->buffer)``, with CPU repack buffers falling back to the
        CPU), so blk.N's go with layer N, output.weight's with the output layer,
        token_embd's with the input (the CPU). A token reads them all."""
        if not adapters:
            return self
        per = [0] * self.n_layer
        inp = out = 0
        for adapter in adapters:
            for name, n in adapter.bytes_by_base().items():
                if name.startswith("blk.") and int(name.split(".")[1]) < self.n_layer:
                    per[int(name.split(".")[1])] += n
                elif name.startswith("output"):
                    out += n
                else:
                    inp += n
        active = self.layer_active_bytes or self.layer_bytes
        return replace(
            self, layer_bytes=[b + x for b, x in zip(self.layer_bytes, per)], input_bytes=self.input_bytes + inp,
            output_bytes=self.output_bytes + out, layer_active_bytes=[b + x for b, x in zip(active, per)],
            lora_layer_bytes=[a + b for a, b in zip(self.lora_layer_bytes or [0] * self.n_layer, per)],
            lora_input_bytes=self.lora_input_bytes + inp, lora_output_bytes=self.lora_output_bytes + out,
        )

    def experts_in_ram(self, n_cpu_moe: int) -> list[int]:
        """Per layer, the expert bytes ``n_cpu_moe`` (LoadConfig's) keeps in RAM
        wherever the rest of the layer goes (tensor-buffer overrides to the CPU)."""
        out = [0] * self.n_layer
        if self.layer_expert_bytes is not None:
            for il in cpu_moe_layers(n_cpu_moe, self.n_layer):
                out[il] = self.layer_expert_bytes[il]
        return out

    def has_kv(self, il: int) -> bool:
        """Layer ``il`` has a KV cache of its own (llama-kv-cache.cpp: has_kv and
        the memory's layer filter; recurrent layers of a hybrid have none)."""
        if self.kv_layers is not None:  # arch_rules: falcon-h1's layers have both
            return il in self.kv_layers
        return il not in self.recurrent_layers

    def head_dims(self, il: int) -> tuple[int, int]:
        """(K, V) head sizes of layer ``il`` (llama_hparams::n_embd_head_k/v: SWA layers may differ)."""
        if il in self.swa_layers:
            return self.head_dim_k_swa or self.head_dim_k, self.head_dim_v_swa or self.head_dim_v
        return self.head_dim_k, self.head_dim_v

    def kv_dims(self, il: int, v_trans: bool = False) -> tuple[int, int]:
        """(K, V) values per cell for layer ``il``. With MLA (the GGUF has
        ``key_length_mla``/``value_length_mla``) ``key_length`` is the latent
        width (kv_lora_rank + rope dims) with one KV head, and llama.cpp keeps no
        separate V cache: V is read from the latent (llama-kv-cache.cpp, has_v).
        Without flash attention V is stored transposed, and when the layers' V
        widths differ every V row is padded to the widest
        (llama-kv-cache.cpp [TAG_V_CACHE_VARIABLE])."""
        hk, hv = self.head_dims(il)
        k = hk * self.n_head_kv[il]
        if self.mla:
            return k, 0
        v = hv * self.n_head_kv[il]
        if v_trans:
            v = max(self.head_dims(i)[1] * self.n_head_kv[i] for i in range(self.n_layer))
        return k, v

    @property
    def active_layer_bytes(self) -> list[int]:
        """Weights one token reads per layer: every tensor, but of a MoE layer's
        experts only the ``n_expert_used`` it is routed to."""
        return self.layer_active_bytes if self.layer_active_bytes is not None else self.layer_bytes


@dataclass
class KVLayer:
    layer: int
    swa: bool
    cells: int
    k_bytes: int
    v_bytes: int
    on_gpu: bool


@dataclass
class MemoryPlan:
    n_ctx: int  # after llama.cpp's padding
    kv_cells: int
    kv_swa_cells: int
    type_k: str
    type_v: str
    swa_full: bool
    n_gpu_layers: int  # layers actually offloaded (0..n_layer+1)
    output_on_gpu: bool
    kv_cache_bytes: int
    kv_gpu_bytes: int
    kv_bytes_per_token: int  # for a token in every layer's cache (full-attention rate)
    weights_gpu_bytes: int
    weights_cpu_bytes: int
    compute_bytes: int
    output_bytes: int
    compute_on_gpu: bool
    kv_layers: list[KVLayer] = field(default_factory=list, repr=False)
    rs_bytes: int = 0  # recurrent state of hybrid models (llama-memory-recurrent.cpp), all devices
    rs_gpu_bytes: int = 0
    verified: bool = True  # False: the architecture's cache rule is unknown, planned as dense
    swa_type: str = "none"
    compute_estimated: bool = False  # True: compute_bytes is an estimate (the graph is not replayed: compute_graph.py)
    n_cpu_moe: int = 0  # the layers whose experts stay in RAM, as asked (LoadConfig.n_cpu_moe: -1 all)
    experts_ram_bytes: int = 0  # expert weights kept in RAM by n_cpu_moe (counted in weights_cpu_bytes)
    experts_ram_layers: int = 0  # the layers they belong to
    # llama.cpp's output buffer at load, where it is smaller than output_bytes: it makes
    # one row of logits and grows at the first batch with more (llama-context.cpp
    # output_reserve); output_bytes is what the fit budgets. None: the same.
    output_at_load_bytes: int | None = None
    # LoRA adapters' tensors on each side (counted in weights_*_bytes too): ModelShape.with_adapters
    lora_gpu_bytes: int = 0
    lora_cpu_bytes: int = 0

    @property
    def total_gpu_bytes(self) -> int:
        return self.weights_gpu_bytes + self.kv_gpu_bytes + self.rs_gpu_bytes + (self.compute_bytes if self.compute_on_gpu else 0)

    @property
    def total_cpu_bytes(self) -> int:
        return (
            self.weights_cpu_bytes
            + (self.kv_cache_bytes - self.kv_gpu_bytes)
            + (self.rs_bytes - self.rs_gpu_bytes)
            + (0 if self.compute_on_gpu else self.compute_bytes)
            + self.output_bytes
        )

    def kv_buffer_bytes(self) -> list[int]:
        """The KV buffers llama.cpp allocates, in the order it logs them ('KV
        buffer size'): the full-attention cache, then the sliding-window cache
        (llama-kv-cache-iswa.cpp), each summed over devices; empty caches omitted."""
        out = [sum(kl.k_bytes + kl.v_bytes for kl in self.kv_layers if kl.swa == swa) for swa in (False, True)]
        return [b for b in out if b]

    def to_dict(self, with_layers: bool = False) -> dict[str, Any]:
        d = asdict(self)
        if not with_layers:
            d.pop("kv_layers")
        d["total_gpu_bytes"] = self.total_gpu_bytes
        d["total_cpu_bytes"] = self.total_cpu_bytes
        d["kv_cpu_bytes"] = self.kv_cache_bytes - self.kv_gpu_bytes  # the table's CPU column, not left to the reader
        d["rs_cpu_bytes"] = self.rs_bytes - self.rs_gpu_bytes
        return d


def kv_cells(shape: ModelShape, cfg: LoadConfig) -> tuple[int, int]:
    """(cells of the full-attention cache, cells of the sliding-window cache) per stream."""
    n_ctx = _pad(max(cfg.n_ctx, 1), CTX_PAD)
    # src/llama-context.cpp: a unified cache is one stream of n_ctx cells;
    # otherwise each of the n_seq_max streams gets n_ctx / n_seq_max, padded.
    unified = cfg.kv_unified or cfg.n_seq <= 1
    n_ctx_seq = n_ctx if unified else _pad(n_ctx // cfg.n_seq, CTX_PAD)
    if not shape.swa_layers or cfg.swa_full or not shape.n_swa:
        return n_ctx_seq, n_ctx_seq
    # src/llama-kv-cache-iswa.cpp: size_swa = PAD(min(size_base, n_swa * (unified ? n_seq_max : 1) + n_ubatch), 256)
    window = shape.n_swa * (max(cfg.n_seq, 1) if cfg.kv_unified else 1)
    return n_ctx_seq, _pad(min(n_ctx_seq, window + cfg.n_ubatch), CTX_PAD)


def offload(shape: ModelShape, n_gpu_layers: int, gpu: bool) -> tuple[set[int], bool, int]:
    """Which layers llama.cpp puts on the GPU, whether the output layer goes too,
    and the count it reports ('offloaded N/M layers')."""
    if not gpu:
        return set(), False, 0
    n_all = shape.n_layer + 1
    ngl = n_all if n_gpu_layers < 0 else min(n_gpu_layers, n_all)
    start = max(n_all - ngl, 0)
    return set(range(start, shape.n_layer)), ngl >= 1, ngl


def plan_memory(shape: ModelShape, cfg: LoadConfig, *, gpu: bool = False) -> MemoryPlan:
    cells, swa_cells = kv_cells(shape, cfg)
    n_stream = 1 if cfg.kv_unified else max(cfg.n_seq, 1)
    gpu_layers, output_on_gpu, ngl = offload(shape, cfg.n_gpu_layers, gpu)
    v_trans = not cfg.uses_flash_attn
    layers = []
    per_token = 0
    for il in range(shape.n_layer):
        if not shape.has_kv(il):
            continue  # shares another layer's cache, or is recurrent
        swa = il in shape.swa_layers and bool(shape.n_swa)
        n = (swa_cells if swa else cells) * n_stream
        dk, dv = shape.kv_dims(il, v_trans)
        k_row, v_row = row_bytes(cfg.type_k, dk), row_bytes(cfg.type_v, dv)
        per_token += k_row + v_row
        layers.append(KVLayer(il, swa, n, k_row * n, v_row * n, il in gpu_layers))
    kv_total = sum(layer.k_bytes + layer.v_bytes for layer in layers)
    # Recurrent state (llama-memory-recurrent.cpp): per recurrent layer one f32
    # row of n_embd_r and one of n_embd_s per sequence, whatever the context.
    rs_rows = max(cfg.n_seq, 1)
    rs_layer = (shape.n_embd_r + shape.n_embd_s) * 4 * rs_rows
    rs_total = rs_layer * len(shape.recurrent_layers)
    rs_gpu = rs_layer * len(shape.recurrent_layers & gpu_layers)
    compute = _compute(shape, cfg, cells, swa_cells)
    in_ram = shape.experts_in_ram(cfg.n_cpu_moe)
    w_gpu = sum(shape.layer_bytes[i] - in_ram[i] for i in gpu_layers)
    w_cpu = sum(shape.layer_bytes) - w_gpu + shape.input_bytes
    if output_on_gpu:
        w_gpu += shape.output_bytes + shape.tied_bytes
    else:
        w_cpu += shape.output_bytes  # a tied output reads token_embd in place
    lora = shape.lora_layer_bytes or []
    lora_gpu = (sum(lora[i] for i in gpu_layers) if lora else 0) + (shape.lora_output_bytes if output_on_gpu else 0)
    lora_cpu = sum(lora) + shape.lora_input_bytes + shape.lora_output_bytes - lora_gpu
    return MemoryPlan(
        n_ctx=cells * n_stream,
        kv_cells=cells,
        kv_swa_cells=swa_cells if shape.swa_layers and shape.n_swa else 0,
        type_k=cfg.type_k,
        type_v=cfg.type_v,
        swa_full=cfg.swa_full,
        n_gpu_layers=ngl,
        output_on_gpu=output_on_gpu,
        kv_cache_bytes=kv_total,
        kv_gpu_bytes=sum(layer.k_bytes + layer.v_bytes for layer in layers if layer.on_gpu),
        kv_bytes_per_token=per_token,
        weights_gpu_bytes=w_gpu,
        weights_cpu_bytes=w_cpu,
        compute_bytes=compute[0],
        output_bytes=shape.n_vocab * 4 * max(cfg.n_seq, 1),
        compute_on_gpu=bool(gpu_layers) or output_on_gpu,
        kv_layers=layers,
        rs_bytes=rs_total,
        rs_gpu_bytes=rs_gpu,
        verified=shape.verified,
        swa_type="none" if not (shape.swa_layers and shape.n_swa) else ("chunked" if shape.architecture == "llama4" else "standard"),
        compute_estimated=not compute[1],
        n_cpu_moe=cfg.n_cpu_moe,
        experts_ram_bytes=sum(in_ram),
        experts_ram_layers=sum(1 for b in in_ram if b),
        lora_gpu_bytes=lora_gpu,
        lora_cpu_bytes=lora_cpu,
    )


# The estimate, for graphs compute_graph.py does not replay (other architectures,
# separate streams, a recurrent state per sequence). What else is live beside
# the feed-forward peak (3 n_ff): how many n_embd-wide activations, whether a
# Q-sized one is still held, and whether a Q norm keeps it held with a quantized K cache. Llama-style graphs keep 3 n_embd and Q (the
# default, exact on SmolLM2 and Gemma 3 270M); these graphs differ, as measured against
# llama.cpp's log by scripts/plan_conformance.py (a fit to ggml-alloc's peak on
# synthetic models, not derived from the graph).
_FFN_LIVE: dict[str, tuple[int, bool, bool]] = {
    "qwen3": (2, False, False),
    "deepseek2": (2, False, False),
    "phi3": (3, False, False),
    "lfm2": (3, False, False),
    "qwen3moe": (3, True, False),
}


def compute_bytes(shape: ModelShape, cfg: LoadConfig, cells: int, swa_cells: int) -> int:
    """Peak of the worst-case graph llama.cpp reserves (see the module docstring)."""
    return _compute(shape, cfg, cells, swa_cells)[0]


def hadamard_bytes(shape: ModelShape, cfg: LoadConfig) -> int:
    """The Hadamard rotation inputs of one cache (``llama_rules.hadamard_sides``),
    in bytes: K's and V's n x n f32 matrices, for the model's head sizes."""
    nk, nv = hadamard_sides(shape.head_dim_k, 0 if shape.mla else shape.head_dim_v, shape.head_dim_k, shape.head_dim_v,
                            cfg.type_k, cfg.type_v)
    return (nk * nk + nv * nv) * 4


def _compute(shape: ModelShape, cfg: LoadConfig, cells: int, swa_cells: int) -> tuple[int, bool]:
    """(compute buffer bytes, whether llama.cpp's graph was replayed to get it).

    Without a replay the figure is an estimate, counted in f32 values per token of the ubatch (T tokens):
    - logits phase: T_out rows of n_vocab, plus two n_embd activations; the
      attention masks are already freed by then;
    - layer phase: the masks (n_kv x T, f16 with flash attention, else f32)
      plus the larger of the feed-forward peak (gate, up and their product:
      3 n_ff, with the residual stream, the norm output and what ggml-alloc
      cannot reuse yet: 3 n_embd + the query width) and the attention peak (Q, K, V and
      the output projection, and without flash attention the n_kv x n_head
      score matrix).
    """
    n_ctx = _pad(max(cfg.n_ctx, 1), CTX_PAD)
    T = min(n_ctx, cfg.n_ubatch)
    t_out = min(T, cfg.n_outputs_max or cfg.n_batch)

    # Several sequences (serve --parallel) in one unified cache keep the graph's
    # shapes (one stream: the masks are n_kv x tokens); only the reserved ubatches
    # change (compute_graph.compute_buffer). Separate streams, and a recurrent
    # state read per sequence, are left to the estimate and the dry run.
    one_stream = cfg.n_seq <= 1 or (cfg.kv_unified and not shape.recurrent_layers)
    if one_stream and shape.architecture in compute_graph.BUILDERS and cfg.n_cpu_moe == 0:
        # The worst-case graph replayed through ggml's allocator (compute_graph.py),
        # for the architectures whose graph it rebuilds; the rest below is an estimate.
        # Experts in RAM split the graph between the CPU and the GPU, each with a
        # buffer of its own that one replay does not give: llama.cpp's dry run does.
        simulated = compute_graph.replay(shape, T, t_out, cfg.n_seq, cells=cells, swa_cells=swa_cells, type_k=cfg.type_k,
                                         type_v=cfg.type_v, flash_attn=cfg.uses_flash_attn)
        if simulated is not None:
            return simulated, True
    E = shape.n_embd
    F = max(shape.n_ff) if shape.n_ff else 4 * E
    if shape.n_expert and shape.n_ff_exp:
        # A MoE layer computes gate/up/down for the n_expert_used experts each
        # token is routed to (llama-graph.cpp build_moe_ffn, ggml_mul_mat_id).
        F = shape.n_ff_exp * max(shape.n_expert_used, 1)
    H = max(shape.n_head) if shape.n_head else 1
    Hkv = max(shape.n_head_kv) if shape.n_head_kv else H
    q = H * shape.head_dim_k
    kv = Hkv * (shape.head_dim_k + shape.head_dim_v)
    mask_bytes = 2 if cfg.uses_flash_attn else 4
    has_swa = bool(shape.swa_layers and shape.n_swa)
    # One mask per cache that exists: a hybrid whose attention layers all slide
    # (lfm2 with a window) has no full-attention cache and no mask for it.
    kv_layers = [il for il in range(shape.n_layer) if shape.has_kv(il)]
    has_base = any(il not in shape.swa_layers or not has_swa for il in kv_layers)
    has_swa_kv = has_swa and any(il in shape.swa_layers for il in kv_layers)
    masks = (cells * T * mask_bytes if has_base else 0) + (swa_cells * T * mask_bytes if has_swa_kv else 0)
    logits = (t_out * shape.n_vocab + 2 * E * T) * 4
    if t_out >= T:
        # Every row an output (perplexity): the logits do not fit in what the
        # layers freed, and llama.cpp's buffer holds them beside the masks and
        # two more n_embd rows: gemma (head 256) and gpt-oss at 4096 cells were
        # 0.87x without this (scripts/plan_conformance.py, all-logits rows).
        logits += masks + 2 * E * T * 4
    # One Q-sized activation is still live at the peak with an f16/f32 K cache,
    # with a Q norm, or when the ubatch fills the whole context and every row is
    # an output: found by measuring llama.cpp's log (tests/test_planner.py).
    n_e, keeps_q, q_norm_keeps = _FFN_LIVE.get(shape.architecture, (3, True, True))
    q_live = q if (not is_quantized(cfg.type_k) or (shape.q_norm and q_norm_keeps) or (t_out >= T and T >= cells)) else 0
    ffn = 3 * F + n_e * E + (q_live if keeps_q else 0) + 8
    if shape.n_ff_shexp:
        # The routed experts' sum stays live while the shared expert runs
        # (models/qwen2moe.cpp): qwen2moe was 0.91x with a quantized cache without it.
        ffn += E
    if cfg.uses_flash_attn:
        attn = 3 * E + q + kv + H * shape.head_dim_v
    else:
        # The n_kv x n_head score matrix (f32) and the attention output before
        # its permute (n_head x head_dim_v), measured against llama.cpp's log.
        n_kv = cells if has_base else swa_cells
        attn = 3 * E + q + kv + H * shape.head_dim_v + n_kv * H
        if shape.architecture == "phi3":
            attn -= 2 * E  # fused QKV: Q, K and V are views of one tensor (measured)
    # A quantized cache whose head dim is a multiple of 64 is written through a
    # Hadamard rotation (llama-kv-cache.cpp attn_rot_k/v, build_input_k_rot /
    # build_input_v_rot): an f32 graph input, live all along, per cache. K's is
    # nrot x nrot with nrot the largest power of two (>= 64) dividing the head
    # size; V's is always 64 x 64, and MLA has no V.
    rot = hadamard_bytes(shape, cfg) * (int(has_base) + int(has_swa_kv))
    # A recurrent model's graph also holds every sequence's state (conv and SSM,
    # f32) read from and written back to the cache: measured as 0.14 MiB a
    # sequence on the conformance set's mamba2, which is its (n_embd_r + n_embd_s) x 4.
    states = (shape.n_embd_r + shape.n_embd_s) * 4 * max(cfg.n_seq, 1) if shape.recurrent_layers else 0
    layer = max(ffn, attn, _mixer_live(shape)) * T * 4 + masks + rot + states
    return int(max(logits, layer) * shape.compute_scale), False


def _mixer_live(shape: ModelShape) -> int:
    """f32 values per token live at a Mamba-2 mixer's peak (models/mamba-base.cpp
    build_mamba2_layer): its input projection (z, xBC, dt), the convolution's
    input (xBC after the carried state) and output, the scan's output y and its
    gated norm, beside the residual stream and the norm output (3 n_embd).
    Without it the estimate was 0.77-0.86 of llama.cpp's compute buffer on the
    conformance set's granitehybrid, falcon-h1 and mamba2 (scripts/plan_conformance.py);
    with it 0.9x-1.1x."""
    d_inner, d_state, n_group, heads = shape.ssm_dims
    if not d_inner:
        return 0
    conv_dim = d_inner + 2 * n_group * d_state
    return (d_inner + conv_dim + heads) + 2 * conv_dim + 2 * d_inner + 3 * shape.n_embd


# -- fitting a budget ---------------------------------------------------------------

KV_LADDER = ("f16", "q8_0", "q4_0")  # what auto-fit tries, best quality first
MIN_CTX = 2048  # the smallest context auto-fit offers before moving layers off the GPU
# what a context nobody named gives way to, a sequence, before anything else does: llama.cpp's
# fit_params_min_ctx (common/common.h), the floor of its fit's step 2 (common/fit.cpp)
FLEXIBLE_CTX_FLOOR = 4096


@dataclass
class FitResult:
    fits: bool
    config: LoadConfig
    plan: MemoryPlan
    budget_bytes: int | None  # GPU budget; None on a machine with no GPU budget
    ram_bytes: int | None
    margin_bytes: int
    reason: str
    steps: list[str] = field(default_factory=list)
    max_ctx_by_kv_type: Mapping[str, int] = field(default_factory=dict)


class LazyTable(Mapping[str, int]):
    """The largest context per cache type, searched when first read: each is a
    search of ~10 fits (a compute-graph replay each), which ``plan`` and
    ``doctor`` show but loading a model (run, serve, the router's children, the
    cockpit) never reads; eagerly it was half of a load's fit (Gemma 3: ~0.4 s)."""

    def __init__(self, compute: Callable[[], dict[str, int]]) -> None:
        self._compute: Callable[[], dict[str, int]] | None = compute
        self._data: dict[str, int] | None = None

    def _table(self) -> dict[str, int]:
        if self._data is None:
            assert self._compute is not None
            self._data, self._compute = self._compute(), None
        return self._data

    def __getitem__(self, key: str) -> int:
        return self._table()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._table())

    def __len__(self) -> int:
        return len(self._table())

    def __repr__(self) -> str:
        return repr(self._table()) if self._data is not None else "LazyTable(not searched yet)"


def default_margin(budget: int) -> int:
    """Head-room kept free: driver/context overhead and fragmentation."""
    return max(budget // 20, 128 * MiB)


def check_cache_types(shape: ModelShape, cfg: LoadConfig) -> None:
    """llama.cpp's cache-type rules (``llama_rules.check_cache_types``) over every
    layer with a KV cache: its head sizes and its K row (n_embd_k_gqa). Raises
    ``InvalidSetting`` for a config llama.cpp would refuse or abort on."""
    layers = [il for il in range(shape.n_layer) if shape.has_kv(il)]
    rows = {shape.kv_dims(il)[0] for il in layers}
    for hk, hv in sorted({shape.head_dims(il) for il in layers}):
        llama_rules.check_cache_types(cfg.type_k, cfg.type_v, hk, hv, flash_attn=cfg.uses_flash_attn, k_rows=rows)


def check_moe(shape: ModelShape, cfg: LoadConfig) -> None:
    """Experts in RAM (``n_cpu_moe``) only for a model that has experts, and at
    most for its layers: llama.cpp would silently match nothing (a dense model)
    or nothing more (a count past the last layer). Raises ``InvalidSetting``."""
    if cfg.n_cpu_moe == 0:
        return
    if shape.layer_expert_bytes is None:
        raise InvalidSetting(f"{{n_cpu_moe}}: this model ({shape.architecture}) has no expert tensors to keep in RAM: it is not a mixture of experts")
    if cfg.n_cpu_moe > shape.n_layer:
        raise InvalidSetting(f"{{n_cpu_moe}} must be at most the model's {shape.n_layer} layers, got {cfg.n_cpu_moe}")
    if cfg.n_cpu_moe < -1:
        raise InvalidSetting(f"{{n_cpu_moe}} must be -1 (every layer) or between 0 and {shape.n_layer}, got {cfg.n_cpu_moe}")
    if cfg.n_cpu_moe > 0 and not any(shape.layer_expert_bytes[: cfg.n_cpu_moe]):
        # leading dense layers (DeepSeek's leading_dense_block_count): the patterns would match no tensor
        first = next(i for i, b in enumerate(shape.layer_expert_bytes) if b)
        dense = "the first layer of this model has" if first == 1 else f"the first {first} layers of this model have"
        raise InvalidSetting(f"{{n_cpu_moe}} {cfg.n_cpu_moe} matches no tensor: {dense} no experts; give more than {first}")


def cache_types_allowed(shape: ModelShape, cfg: LoadConfig) -> bool:
    """Whether llama.cpp accepts ``cfg``'s cache types for this model (``check_cache_types``)."""
    try:
        check_cache_types(shape, cfg)
    except InvalidSetting:
        return False
    return True


def kv_ladder(shape: ModelShape, want: LoadConfig, kv_fixed: bool) -> list[str]:
    """The cache types auto-fit may try, best quality first: the asked one when
    the user fixed it, else it and the cheaper ones of ``KV_LADDER`` that
    llama.cpp accepts for this model (a head size of 80 refuses q8_0 with flash
    attention). One ladder for both planners (``fit`` and ``placement.fit_across``)."""
    if kv_fixed or want.type_k not in KV_LADDER:
        return [want.type_k]
    allowed = [t for t in KV_LADDER[KV_LADDER.index(want.type_k) :] if cache_types_allowed(shape, replace_config(want, type_k=t, type_v=t))]
    return allowed or [want.type_k]


def replace_config(cfg: LoadConfig, **kw: Any) -> LoadConfig:
    return replace(cfg, **kw)


def search(want: LoadConfig, ladder: list[str], steps: list[moe.Step], policy: str, kv_fixed: bool,
           ok: Callable[[LoadConfig], bool], experts: list[moe.Step] | None = None, *, ctx_first: bool = False) -> LoadConfig | None:
    """The one search, for one GPU and for several devices (``placement.fit_across``):
    ``ok`` says whether a config fits the devices' budgets. Cheaper cache types
    first (q8_0 costs little quality); then, by policy, fewer offloaded layers at
    the wanted context (``offload``), or a smaller context (``ctx``) with as many
    layers offloaded as can be. ``steps``: the (GPU layers, experts in RAM)
    to try, most on the GPU first; a MoE's ``experts`` steps come before them, at
    the context asked and for each cache type (``moe.offload_steps``).

    ``ctx_first`` (policy ``ctx``): the context is a default nobody named (a
    server's trained one, ``fitting.default_ctx``), so it gives way before the
    cache type does, down to ``FLEXIBLE_CTX_FLOOR`` a sequence, as llama.cpp's
    fit shrinks an unset context first (common/fit.cpp, step 2) and never
    changes a cache type: a 128k context is not kept at the price of a q4_0
    cache. A cheaper cache type is taken only where the better one cannot hold
    the floor, and then with the largest context it holds; where none holds it,
    the search goes on as for a named context."""

    def with_kv(step: moe.Step, kv: str) -> LoadConfig:
        return replace_config(want, n_gpu_layers=step[0], n_cpu_moe=step[1], type_k=kv, type_v=want.type_v if kv_fixed else kv)

    if ctx_first and policy == "ctx":
        floor = min(FLEXIBLE_CTX_FLOOR * max(want.n_seq, 1), want.n_ctx)
        for kv in ladder:
            cfg = with_kv(steps[0], kv)
            n = largest_ctx(ok, cfg, want.n_ctx)
            if n >= floor:
                return replace_config(cfg, n_ctx=n)

    for kv in ladder:
        for step in experts or steps[:1]:
            cfg = with_kv(step, kv)
            if ok(cfg):
                return cfg
    if policy == "offload":
        orders = [(kv, step) for kv in ladder for step in steps]
        for kv, step in orders:
            cfg = with_kv(step, kv)
            if ok(cfg):
                return cfg
    else:
        orders = [(kv, step) for step in steps for kv in ladder]
    for kv, step in orders:
        cfg = with_kv(step, kv)
        n = largest_ctx(ok, cfg, want.n_ctx)
        if n >= min(MIN_CTX, want.n_ctx):
            return replace_config(cfg, n_ctx=n)
    return None


def largest_ctx(ok: Callable[[LoadConfig], bool], cfg: LoadConfig, limit: int) -> int:
    """Largest context (a multiple of 256, at most ``limit``) with which ``cfg`` fits (``ok``), or 0."""
    lo, hi = 0, max(limit // CTX_PAD, 1)
    while lo < hi:
        mid = (lo + hi + 1) // 2
        if ok(replace_config(cfg, n_ctx=mid * CTX_PAD)):
            lo = mid
        else:
            hi = mid - 1
    return lo * CTX_PAD


def describe_change(want: LoadConfig, got: LoadConfig, n_all: int, where: str = "on the GPU") -> str:
    """What the fit changed, for people: cache types, context, layers ``where``."""
    parts = []
    if (got.type_k, got.type_v) != (want.type_k, want.type_v):
        parts.append(f"KV cache {got.type_k}/{got.type_v} instead of {want.type_k}/{want.type_v}")
    if got.n_ctx != want.n_ctx:
        parts.append(f"context {got.n_ctx} instead of {want.n_ctx}")
    if got.n_gpu_layers != want.n_gpu_layers and not (got.n_gpu_layers >= n_all and want.n_gpu_layers < 0):
        parts.append(f"{layers_phrase(got.n_gpu_layers, n_all)} {where}")
    if got.n_cpu_moe != want.n_cpu_moe and got.n_gpu_layers != 0:
        parts.append(moe.experts_phrase(got.n_cpu_moe, n_all - 1)
                     + " (a token reads only the experts it is routed to: they move before whole layers, as in llama.cpp's --fit)")
    return "; ".join(parts) or "fits as asked"


def layers_phrase(n_gpu_layers: int, n_all: int) -> str:
    """What ``n_gpu_layers`` of ``n_all`` (the repeating layers and the output
    layer, which llama.cpp offloads first) puts on the GPU, in words: "all 30
    layers + output", "11 of 30 layers + output", "the output layer only", "no layer"."""
    n_layer = n_all - 1
    if n_gpu_layers >= n_all:
        return f"all {n_layer} layers + output"
    if n_gpu_layers <= 0:
        return "no layer"
    if n_gpu_layers == 1:
        return "the output layer only"
    return f"{n_gpu_layers - 1} of {n_layer} layers + output"



def weights_read_per_token(shape: ModelShape) -> int:
    """Weight bytes one decoded token reads: every layer (of a MoE layer only the
    experts it is routed to) and the output matrix; the token embedding is a
    one-row lookup unless it doubles as the output matrix."""
    return sum(shape.active_layer_bytes) + shape.output_bytes + shape.tied_bytes


def gpu_read_per_token(shape: ModelShape, plan: MemoryPlan, gpu: bool) -> int:
    """Of the weights one token reads (``weights_read_per_token``), those in GPU
    memory: the offloaded layers (their routed experts, less those kept in RAM by
    ``n_cpu_moe``) and the output matrix when it went too. The rest is read from RAM."""
    layers, output_on_gpu, _ = offload(shape, plan.n_gpu_layers, gpu)
    in_ram = shape.experts_in_ram(plan.n_cpu_moe)  # a token reads n_expert_used of n_expert of them (as ModelShape counts)
    read = sum(shape.active_layer_bytes[i] - (in_ram[i] * shape.n_expert_used // shape.n_expert if shape.n_expert else 0) for i in layers)
    return read + (shape.output_bytes + shape.tied_bytes if output_on_gpu else 0)


def kv_bytes_in_use(plan: MemoryPlan, n_tokens: int) -> int:
    """Bytes of KV cache holding ``n_tokens`` tokens now: each layer's per-cell
    cost times the cells in use (a sliding-window layer holds at most its own
    cache size)."""
    total = 0
    for layer in plan.kv_layers:
        per_cell = (layer.k_bytes + layer.v_bytes) // max(layer.cells, 1)
        total += per_cell * min(n_tokens, layer.cells)
    return total
