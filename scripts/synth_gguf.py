"""Write small synthetic GGUF models with the ``gguf`` package, for fast tests.

The models are random weights in a real llama.cpp architecture, with a
SentencePiece vocabulary that has byte fallback (every byte is a token), so
llama.cpp loads them, tokenizes any text and generates (gibberish) quickly.

    python -m scripts.synth_gguf out.gguf --layers 2 --embd 64 --heads 4 --kv-heads 2
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from importlib.resources import files
from pathlib import Path

import gguf
import numpy as np

from scripts import synth_archs
from scripts.synth_spec import SynthSpec, finish

# ChatML, text parts only (Qwen's and SmolLM2's shape; a vision part is the media marker in the
# rendered text): with controls=("<|im_start|>", "<|im_end|>") a synthetic model chats
CHATML = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
          "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")
# Architectures write_gguf can write; the tensors each needs follow its
# load_arch_tensors in llama.cpp's src/models/<arch>.cpp.
ARCHS = ("llama", "qwen2", "qwen2vl", "qwen3", "phi3", "gemma2", "gemma3", "olmo2", "granite", "exaone4", "lfm2", "qwen3moe", "deepseek2", "deci",
         "mistral3", "smollm3", "ernie4_5",
         "llama-embed",  # llama's tensors; its graph has no lm_head (src/models/llama.cpp, graph<true>)
         *synth_archs.ARCHS)


# llama.cpp's FIM token ids by role, as Qwen2.5-Coder spells the tokens (llama-vocab.cpp also finds them by these texts)
FIM_TOKENS = {"pre": "<|fim_prefix|>", "suf": "<|fim_suffix|>", "mid": "<|fim_middle|>", "rep": "<|repo_name|>",
              "sep": "<|file_sep|>", "pad": "<|fim_pad|>"}


def vocabulary(n_vocab: int = 0) -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: control tokens, 256 byte tokens, test words,
    and (with ``n_vocab``) filler tokens that no text ever maps to (their
    prefixes are not tokens, so SentencePiece never merges up to them)."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    text = files("localllm.models").joinpath("test_vocab.txt").read_text(encoding="utf-8")
    words = [w for w in (line.strip() for line in text.splitlines()) if w and not w.startswith("#")]
    # SentencePiece merges two symbols only when the merged text is a token, so
    # every prefix of a word is a token too; longer pieces score higher.
    pieces: dict[str, None] = {}
    for word in words:
        for end in range(1, len(word) + 1):
            pieces.setdefault(word[:end])
    tokens += list(pieces)
    types += [gguf.TokenType.NORMAL] * len(pieces)
    scores = [0.0] * 259 + [float(len(p)) for p in pieces]
    n_fill = max(n_vocab - len(tokens), 0)
    tokens += [f"<fill{i}>" for i in range(n_fill)]
    types += [gguf.TokenType.UNUSED] * n_fill
    scores += [-1000.0] * n_fill
    return tokens, scores, [int(t) for t in types]


def write_llama_gguf(path: str | Path, spec: SynthSpec = SynthSpec()) -> Path:
    """Write a GGUF and return its path (any architecture in ``ARCHS``; the name
    is kept from when there were two)."""
    return write_gguf(path, spec)


def write_gguf(path: str | Path, spec: SynthSpec = SynthSpec()) -> Path:
    """Write a GGUF of ``spec.arch`` with random weights and return its path."""
    if spec.arch not in ARCHS:
        raise ValueError(f"unsupported synthetic architecture {spec.arch}")
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = vocabulary(spec.n_vocab)
    fim_ids = {role: len(tokens) + i for i, role in enumerate(spec.fim)}
    tokens += [FIM_TOKENS[role] for role in spec.fim]
    scores += [0.0] * len(spec.fim)
    types += [int(gguf.TokenType.CONTROL)] * len(spec.fim)
    tokens += list(spec.controls)
    scores += [0.0] * len(spec.controls)
    types += [int(gguf.TokenType.CONTROL)] * len(spec.controls)
    n_vocab = len(tokens)
    a = spec.arch
    E = spec.n_embd
    hd = spec.head_dim or (E // spec.n_head if spec.n_head else 0)
    wdtype = np.float16 if spec.dtype == "f16" else np.float32

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * spec.weight_scale).astype(wdtype)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), a, split_max_tensors=spec.split_max_tensors)
    w.add_name(spec.name)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(E)
    w.add_feed_forward_length(synth_archs.feed_forward_length(spec))
    w.add_head_count(spec.n_head)
    if a == "lfm2":
        w.add_head_count_kv([0 if i in spec.conv_layers else spec.n_head_kv for i in range(spec.n_layer)])
        w.add_uint32(f"{a}.shortconv.l_cache", spec.l_cache)
    elif a in synth_archs.ARCHS:
        w.add_head_count_kv(synth_archs.head_count_kv(spec))
        synth_archs.write_hparams(w, spec)
    elif spec.kv_heads_per_layer:
        w.add_head_count_kv(list(spec.kv_heads_per_layer))
    else:
        w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    if a == "qwen2vl":  # M-RoPE (models/qwen2vl.cpp): a head's rotary pairs split over time, height, width (Qwen2-VL: 16, 24, 24, 0 of 64)
        w.add_rope_dimension_sections([hd // 8, 3 * hd // 16, hd // 2 - hd // 8 - 3 * hd // 16, 0])
    if spec.pooling_type is not None:
        w.add_uint32(f"{a}.pooling_type", spec.pooling_type)
    if a == "deepseek2":
        r, rope = spec.kv_lora_rank, spec.rope_dim
        w.add_rope_dimension_count(rope)
        w.add_key_length(r + rope)  # the cache holds the latent plus the rope part, one "head"
        w.add_value_length(r)
        w.add_uint32(f"{a}.attention.key_length_mla", hd)
        w.add_uint32(f"{a}.attention.value_length_mla", hd)
        w.add_q_lora_rank(0)
        w.add_kv_lora_rank(r)
        w.add_leading_dense_block_count(spec.n_layer)
        w.add_expert_feed_forward_length(spec.n_ff)
        w.add_expert_shared_count(0)
    else:
        w.add_rope_dimension_count(hd)
        if spec.head_dim:
            w.add_key_length(hd)
            w.add_value_length(hd)
    if spec.sliding_window is not None:
        w.add_sliding_window(spec.sliding_window)
    if spec.swa_pattern is not None:
        w.add_uint32(f"{a}.attention.sliding_window_pattern", spec.swa_pattern)
    if a == "granite":
        w.add_logit_scale(1.0)
    if spec.n_expert:
        w.add_expert_count(spec.n_expert)
        w.add_expert_used_count(spec.n_expert_used)
        w.add_expert_feed_forward_length(spec.n_ff_exp)
    w.add_rope_freq_base(10000.0)
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.MOSTLY_F16 if spec.dtype == "f16" else gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(False)
    for role, tid in fim_ids.items():
        w.add_uint32(f"tokenizer.ggml.fim_{role}_token_id", tid)
    if spec.chat_template is not None:
        w.add_chat_template(spec.chat_template)

    # numpy shapes are (rows, cols); GGUF stores ne reversed: {cols, rows}.
    w.add_tensor("token_embd.weight", mat(n_vocab, E))
    H, Hkv, F = spec.n_head, spec.n_head_kv, spec.n_ff
    for i in range(spec.n_layer if a not in synth_archs.ARCHS else 0):
        b = f"blk.{i}"
        conv = a == "lfm2" and i in spec.conv_layers
        if a not in ("olmo2", "exaone4"):
            w.add_tensor(f"{b}.attn_norm.weight", ones(E))
        if a == "deepseek2":
            r, rope = spec.kv_lora_rank, spec.rope_dim
            w.add_tensor(f"{b}.attn_kv_a_norm.weight", ones(r))
            w.add_tensor(f"{b}.attn_q.weight", mat(H * hd, E))
            w.add_tensor(f"{b}.attn_kv_a_mqa.weight", mat(r + rope, E))
            w.add_tensor(f"{b}.attn_k_b.weight", mat(H, r, hd - rope))
            w.add_tensor(f"{b}.attn_v_b.weight", mat(H, hd, r))
            w.add_tensor(f"{b}.attn_output.weight", mat(E, H * hd))
        elif conv:
            # ggml_ssm_conv reads the kernel as f32 (ggml-cpu ops.cpp asserts it)
            w.add_tensor(f"{b}.shortconv.conv.weight", mat(E, spec.l_cache).astype(np.float32))
            w.add_tensor(f"{b}.shortconv.in_proj.weight", mat(3 * E, E))
            w.add_tensor(f"{b}.shortconv.out_proj.weight", mat(E, E))
        elif a == "phi3":
            w.add_tensor(f"{b}.attn_qkv.weight", mat(H * hd + 2 * Hkv * hd, E))
            w.add_tensor(f"{b}.attn_output.weight", mat(E, H * hd))
        else:
            Hkv = spec.kv_heads_per_layer[i] if spec.kv_heads_per_layer else spec.n_head_kv
            w.add_tensor(f"{b}.attn_q.weight", mat(H * hd, E))
            w.add_tensor(f"{b}.attn_k.weight", mat(Hkv * hd, E))
            w.add_tensor(f"{b}.attn_v.weight", mat(Hkv * hd, E))
            w.add_tensor(f"{b}.attn_output.weight", mat(E, H * hd))
            if a in ("qwen2", "qwen2vl"):
                for t, n in (("q", H * hd), ("k", Hkv * hd), ("v", Hkv * hd)):
                    w.add_tensor(f"{b}.attn_{t}.bias", np.zeros(n, dtype=np.float32))
        if a in ("gemma3", "qwen3", "exaone4", "qwen3moe") or (a == "lfm2" and not conv):
            w.add_tensor(f"{b}.attn_q_norm.weight", ones(hd))
            w.add_tensor(f"{b}.attn_k_norm.weight", ones(hd))
        if a == "olmo2":
            w.add_tensor(f"{b}.attn_q_norm.weight", ones(H * hd))
            w.add_tensor(f"{b}.attn_k_norm.weight", ones(Hkv * hd))
        if a in ("gemma2", "gemma3", "olmo2", "exaone4"):
            w.add_tensor(f"{b}.post_attention_norm.weight", ones(E))
            w.add_tensor(f"{b}.post_ffw_norm.weight", ones(E))
        if a not in ("olmo2", "exaone4"):
            w.add_tensor(f"{b}.ffn_norm.weight", ones(E))
        if a == "qwen3moe":
            X, Fx = spec.n_expert, spec.n_ff_exp
            w.add_tensor(f"{b}.ffn_gate_inp.weight", mat(X, E))
            w.add_tensor(f"{b}.ffn_gate_exps.weight", mat(X, Fx, E))
            w.add_tensor(f"{b}.ffn_up_exps.weight", mat(X, Fx, E))
            w.add_tensor(f"{b}.ffn_down_exps.weight", mat(X, E, Fx))
        elif a == "phi3":
            w.add_tensor(f"{b}.ffn_up.weight", mat(2 * F, E))
            w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        else:
            w.add_tensor(f"{b}.ffn_gate.weight", mat(F, E))
            w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
            w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
    if a in synth_archs.ARCHS:
        for i in range(spec.n_layer):
            synth_archs.write_layer(w, spec, i, hd, mat)
        synth_archs.write_output(w, spec, n_vocab, mat)
    else:
        w.add_tensor("token_embd_norm.weight" if a == "lfm2" else "output_norm.weight", ones(E))
    if not spec.tied_output and a not in ("gemma2", *synth_archs.ARCHS):  # gemma2 always reads token_embd (models/gemma2.cpp)
        w.add_tensor("output.weight", mat(n_vocab, E))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    shards = len(w.fout or [])  # read before close: how many files the writer made
    w.close()
    if spec.split_max_tensors and shards > 1:
        return path.with_name(f"{path.stem}-00001-of-{shards:05d}.gguf")  # the first shard: what llama.cpp loads
    return path


@dataclass(frozen=True)
class RerankerSpec:
    """A BERT cross-encoder (bge-reranker's shape, tiny): post-norm layers with
    biases, learned positions, a ``cls`` dense + tanh and a ``cls.output``
    projection to ``n_cls_out`` scores (src/models/bert.cpp, and the RANK case
    of build_pooling in src/llama-graph.cpp)."""

    n_layer: int = 2
    n_embd: int = 32
    n_head: int = 4
    n_ff: int = 64
    n_ctx_train: int = 512
    n_cls_out: int = 1  # 1: no classifier.output_labels key (llama.cpp's default); more: that many labels
    head: bool = True  # False: no cls tensors, a plain BERT encoder (rank pooling has no head to run)
    rerank_template: str | None = None  # tokenizer.chat_template.rerank, with {query} and {document} (llama-server's format_prompt_rerank)
    seed: int = 0
    name: str = "synthetic-reranker"


def write_reranker_gguf(path: str | Path, spec: RerankerSpec = RerankerSpec()) -> Path:
    """Write a tiny BERT reranker GGUF (seeded random weights) and return its path.

    The vocabulary is ``vocabulary()``'s SentencePiece one with XLM-RoBERTa's
    specials (bge-reranker's): ``<s>`` BOS, ``</s>`` EOS and SEP, all three
    added, so llama-server's rerank prompt is ``<s> query </s></s> doc </s>``
    (format_prompt_rerank). Weights are larger than write_gguf's 0.02 so the
    scores differ visibly between pairs."""
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = vocabulary()
    n_vocab, E, F = len(tokens), spec.n_embd, spec.n_ff

    def mat(*shape: int, scale: float = 0.2) -> np.ndarray:
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    def ones(n: int) -> np.ndarray:
        return np.ones(n, dtype=np.float32)

    def zeros(n: int) -> np.ndarray:
        return np.zeros(n, dtype=np.float32)

    a = "bert"
    w = gguf.GGUFWriter(str(path), a)
    w.add_name(spec.name)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(E)
    w.add_feed_forward_length(F)
    w.add_head_count(spec.n_head)
    w.add_layer_norm_eps(1e-12)
    w.add_causal_attention(False)
    w.add_pooling_type(gguf.PoolingType.RANK)
    if spec.n_cls_out > 1:
        w.add_classifier_output_labels([f"LABEL_{i}" for i in range(spec.n_cls_out)])
    w.add_vocab_size(n_vocab)
    w.add_file_type(gguf.LlamaFileType.ALL_F32)
    w.add_tokenizer_model("llama")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    w.add_token_type_count(2)
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_sep_token_id(2)
    w.add_unk_token_id(0)
    w.add_add_bos_token(True)
    w.add_add_eos_token(True)
    w.add_add_sep_token(True)
    if spec.rerank_template is not None:
        w.add_chat_template([{"name": "rerank", "template": spec.rerank_template}])

    # numpy shapes are (rows, cols); GGUF stores ne reversed: {cols, rows}.
    w.add_tensor("token_embd.weight", mat(n_vocab, E))
    w.add_tensor("token_types.weight", mat(2, E))
    w.add_tensor("position_embd.weight", mat(spec.n_ctx_train, E))
    w.add_tensor("token_embd_norm.weight", ones(E))
    w.add_tensor("token_embd_norm.bias", zeros(E))
    for i in range(spec.n_layer):
        b = f"blk.{i}"
        for t in ("q", "k", "v"):
            w.add_tensor(f"{b}.attn_{t}.weight", mat(E, E))
            w.add_tensor(f"{b}.attn_{t}.bias", mat(E, scale=0.05))
        w.add_tensor(f"{b}.attn_output.weight", mat(E, E))
        w.add_tensor(f"{b}.attn_output.bias", mat(E, scale=0.05))
        w.add_tensor(f"{b}.attn_output_norm.weight", ones(E))
        w.add_tensor(f"{b}.attn_output_norm.bias", zeros(E))
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_up.bias", mat(F, scale=0.05))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        w.add_tensor(f"{b}.ffn_down.bias", mat(E, scale=0.05))
        w.add_tensor(f"{b}.layer_output_norm.weight", ones(E))
        w.add_tensor(f"{b}.layer_output_norm.bias", zeros(E))
    if spec.head:
        w.add_tensor("cls.weight", mat(E, E))
        w.add_tensor("cls.bias", mat(E, scale=0.05))
        w.add_tensor("cls.output.weight", mat(spec.n_cls_out, E, scale=1.0))
        w.add_tensor("cls.output.bias", mat(spec.n_cls_out, scale=0.05))
    return finish(w, path)


def write_lora_gguf(path: str | Path, spec: SynthSpec = SynthSpec(), *, rank: int = 4, alpha: float = 8.0,
                    targets: tuple[str, ...] = ("attn_q", "attn_v", "ffn_down"), output: bool = False, seed: int = 1,
                    weight_scale: float = 0.5) -> Path:
    """Write a LoRA adapter GGUF for a ``write_gguf`` llama-style model of
    ``spec`` and return its path, laid out as llama.cpp's convert_lora_to_gguf.py
    writes one: ``general.type = adapter``, ``adapter.type = lora``,
    ``adapter.lora.alpha``, and per adapted tensor ``<name>.lora_a`` (numpy
    (rank, in), ne {in, rank}) and ``<name>.lora_b`` (numpy (out, rank), ne
    {rank, out}), the shapes llama-adapter.cpp checks against the base tensor.
    Weights are large (``weight_scale``) so the adapter changes the greedy
    output of the tiny model; ``output`` adapts output.weight too (the output
    layer's device, for the planner). A mismatched adapter is one written for
    another ``spec`` (another arch or n_embd)."""
    path = Path(path)
    rng = np.random.default_rng(seed)
    E, H, Hkv, F = spec.n_embd, spec.n_head, spec.n_head_kv, spec.n_ff
    hd = spec.head_dim or E // H
    dims = {"attn_q": (H * hd, E), "attn_k": (Hkv * hd, E), "attn_v": (Hkv * hd, E), "attn_output": (E, H * hd),
            "ffn_gate": (F, E), "ffn_up": (F, E), "ffn_down": (E, F)}
    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_type(gguf.GGUFType.ADAPTER)
    w.add_string(gguf.Keys.Adapter.TYPE, "lora")
    w.add_float32(gguf.Keys.Adapter.LORA_ALPHA, float(alpha))
    w.add_name(f"{spec.name}-lora")

    def pair(name: str, out: int, inp: int) -> None:
        w.add_tensor(f"{name}.lora_a", (rng.standard_normal((rank, inp)) * weight_scale).astype(np.float32))
        w.add_tensor(f"{name}.lora_b", (rng.standard_normal((out, rank)) * weight_scale).astype(np.float32))

    for i in range(spec.n_layer):
        for t in targets:
            pair(f"blk.{i}.{t}.weight", *dims[t])
    if output:
        pair("output.weight", len(vocabulary(spec.n_vocab)[0]) + len(spec.fim), E)
    return finish(w, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    ap.add_argument("--arch", choices=ARCHS, default="llama")
    ap.add_argument("--sliding-window", type=int, default=None)
    ap.add_argument("--reranker", action="store_true", help="a tiny BERT reranker (cls head, rank pooling); the shape options are ignored")
    a = ap.parse_args()
    if a.reranker:
        print(write_reranker_gguf(a.out))
        return
    spec = SynthSpec(arch=a.arch, n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_head_kv=a.kv_heads, n_ff=a.ff, dtype=a.dtype,
                     sliding_window=a.sliding_window, name=f"synthetic-{a.arch.replace('phi3', 'p3')}")
    print(write_gguf(a.out, spec))


if __name__ == "__main__":
    main()
