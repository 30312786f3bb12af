"""Write a synthetic vision model: a tiny gemma3 text GGUF and its gemma3-type projector (or a Qwen2-VL pair).

No vision model ships on PyPI, so the fast tests build one: random weights in
shapes that libmtmd loads and runs. The projector follows the loader in
``$V/tools/mtmd/clip.cpp`` (``load_tensors``: the ``v.*`` ViT, then for
PROJECTOR_TYPE_GEMMA3 ``mm.input_projection.weight`` and
``mm.soft_emb_norm.weight``) and the graph in ``$V/tools/mtmd/models/siglip.cpp``
(an average pool of ``n_merge`` x ``n_merge`` patches, an RMS norm, then the
projection). ``clip_n_mmproj_embd`` reads the projection's ``ne[0]``, which must
equal the text model's n_embd, or ``mtmd_init_from_file`` refuses the pair.

Two sizes:

- ``small`` (the fast tests): 32 px images, 4 px patches (8 x 8), a pool of 4,
  so 4 image tokens; a 32-wide ViT of one block; about 60 KB.
- ``large``: SigLIP-so400m's width (1152, ff 4304, 16 heads) and its patch grid
  at 384 px (14 px patches, 27 x 27), with ``blocks`` blocks (1 by default) so
  that it stays small on disk; a pool of 3 (27 is not a multiple of Gemma 3's 4,
  and clip.cpp counts ``n_patches / n_merge^2`` tokens: 81).

    python -m scripts.make_vision_model OUTDIR [--size small|large] [--blocks N]
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path

import gguf
import numpy as np

from scripts.synth_gguf import CHATML, SynthSpec, write_llama_gguf
from scripts.synth_spec import finish


@dataclass(frozen=True)
class ProjectorSpec:
    n_embd_text: int = 64  # the projection's output width: the text model's n_embd
    image_size: int = 32
    patch_size: int = 4
    n_embd: int = 32  # the ViT's width
    n_ff: int = 64
    n_head: int = 2
    n_block: int = 1
    n_merge: int = 4  # clip.vision.projector.scale_factor: the pool's side
    dtype: str = "f32"  # the 2-D weights: f32 or f16
    seed: int = 1
    kind: str = "gemma3"  # clip.projector_type: "gemma3", or "qwen2vl_merger" (M-RoPE positions in the text model)


SMALL = ProjectorSpec()
QWEN2VL = ProjectorSpec(kind="qwen2vl_merger")  # 32 px, 4 px patches: 8 x 8 patches merged 2 x 2, so 16 tokens (4 x 4)
LARGE = ProjectorSpec(image_size=384, patch_size=14, n_embd=1152, n_ff=4304, n_head=16, n_block=1, n_merge=3, dtype="f16")


def tokens_per_image(spec: ProjectorSpec) -> int:
    """What clip.cpp's ``clip_n_output_tokens`` gives for GEMMA3: patches / n_merge^2."""
    return (spec.image_size // spec.patch_size) ** 2 // spec.n_merge**2


def write_projector(path: str | Path, spec: ProjectorSpec = SMALL) -> Path:
    """Write an mmproj GGUF of ``spec`` with random weights: gemma3, or qwen2vl_merger.

    A Qwen2-VL projector is written as clip.cpp loads PROJECTOR_TYPE_QWEN2VL and
    ``$V/tools/mtmd/models/qwen2vl.cpp`` runs it: two patch kernels added
    (``v.patch_embd.weight`` and ``.weight.1``, no bias: the graph asserts it),
    no position table (the ViT rotates by M-RoPE), then the merger: 2 x 2 patches
    concatenated (4E) through ``mm.0`` and ``mm.2``, whose bias's width
    clip_n_mmproj_embd reads (the text model's n_embd). The image is resized to a
    multiple of 2 patches, so a 32 px picture at 4 px patches makes 16 tokens on
    a 4 x 4 grid; in the text model they take max(4, 4) positions
    (mtmd_image_tokens_get_n_pos)."""
    path = Path(path)
    qwen = spec.kind == "qwen2vl_merger"
    rng = np.random.default_rng(spec.seed)
    wdtype = np.float16 if spec.dtype == "f16" else np.float32
    E, F, P = spec.n_embd, spec.n_ff, spec.patch_size
    n_patches = (spec.image_size // P) ** 2

    def mat(*shape: int) -> np.ndarray:
        return (rng.standard_normal(shape) * 0.05).astype(wdtype)

    def vec(n: int, value: float = 0.0) -> np.ndarray:
        return np.full(n, value, dtype=np.float32)

    w = gguf.GGUFWriter(str(path), "clip")
    w.add_string("general.name", f"synthetic-{'qwen2vl' if qwen else 'gemma3'}-mmproj-{E}")
    w.add_string("clip.projector_type", spec.kind)
    w.add_bool("clip.has_vision_encoder", True)
    w.add_bool("clip.has_audio_encoder", False)
    w.add_uint32("clip.vision.image_size", spec.image_size)
    w.add_uint32("clip.vision.patch_size", P)
    w.add_uint32("clip.vision.embedding_length", E)
    w.add_uint32("clip.vision.feed_forward_length", F)
    w.add_uint32("clip.vision.projection_dim", spec.n_embd_text)
    w.add_uint32("clip.vision.block_count", spec.n_block)
    w.add_uint32("clip.vision.attention.head_count", spec.n_head)
    w.add_float32("clip.vision.attention.layer_norm_epsilon", 1e-6)
    w.add_array("clip.vision.image_mean", [0.5, 0.5, 0.5])
    w.add_array("clip.vision.image_std", [0.5, 0.5, 0.5])
    if not qwen:
        w.add_uint32("clip.vision.projector.scale_factor", spec.n_merge)
    w.add_bool("clip.use_gelu", True)
    # numpy shapes are ggml's ne reversed: a conv kernel of ne [p, p, 3, E], positions of ne [E, n_patches]
    w.add_tensor("v.patch_embd.weight", mat(E, 3, P, P))
    if qwen:
        w.add_tensor("v.patch_embd.weight.1", mat(E, 3, P, P))
    else:
        w.add_tensor("v.patch_embd.bias", vec(E))
        # F32 whatever ``dtype``: the ViT adds it to the patches with ggml_add, which has no f32 + f16 on the CPU (a GGML abort)
        w.add_tensor("v.position_embd.weight", mat(n_patches, E).astype(np.float32))
    for i in range(spec.n_block):
        b = f"v.blk.{i}"
        for name in ("ln1", "ln2"):
            w.add_tensor(f"{b}.{name}.weight", vec(E, 1.0))
            w.add_tensor(f"{b}.{name}.bias", vec(E))
        for name in ("attn_q", "attn_k", "attn_v", "attn_out"):
            w.add_tensor(f"{b}.{name}.weight", mat(E, E))
            w.add_tensor(f"{b}.{name}.bias", vec(E))
        w.add_tensor(f"{b}.ffn_up.weight", mat(F, E))
        w.add_tensor(f"{b}.ffn_up.bias", vec(F))
        w.add_tensor(f"{b}.ffn_down.weight", mat(E, F))
        w.add_tensor(f"{b}.ffn_down.bias", vec(E))
    if qwen:
        w.add_tensor("mm.0.weight", mat(4 * E, 4 * E))
        w.add_tensor("mm.0.bias", vec(4 * E))
        w.add_tensor("mm.2.weight", mat(spec.n_embd_text, 4 * E))
        w.add_tensor("mm.2.bias", vec(spec.n_embd_text))
    else:
        w.add_tensor("v.post_ln.weight", vec(E, 1.0))
        w.add_tensor("v.post_ln.bias", vec(E))
        w.add_tensor("mm.soft_emb_norm.weight", vec(E, 1.0))
        # ne [n_embd_text, E]: siglip.cpp transposes it before the mul_mat, clip_n_mmproj_embd reads ne[0]
        w.add_tensor("mm.input_projection.weight", mat(E, spec.n_embd_text))
    return finish(w, path)


def write_vision_model(out_dir: str | Path, *, size: str = "small", blocks: int = 1, n_embd: int = 64) -> tuple[Path, Path]:
    """Write ``model.gguf`` and ``mmproj-model.gguf`` (the Hub's naming) into
    ``out_dir``; returns (model, projector)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if size == "qwen2vl":  # a Qwen2-VL pair: the text model's M-RoPE decides libmtmd's positions
        model = write_llama_gguf(out / "model.gguf", SynthSpec(arch="qwen2vl", n_embd=n_embd, name="synthetic-qwen2vl-text",
                                                               controls=("<|im_start|>", "<|im_end|>"), chat_template=CHATML,
                                                               weight_scale=0.2))  # sharp attention: a wrong position shows
        return model, write_projector(out / "mmproj-model.gguf", ProjectorSpec(**{**QWEN2VL.__dict__, "n_embd_text": n_embd}))
    # a gemma3 text model for the gemma3 projector: a projector of another family is refused (vision.projector.FAMILIES)
    model = write_llama_gguf(out / "model.gguf", SynthSpec(arch="gemma3", n_embd=n_embd, name="synthetic-vision-text"))
    base = LARGE if size == "large" else SMALL
    spec = ProjectorSpec(**{**base.__dict__, "n_embd_text": n_embd, "n_block": blocks if size == "large" else base.n_block})
    proj = write_projector(out / "mmproj-model.gguf", spec)
    return model, proj


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir")
    ap.add_argument("--size", choices=("small", "large", "qwen2vl"), default="small")
    ap.add_argument("--blocks", type=int, default=1, help="ViT blocks of the large projector")
    ap.add_argument("--embd", type=int, default=64, help="the text model's n_embd (and the projection's width)")
    a = ap.parse_args()
    for p in write_vision_model(a.out_dir, size=a.size, blocks=a.blocks, n_embd=a.embd):
        print(p)


if __name__ == "__main__":
    main()
