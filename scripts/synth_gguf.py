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
    name: str = "synthetic-llama"
    head_dim: int | None = None  # default n_embd // n_head
    sliding_window: int | None = None  # gemma3: window size (every 6th layer is global)
    tied_output: bool = False  # no output.weight: llama.cpp reuses token_embd


def vocabulary() -> tuple[list[str], list[float], list[int]]:
    """Tokens, scores and token types: control tokens, 256 byte tokens, test words."""
    tokens = ["<unk>", "<s>", "</s>"]
    types = [gguf.TokenType.UNKNOWN, gguf.TokenType.CONTROL, gguf.TokenType.CONTROL]
    tokens += [f"<0x{b:02X}>" for b in range(256)]
    types += [gguf.TokenType.BYTE] * 256
    text = files("models").joinpath("test_vocab.txt").read_text(encoding="utf-8")
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
    return tokens, scores, [int(t) for t in types]


def write_llama_gguf(path: str | Path, spec: SynthSpec = SynthSpec()) -> Path:
    """Write a GGUF and return its path. ``spec.arch`` is ``llama`` (GQA when
    n_head_kv < n_head) or ``gemma3`` (Q/K norms, post-norms, sliding-window layers)."""
    if spec.arch not in ("llama", "gemma3"):
        raise ValueError(f"unsupported synthetic architecture {spec.arch}")
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    tokens, scores, types = vocabulary()
    n_vocab = len(tokens)
    hd = spec.head_dim or spec.n_embd // spec.n_head
    gemma = spec.arch == "gemma3"
    wdtype = np.float16 if spec.dtype == "f16" else np.float32

    def mat(rows: int, cols: int) -> np.ndarray:
        return (rng.standard_normal((rows, cols)) * 0.02).astype(wdtype)

    def norm() -> np.ndarray:
        return np.ones(spec.n_embd, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), spec.arch)
    w.add_name(spec.name)
    w.add_block_count(spec.n_layer)
    w.add_context_length(spec.n_ctx_train)
    w.add_embedding_length(spec.n_embd)
    w.add_feed_forward_length(spec.n_ff)
    w.add_head_count(spec.n_head)
    w.add_head_count_kv(spec.n_head_kv)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_dimension_count(hd)
    if spec.head_dim:
        w.add_key_length(hd)
        w.add_value_length(hd)
    if spec.sliding_window:
        w.add_sliding_window(spec.sliding_window)
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

    # numpy shapes are (rows, cols); GGUF stores ne reversed: {cols, rows}.
    w.add_tensor("token_embd.weight", mat(n_vocab, spec.n_embd))
    for i in range(spec.n_layer):
        w.add_tensor(f"blk.{i}.attn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.attn_q.weight", mat(spec.n_head * hd, spec.n_embd))
        w.add_tensor(f"blk.{i}.attn_k.weight", mat(spec.n_head_kv * hd, spec.n_embd))
        w.add_tensor(f"blk.{i}.attn_v.weight", mat(spec.n_head_kv * hd, spec.n_embd))
        w.add_tensor(f"blk.{i}.attn_output.weight", mat(spec.n_embd, spec.n_head * hd))
        if gemma:
            w.add_tensor(f"blk.{i}.attn_q_norm.weight", np.ones(hd, dtype=np.float32))
            w.add_tensor(f"blk.{i}.attn_k_norm.weight", np.ones(hd, dtype=np.float32))
            w.add_tensor(f"blk.{i}.post_attention_norm.weight", norm())
            w.add_tensor(f"blk.{i}.post_ffw_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_norm.weight", norm())
        w.add_tensor(f"blk.{i}.ffn_gate.weight", mat(spec.n_ff, spec.n_embd))
        w.add_tensor(f"blk.{i}.ffn_up.weight", mat(spec.n_ff, spec.n_embd))
        w.add_tensor(f"blk.{i}.ffn_down.weight", mat(spec.n_embd, spec.n_ff))
    w.add_tensor("output_norm.weight", norm())
    if not spec.tied_output:
        w.add_tensor("output.weight", mat(n_vocab, spec.n_embd))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--embd", type=int, default=64)
    ap.add_argument("--heads", type=int, default=4)
    ap.add_argument("--kv-heads", type=int, default=2)
    ap.add_argument("--ff", type=int, default=128)
    ap.add_argument("--dtype", choices=("f32", "f16"), default="f32")
    a = ap.parse_args()
    spec = SynthSpec(n_layer=a.layers, n_embd=a.embd, n_head=a.heads, n_head_kv=a.kv_heads, n_ff=a.ff, dtype=a.dtype)
    print(write_llama_gguf(a.out, spec))


if __name__ == "__main__":
    main()
