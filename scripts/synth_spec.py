"""What a synthetic GGUF holds (``SynthSpec``), apart from the writers: both
``synth_gguf`` and ``synth_archs`` read it, and one importing the other for it
was an import circle."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import gguf


@dataclass(frozen=True)
class SynthSpec:
    arch: str = "llama"
    n_layer: int = 2
    n_embd: int = 64
    n_head: int = 4
    n_head_kv: int = 2
    n_ff: int = 128
    n_ctx_train: int = 2048
    dtype: str = "f32"  # f32 or f16 for the 2-D weights
    seed: int = 0
    name: str = "synthetic-llama"  # never "phi3" in it: llama.cpp then wants Phi's special tokens (llama-vocab.cpp)
    head_dim: int | None = None  # default n_embd // n_head
    sliding_window: int | None = None  # written as <arch>.attention.sliding_window when set
    swa_pattern: int | None = None  # <arch>.attention.sliding_window_pattern (an integer) when set
    tied_output: bool = False  # no output.weight: llama.cpp reuses token_embd
    n_expert: int = 0  # MoE (qwen3moe): experts per layer and how many a token uses
    n_expert_used: int = 0
    n_ff_exp: int = 0
    kv_lora_rank: int = 0  # deepseek2 (MLA): latent width and the rope part of a head
    rope_dim: int = 0
    conv_layers: tuple[int, ...] = ()  # lfm2: layers that are short convolutions (n_head_kv 0)
    l_cache: int = 3  # lfm2: short-convolution length
    n_vocab: int = 0  # pad the vocabulary with unused tokens up to this size (0: the natural ~360)
    kv_heads_per_layer: tuple[int, ...] = ()  # llama: KV heads layer by layer (V widths that differ), instead of n_head_kv
    # Mamba-2 mixers (scripts/synth_archs.py): inner width, state size, groups, heads, convolution length
    ssm_inner: int = 0
    ssm_state: int = 0
    ssm_groups: int = 1
    ssm_heads: int = 0
    ssm_conv: int = 4
    layer_kinds: str = ""  # granitehybrid, nemotron_h: one letter a layer (synth_archs.kind)
    n_ff_shexp: int = 0  # a shared expert's feed-forward width (qwen2moe, granitemoe)
    pooling_type: int | None = None  # <arch>.pooling_type when set (llama.cpp's enum: 1 mean, 2 cls, 3 last)
    split_max_tensors: int = 0  # >0: a split GGUF (gguf-py's shards, NAME-00001-of-0000N.gguf), at most this many tensors a file
    # fill-in-the-middle roles ("pre", "suf", "mid", "rep", "sep", "pad"): each a control token (Qwen's spelling,
    # FIM_TOKENS) after the vocabulary, named by tokenizer.ggml.fim_<role>_token_id; () writes none (the file is unchanged)
    fim: tuple[str, ...] = ()
    # more control tokens after those (a chat template's markers, as a real vocabulary holds [TOOL_CALLS] or <|im_end|>),
    # and the chat template (tokenizer.chat_template); () and None write neither
    controls: tuple[str, ...] = ()
    chat_template: str | None = None
    weight_scale: float = 0.02  # the 2-D weights' standard deviation; larger makes attention sharper, so positions matter more


def finish(w: gguf.GGUFWriter, path: Path) -> Path:
    """Write out what ``w`` holds (header, metadata, tensors, in gguf's order) and close it: every synthetic writer's end."""
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path
