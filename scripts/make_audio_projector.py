"""Write a synthetic audio projector: a whisper-style encoder that libmtmd loads beside a real text model.

No audio model ships on PyPI, so the tests and ``scripts/bench_audio.py`` build
one: random weights in the shapes that ``$V/tools/mtmd/clip.cpp`` loads for an
audio projector and ``$V/tools/mtmd/models/whisper-enc.cpp`` runs. The header
says ``clip.has_audio_encoder`` and the ``clip.audio.*`` figures (``load_hparams``
with the "audio" prefix, ``clip.audio.num_mel_bins``); the tensors are the
``a.*`` encoder (two 1-D convolutions, then ``n_block`` transformer blocks
whose K has no bias, as whisper-enc.cpp asserts) and the projection:

- ``ultravox`` (the default): frames stacked 12 by 12
  (``clip.audio.projector.stack_factor``, required), an RMS norm, a SwiGLU
  ``mm.a.mlp.1``, a norm, ``mm.a.mlp.2``, whose ``ne[1]`` is the width handed
  to the text model (``clip_n_mmproj_embd``); 30 s of audio (3000 mel frames,
  halved by the second convolution) make 1500 / 12 = 125 tokens. The stack
  must divide 1500: clip.cpp counts 3000 / stack / 2 tokens but the graph
  stacks 1500 rows rounded up, and aborts the process when the two differ
  (Ultravox's own 8 gives 187 against 188). libmtmd puts no text around the
  tokens, so any text model takes them.
- ``qwen2a``: a 2-wide average pool then ``mm.a.fc`` (750 tokens each 30 s),
  between ``<|audio_bos|>`` and ``<|audio_eos|>`` as plain text.

``n_embd_text`` must be the text model's n_embd (SmolLM2-135M's is 576), or
``mtmd_init_from_file`` refuses the pair. The weights are random: the model
hears noise, but what it hears moves its logits, and the encoder's time per
second of audio is a real whisper graph's at this width.

    python -m scripts.make_audio_projector OUT.gguf [--kind ultravox|qwen2a] [--embd 576] [--width 64] [--blocks 1]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from scripts.synth_spec import finish

N_POS = 1500  # whisper's positions: 3000 mel frames of one 30 s chunk, halved by conv1d.2


@dataclass(frozen=True)
class AudioSpec:
    n_embd_text: int = 576  # SmolLM2-135M's n_embd
    kind: str = "ultravox"  # clip.projector_type: "ultravox" or "qwen2a"
    n_mel: int = 128  # whisper-large-v3's mel bins (Ultravox's encoder)
    n_embd: int = 64  # the encoder's width
    n_ff: int = 128
    n_head: int = 2
    n_block: int = 1
    stack: int = 12  # ultravox's stack factor: must divide 1500 (see the module's doc)
    n_hidden: int = 128  # ultravox's SwiGLU output width (mm.a.mlp.1 gives twice this)
    seed: int = 1


def tokens_per_chunk(spec: AudioSpec) -> int:
    """What ``clip_n_output_tokens`` gives for one 30 s chunk (3000 frames)."""
    if spec.kind == "ultravox":
        return -(-3000 // spec.stack) // 2  # CLIP_ALIGN to the stack, then halved by the convolution
    return 3000 // 2 // 2  # halved by the convolution, then by the average pool


def write_audio_projector(path: str | Path, spec: AudioSpec = AudioSpec()) -> Path:
    """Write an audio-only mmproj GGUF of ``spec`` with random weights."""
    if spec.kind not in ("ultravox", "qwen2a"):
        raise ValueError(f"kind must be ultravox or qwen2a, not {spec.kind}")
    if spec.kind == "ultravox" and N_POS % spec.stack:
        raise ValueError(f"the stack factor must divide {N_POS} (clip.cpp aborts otherwise), not {spec.stack}")
    path = Path(path)
    rng = np.random.default_rng(spec.seed)
    E, F, M = spec.n_embd, spec.n_ff, spec.n_mel

    def mat(*shape: int, dtype: type = np.float32) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(dtype)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", f"synthetic-{spec.kind}-audio-mmproj-{E}")
    w.add_string("clip.projector_type", spec.kind)
    w.add_bool("clip.has_vision_encoder", False)
    w.add_bool("clip.has_audio_encoder", True)
    w.add_uint32("clip.audio.num_mel_bins", M)
    w.add_uint32("clip.audio.embedding_length", E)
    w.add_uint32("clip.audio.feed_forward_length", F)
    w.add_uint32("clip.audio.projection_dim", spec.n_embd_text)
    w.add_uint32("clip.audio.block_count", spec.n_block)
    w.add_uint32("clip.audio.attention.head_count", spec.n_head)
    w.add_float32("clip.audio.attention.layer_norm_epsilon", 1e-5)
    if spec.kind == "ultravox":
        w.add_uint32("clip.audio.projector.stack_factor", spec.stack)
    # numpy shapes are ggml's ne reversed. The kernels are F16, as llama.cpp's converter writes them (im2col's
    # type); the biases are [1, E] so that ggml_add broadcasts them over the frames (the converter's unsqueeze)
    w.add_tensor("a.conv1d.1.weight", mat(E, M, 3, dtype=np.float16))
    w.add_tensor("a.conv1d.1.bias", vec(E).reshape(E, 1))
    w.add_tensor("a.conv1d.2.weight", mat(E, E, 3, dtype=np.float16))
    w.add_tensor("a.conv1d.2.bias", vec(E).reshape(E, 1))
    w.add_tensor("a.position_embd.weight", mat(N_POS, E))
    for i in range(spec.n_block):
        b = f"a.blk.{i}"
        for name in ("ln1", "ln2"):
            w.add_tensor(f"{b}.{name}.weight", vec(E, 1.0))
            w.add_tensor(f"{b}.{name}.bias", vec(E))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{b}.{name}.weight", mat(E, E))
            if name != "attn_k":  # whisper's K has no bias (whisper-enc.cpp asserts it)
                w.add_tensor(f"{b}.{name}.bias", vec(E))
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_up.bias", vec(F))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        w.add_tensor(f"{b}.ffn_down.bias", vec(E))
    w.add_tensor("a.post_ln.weight", vec(E, 1.0))
    w.add_tensor("a.post_ln.bias", vec(E))
    if spec.kind == "ultravox":
        S, H = E * spec.stack, spec.n_hidden
        w.add_tensor("mm.a.norm_pre.weight", vec(S, 1.0))
        w.add_tensor("mm.a.mlp.1.weight", mat(2 * H, S))
        w.add_tensor("mm.a.norm_mid.weight", vec(H, 1.0))
        w.add_tensor("mm.a.mlp.2.weight", mat(spec.n_embd_text, H))
    else:
        w.add_tensor("mm.a.fc.weight", mat(spec.n_embd_text, E))
        w.add_tensor("mm.a.fc.bias", vec(spec.n_embd_text))
    return finish(w, path)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("out")
    ap.add_argument("--kind", choices=("ultravox", "qwen2a"), default="ultravox")
    ap.add_argument("--embd", type=int, default=576, help="the text model's n_embd (SmolLM2-135M: 576)")
    ap.add_argument("--width", type=int, default=64, help="the encoder's width")
    ap.add_argument("--blocks", type=int, default=1, help="the encoder's transformer blocks")
    a = ap.parse_args()
    print(write_audio_projector(a.out, AudioSpec(n_embd_text=a.embd, kind=a.kind, n_embd=a.width, n_ff=2 * a.width,
                                                 n_block=a.blocks)))


if __name__ == "__main__":
    main()
