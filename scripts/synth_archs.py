"""The architectures scripts/synth_gguf.py writes beyond the Llama-style ones.

State-space models and hybrids (Mamba-2 layers alone or beside attention:
mamba2, granitehybrid, falcon-h1, nemotron_h), mixtures of experts with shared
experts, expert biases or attention sinks (qwen2moe, olmoe, granitemoe,
gpt-oss), and the LayerNorm models whose head size is often not a power of two
(phi2, stablelm: head 80 in the real models; gemma: 256). Each layer's tensors
follow the architecture's ``load_arch_tensors`` in the vendored llama.cpp
(src/models/<file>.cpp), so llama.cpp builds the real graph for them: the
conformance suite (scripts/plan_conformance.py) needs nothing more.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import gguf
import numpy as np

if TYPE_CHECKING:
    from scripts.synth_spec import SynthSpec

Mat = Callable[..., np.ndarray]

# Mamba-2 mixers: models/mamba2.cpp, granite-hybrid.cpp, falcon-h1.cpp, nemotron-h.cpp.
SSM = ("mamba2", "granitehybrid", "falcon-h1", "nemotron_h")
# LayerNorm (with bias) models: the eps key is layer_norm_epsilon, not the RMS one.
LAYER_NORM = ("phi2", "stablelm")
ARCHS = (*SSM, "qwen2moe", "olmoe", "granitemoe", "gpt-oss", *LAYER_NORM, "gemma")


def kind(spec: SynthSpec, i: int) -> str:
    """Layer ``i``'s kind: "m" a Mamba-2 mixer, "a" attention, "f" a feed-forward
    block alone (nemotron_h), "h" attention and a mixer side by side (falcon-h1)."""
    if spec.arch == "mamba2":
        return "m"
    if spec.arch == "falcon-h1":
        return "h"
    return spec.layer_kinds[i] if spec.layer_kinds else "a"


def write_hparams(w: gguf.GGUFWriter, spec: SynthSpec) -> None:
    a = spec.arch
    if a in SSM:
        w.add_ssm_conv_kernel(spec.ssm_conv)
        w.add_ssm_inner_size(spec.ssm_inner)
        w.add_ssm_state_size(spec.ssm_state)
        w.add_ssm_time_step_rank(spec.ssm_heads)
        w.add_ssm_group_count(spec.ssm_groups)
    if a in LAYER_NORM or a == "nemotron_h":
        w.add_layer_norm_eps(1e-5)
    if a == "granitemoe":
        w.add_logit_scale(1.0)
    if spec.n_ff_shexp:
        w.add_expert_shared_feed_forward_length(spec.n_ff_shexp)


def head_count_kv(spec: SynthSpec) -> int | list[int]:
    """Per-layer KV heads where layers differ: 0 marks a mixer or a feed-forward-only layer."""
    if spec.arch in ("mamba2",):
        return 0
    if spec.layer_kinds:
        return [spec.n_head_kv if k == "a" else 0 for k in spec.layer_kinds]
    return spec.n_head_kv


def feed_forward_length(spec: SynthSpec) -> int | list[int]:
    """nemotron_h: only its feed-forward layers have one (a mixer or attention layer has n_ff 0)."""
    if spec.arch == "nemotron_h":
        return [spec.n_ff if k == "f" else 0 for k in spec.layer_kinds]
    return spec.n_ff


def _mixer(w: gguf.GGUFWriter, b: str, spec: SynthSpec, mat: Mat) -> None:
    E, di, ds, ng, nh = spec.n_embd, spec.ssm_inner, spec.ssm_state, spec.ssm_groups, spec.ssm_heads
    conv_dim = di + 2 * ng * ds
    f32 = np.float32
    w.add_tensor(f"{b}.ssm_in.weight", mat(di + conv_dim + nh, E))
    w.add_tensor(f"{b}.ssm_conv1d.weight", mat(conv_dim, spec.ssm_conv).astype(f32))  # ggml_ssm_conv reads f32
    w.add_tensor(f"{b}.ssm_conv1d.bias", np.zeros(conv_dim, dtype=f32))
    w.add_tensor(f"{b}.ssm_dt.bias", np.zeros(nh, dtype=f32))
    w.add_tensor(f"{b}.ssm_a", -np.ones((nh, 1), dtype=f32))
    w.add_tensor(f"{b}.ssm_d", np.ones((nh, 1), dtype=f32))
    w.add_tensor(f"{b}.ssm_norm.weight", np.ones((ng, di // ng), dtype=f32))
    w.add_tensor(f"{b}.ssm_out.weight", mat(E, di))


def _attention(w: gguf.GGUFWriter, b: str, spec: SynthSpec, hd: int, mat: Mat) -> None:
    E, H, Hkv = spec.n_embd, spec.n_head, spec.n_head_kv
    w.add_tensor(f"{b}.attn_q.weight", mat(H * hd, E))
    w.add_tensor(f"{b}.attn_k.weight", mat(Hkv * hd, E))
    w.add_tensor(f"{b}.attn_v.weight", mat(Hkv * hd, E))
    w.add_tensor(f"{b}.attn_output.weight", mat(E, H * hd))
    zeros = np.zeros
    if spec.arch in LAYER_NORM + ("gpt-oss",):
        if spec.arch == "phi2":  # phi2.cpp: Q, K, V biases are read when present, the output's always
            for t, n in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
                w.add_tensor(f"{b}.attn_{t}.bias", zeros(n, dtype=np.float32))
        if spec.arch != "stablelm":
            w.add_tensor(f"{b}.attn_output.bias", zeros(E, dtype=np.float32))
    if spec.arch == "olmoe":
        w.add_tensor(f"{b}.attn_q_norm.weight", np.ones(E, dtype=np.float32))
        w.add_tensor(f"{b}.attn_k_norm.weight", np.ones(E, dtype=np.float32))
    if spec.arch == "gpt-oss":
        w.add_tensor(f"{b}.attn_sinks.weight", zeros(H, dtype=np.float32))


def _experts(w: gguf.GGUFWriter, b: str, spec: SynthSpec, mat: Mat) -> None:
    E, X, Fx = spec.n_embd, spec.n_expert, spec.n_ff_exp or spec.n_ff
    w.add_tensor(f"{b}.ffn_gate_inp.weight", mat(X, E))
    w.add_tensor(f"{b}.ffn_gate_exps.weight", mat(X, Fx, E))
    w.add_tensor(f"{b}.ffn_up_exps.weight", mat(X, Fx, E))
    w.add_tensor(f"{b}.ffn_down_exps.weight", mat(X, E, Fx))
    if spec.arch == "gpt-oss":  # openai-moe.cpp: the router and every expert have biases
        f32 = np.float32
        w.add_tensor(f"{b}.ffn_gate_inp.bias", np.zeros(X, dtype=f32))
        w.add_tensor(f"{b}.ffn_gate_exps.bias", np.zeros((X, Fx), dtype=f32))
        w.add_tensor(f"{b}.ffn_up_exps.bias", np.zeros((X, Fx), dtype=f32))
        w.add_tensor(f"{b}.ffn_down_exps.bias", np.zeros((X, E), dtype=f32))
    if spec.n_ff_shexp:
        S = spec.n_ff_shexp
        if spec.arch == "qwen2moe":  # qwen2moe.cpp: a sigmoid gate on the shared expert
            w.add_tensor(f"{b}.ffn_gate_inp_shexp.weight", np.ones(E, dtype=np.float32))
        w.add_tensor(f"{b}.ffn_gate_shexp.weight", mat(S, E))
        w.add_tensor(f"{b}.ffn_up_shexp.weight", mat(S, E))
        w.add_tensor(f"{b}.ffn_down_shexp.weight", mat(E, S))


def _ffn(w: gguf.GGUFWriter, b: str, spec: SynthSpec, mat: Mat) -> None:
    E, F = spec.n_embd, spec.n_ff
    if spec.arch == "nemotron_h":  # nemotron-h.cpp: up and down, a squared ReLU between
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        return
    if spec.arch == "phi2":  # phi2.cpp: up and down with biases, GELU between
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_up.bias", np.zeros(F, dtype=np.float32))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        w.add_tensor(f"{b}.ffn_down.bias", np.zeros(E, dtype=np.float32))
        return
    w.add_tensor(f"{b}.ffn_gate.weight", mat(F, E))
    w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
    w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))


def write_layer(w: gguf.GGUFWriter, spec: SynthSpec, i: int, hd: int, mat: Mat) -> None:
    """Layer ``i``'s tensors."""
    b, E, k = f"blk.{i}", spec.n_embd, kind(spec, i)
    ones: Callable[[int], Any] = lambda n: np.ones(n, dtype=np.float32)  # noqa: E731
    w.add_tensor(f"{b}.attn_norm.weight", ones(E))
    if spec.arch in LAYER_NORM:
        w.add_tensor(f"{b}.attn_norm.bias", np.zeros(E, dtype=np.float32))
    if k in "mh":
        _mixer(w, b, spec, mat)
    if k in "ah":
        _attention(w, b, spec, hd, mat)
    if spec.arch == "gpt-oss":
        w.add_tensor(f"{b}.post_attention_norm.weight", ones(E))
    if spec.arch == "mamba2" or (spec.arch == "nemotron_h" and k != "f"):
        return  # no feed-forward block
    if spec.arch == "falcon-h1":
        w.add_tensor(f"{b}.ffn_norm", ones(E))  # falcon-h1.cpp names it without ".weight"
    elif spec.arch not in ("gpt-oss", "nemotron_h", "phi2"):  # phi2's reads the attention norm's output
        w.add_tensor(f"{b}.ffn_norm.weight", ones(E))
    if spec.arch == "stablelm":
        w.add_tensor(f"{b}.ffn_norm.bias", np.zeros(E, dtype=np.float32))
    if spec.n_expert:
        _experts(w, b, spec, mat)
    else:
        _ffn(w, b, spec, mat)


def write_output(w: gguf.GGUFWriter, spec: SynthSpec, n_vocab: int, mat: Mat) -> None:
    E = spec.n_embd
    w.add_tensor("output_norm.weight", np.ones(E, dtype=np.float32))
    if spec.arch in LAYER_NORM:
        w.add_tensor("output_norm.bias", np.zeros(E, dtype=np.float32))
    if spec.arch == "gemma":
        return  # gemma.cpp always reads token_embd as the output
    w.add_tensor("output.weight", mat(n_vocab, E))
    if spec.arch == "phi2":
        w.add_tensor("output.bias", np.zeros(n_vocab, dtype=np.float32))
